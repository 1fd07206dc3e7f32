"""prompts/: what the model is shown. Public spec and measured feedback, never a hidden shape."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from pathlib import Path

import pytest

from kernforge.loop.config import load_config
from kernforge.loop.inductor_start import listing, output_code_async
from kernforge.loop.llm import LLMClient
from kernforge.prompts import render as r
from kernforge.prompts.feedback import WITHHELD, Redactor, clip
from kernforge.tasks.loader import builtin_names, load_task
from kernforge.tasks.spec import Shape, Task
from kernforge.verifier import defences
from kernforge.verifier.checks import Check
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from fake_llm import GOOD_KERNEL, fake_llm, fenced, reply  # noqa: E402

__all__ = ["fake_llm"]

H200 = {
    "gpu": "NVIDIA H200", "arch": "sm_90", "sms": 132, "memory_gib": 139.8, "l2_bytes": 60 * 2**20,
    "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "bandwidth_gbps": 4242, "tflops": 691,
}
HIDDEN_TIME = 987.654  # a hidden shape's time: must never reach a prompt


def hidden_dicts(task: Task) -> list[dict[str, int]]:
    return [s.as_dict() for s in (*task.hidden_shapes, *task.cpu_hidden_shapes)]


def label(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def leaky_verdict(task: Task, device_kind: str = "cuda") -> Rejected:
    """A rejection whose reason and evidence name hidden shapes every way a verifier might."""
    hidden = hidden_dicts(task)
    worst = hidden[-1]
    dims = list(worst.values())
    numel = math.prod(dims)
    reason = (f"output 0 is wrong (hidden shape {label(worst)}, normal inputs): 3 of {numel} elements out of "
              f"tolerance, worst at index {[max(v - 1, 0) for v in dims]}: got 1, expected 2")
    evidence = {
        "check": "values", "shape": worst, "hidden": True, "numel": numel, "input_shapes": [dims],
        "tried": hidden,
        "stderr": "Traceback (most recent call last):\n  File \"candidate.py\", line 12, in forward\n"
                  + "\n".join(f"RuntimeError: shape '{list(s.values())}' is invalid ({s})" for s in hidden),
    }
    dtype = task.dtype(device_kind)
    shapes = [ShapeResult(shape=s.as_dict(), hidden=False, dtype=dtype, timing="graph", time_us=12.5,
                          speedup_eager=3.0, speedup_compile=1.1, pct_bandwidth=55.0)
              for s in task.shapes(device_kind, hidden=False)]
    shapes += [ShapeResult(shape=s, hidden=True, dtype=dtype, timing="graph", time_us=HIDDEN_TIME) for s in hidden[:-1]]
    return Rejected(Status.INCORRECT, reason, threat=14, evidence=evidence, shapes=tuple(shapes))


def assert_no_hidden_shape(task: Task, text: str) -> None:
    for shape in hidden_dicts(task):
        for form in (label(shape), str(shape), json.dumps(shape)):
            assert not re.search(re.escape(form) + r"(?![\d.])", text), f"hidden shape {form} in the prompt"
    assert str(HIDDEN_TIME) not in text


@pytest.mark.parametrize("device_kind", ["cuda", "cpu"])
@pytest.mark.parametrize("name", builtin_names())
def test_no_hidden_shape_in_any_builtin_prompt(name, device_kind):
    task = load_task(name)
    code = task.seed_source or GOOD_KERNEL
    prompt = r.render(
        task, H200, device_kind=device_kind,
        parent=r.Parent(code, leaky_verdict(task, device_kind)),
        inspirations=[r.Inspiration(code, verdict=leaky_verdict(task, device_kind))],
        lessons=[f"failed at {label(s)}" for s in hidden_dicts(task)],
    )
    text = prompt.system + prompt.user
    assert_no_hidden_shape(task, text)
    for shape in task.shapes(device_kind, hidden=False):
        assert shape.label in text
    assert task.reference_source.strip()[:200] in text
    assert "Hidden shapes (sizes not shown): at least one failed." in text and "1 failed" not in text
    # The verdict's own text: not a word of it, since it failed at a hidden shape (the candidate
    # chooses how its errors spell a size: hex, words, a line number it raises from)
    why = prompt.user.split("## Why it was rejected", 1)[1].split("Measured on public shapes", 1)[0]
    redactor = Redactor(task)
    for number in redactor.masked_numbers:
        assert not re.search(rf"(?<![\w.#])(?<!line ){number}(?![\w.])", why), f"hidden size {number} in the feedback"
    assert WITHHELD in why and "line 12" not in why and "Traceback" not in why


@pytest.mark.parametrize("name", builtin_names())
def test_no_hidden_shape_reaches_the_provider(name, fake_llm, tmp_path):
    task = load_task(name)
    prompt = r.render(task, H200, parent=r.Parent(task.seed_source or GOOD_KERNEL, leaky_verdict(task)))
    fake_llm.script = [reply(fenced(GOOD_KERNEL))]
    config = load_config(provider="custom", base_url=fake_llm.base_url, model="fake-model",
                         env={"KERNFORGE_API_KEY": "k", "XDG_CONFIG_HOME": str(tmp_path)})

    async def go():
        async with LLMClient(config) as client:
            return await client.propose(prompt.messages())

    assert asyncio.run(go()).code == GOOD_KERNEL
    received = fake_llm.everything_received()
    assert task.name in received
    assert_no_hidden_shape(task, received)


def test_public_spec_hardware_and_roofline():
    task = load_task("rms_norm")
    prompt = r.render(task, H200)
    user = prompt.user
    assert "NVIDIA H200 (sm_90, 132 SMs" in user and "4242 GB/s" in user and "691 TFLOP/s" in user
    assert "measured on this GPU" in user and "torch 2.11.0+cu130, triton 3.6.0" in user
    assert "dtype bfloat16" in user and "output 0 (bfloat16): rtol 0.008, atol 0.004" in user
    assert "forbidden (only your own kernels compute)" in user and "read-only" in user
    # Roofline floor of the largest public shape: (2*T*H + H) bf16 bytes over 4242 GB/s.
    floor_us = (2 * 16384 * 8192 + 8192) * 2 / 4242e9 * 1e6
    assert f"| T=16384 H=8192 | 536.887 | 0.537 | {floor_us:.3g} |" in user
    assert r.instructions(None) in user and prompt.messages()[0]["role"] == "system"


def test_nominal_ceilings_are_labelled():
    user = r.render(load_task("rms_norm"), {"gpu": "Some GPU"}).user
    assert "nominal H200 figures, not measured here" in user and "Some GPU (unknown" in user


def test_cpu_prompt_says_interpreter_and_has_no_floor():
    task = load_task("rms_norm")
    user = r.render(task, H200, device_kind="cpu").user
    assert "Triton interpreter" in user and "H200" not in user and "dtype float32" in user
    assert "| T=1 H=256 |" in user and "T=4096 H=4096" not in user


def test_rules_in_the_system_prompt():
    system = r.render(load_task("rms_norm"), H200).system
    for phrase in ("class ModelNew(torch.nn.Module)", "@triton.jit", "load_inline", "another CUDA stream",
                   "Caching results across calls", "Fitting the public shapes", "plain `torch.Tensor`",
                   "physical floor", "exactly one ```python block"):
        assert phrase in system


def test_accepted_parent_shows_public_measurements_only():
    task = load_task("rms_norm")
    shapes = (
        ShapeResult(shape={"T": 4096, "H": 4096}, hidden=False, dtype="bfloat16", timing="graph", time_us=31.64,
                    spread_pct=0.4, floor_us=15.82, pct_bandwidth=50.0, speedup_eager=9.5, speedup_compile=1.25),
        ShapeResult(shape={"T": 77, "H": 5120}, hidden=True, dtype="bfloat16", timing="graph", time_us=HIDDEN_TIME),
    )
    verdict = Accepted(shapes=shapes, flags=("eager timing fallback",))
    user = r.render(task, H200, parent=r.Parent(GOOD_KERNEL, verdict)).user
    assert "# Parent kernel: accepted" in user and "Row-wise RMSNorm in Triton" in user
    assert "| T=4096 H=4096 | 31.6 | 0.4% | 15.8 | 50% | 50% | 9.5x | 1.25x | graph |" in user
    assert "all 1 passed" in user and "Flags: eager timing fallback" in user
    assert_no_hidden_shape(task, user)
    assert r.fill("instructions_improve") in user


def test_cheat_parent_names_the_class_and_asks_for_honest_work():
    task = load_task("rms_norm")
    verdict = Rejected(Status.CHEAT, "forward ran torch compute ops ['aten::mean'] (public shape T=1 H=4096, normal inputs)",
                       threat=16, evidence={"check": "runtime trace", "torch_ops": ["aten::mean", "aten::rsqrt"]})
    user = r.render(task, H200, parent=r.Parent(GOOD_KERNEL, verdict)).user
    assert "rejected (cheat)" in user and "Caught: THREATS #16 (reference call)." in user
    assert f"Check: runtime trace. What passes it: {defences.remedy(Check.TORCH_OPS)}" in user  # the defence's remedy
    assert '- torch_ops: ["aten::mean", "aten::rsqrt"]' in user
    assert "public shape T=1 H=4096" in user  # public shapes are not masked
    assert "rejected as a cheat (THREATS #16 reference call)" in user


def test_verdicts_are_rendered_from_their_typed_fields_never_a_dict(monkeypatch):
    task = load_task("rms_norm")
    shapes = (ShapeResult(shape={"T": 1, "H": 256}, hidden=False, dtype="float32", timing="interpreter", time_us=812.0,
                          max_abs_err=1e-7),)
    accepted = Accepted(shapes=shapes)
    rejected = Rejected(Status.INCORRECT, "output 0 is wrong (public shape T=1 H=256, normal inputs): 3 of 256",
                        check=Check.VALUES, evidence={"shape": {"T": 1, "H": 256}, "hidden": False, "bad": 3})

    def no_dicts(self):
        raise AssertionError("a verdict was turned into a dict on its way into a prompt")

    monkeypatch.setattr(Accepted, "to_dict", no_dicts)
    monkeypatch.setattr(Rejected, "to_dict", no_dicts)
    parent = r.Parent(GOOD_KERNEL, rejected)
    user = r.render(task, H200, device_kind="cpu", parent=parent, inspirations=[r.Inspiration(GOOD_KERNEL, verdict=accepted)]).user
    assert parent.verdict is rejected
    assert "rejected (incorrect)" in user and f"Check: values. What passes it: {defences.remedy(Check.VALUES)}" in user
    assert "- bad: 3" in user and "not reached" in user
    improve = r.render(task, H200, device_kind="cpu", parent=r.Parent(GOOD_KERNEL, accepted)).user
    assert "| T=1 H=256 | 812 |" in improve and "| interpreter |" in improve  # the interpreter's time, labelled


def test_compile_error_keeps_the_end_of_a_long_traceback():
    task = load_task("rms_norm")
    log = "Traceback (most recent call last):\n" + "  frame\n" * 3000 + "triton.CompilationError: at 12:4: bad"
    verdict = Rejected(Status.COMPILE_ERROR, "the module did not compile", evidence={"traceback": log})
    user = r.render(task, H200, parent=r.Parent(GOOD_KERNEL, verdict)).user
    assert "triton.CompilationError: at 12:4: bad" in user and "characters cut ..." in user
    assert len(user) < 30_000 and r.fill("instructions_repair") in user


def test_unmeasured_parent_and_no_parent():
    task = load_task("rms_norm")
    assert "# Starting point (not measured yet)" in r.render(task, H200, parent=r.Parent(GOOD_KERNEL)).user
    assert r.fill("instructions_start") in r.render(task, H200, parent=r.Parent(GOOD_KERNEL)).user
    assert "# Parent" not in r.render(task, H200).user and "# Starting point" not in r.render(task, H200).user


def test_inspirations_and_lessons():
    task = load_task("rms_norm")
    accepted = Accepted(shapes=(ShapeResult(shape={"T": 1, "H": 4096}, hidden=False, dtype="bfloat16", timing="graph",
                                            time_us=2.0, speedup_compile=2.5, speedup_eager=9.0),))
    items = [r.Inspiration(GOOD_KERNEL, verdict=accepted), r.Inspiration("x = 1\n", "vectorised loads", None)]
    user = r.render(task, H200, inspirations=items, lessons=["  use fp32   accumulation\n", ""]).user
    assert "## Kernel 1: Row-wise RMSNorm in Triton" in user and "vs torch.compile 2.5x" in user
    assert "## Kernel 2: vectorised loads" in user and "(not measured)" in user
    assert "# Lessons from earlier attempts\n- use fp32 accumulation" in user


def test_prompt_size_is_bounded():
    task = load_task("rms_norm")
    huge = "x = 1  # filler\n" * 20_000
    verdict = Rejected(Status.RUNTIME_ERROR, "boom " * 5_000, evidence={"stderr": "line\n" * 50_000, "blob": "y" * 50_000})
    limits = r.Limits(total_chars=30_000)
    prompt = r.render(task, H200, parent=r.Parent(huge, verdict), limits=limits,
                      inspirations=[r.Inspiration(huge, f"idea {i}") for i in range(10)],
                      lessons=[f"lesson {i} " + "z" * 1_000 for i in range(100)])
    assert prompt.chars <= limits.total_chars
    assert "characters cut" in prompt.user and prompt.dropped
    assert "inspiration 4" in prompt.dropped  # past max_inspirations


def test_every_placeholder_is_filled():
    names = {m for path in r.TEMPLATES.glob("*.txt") for m in re.findall(r"\$(\w+)", path.read_text())}
    assert {"hardware", "task", "parent", "reference", "shapes", "table", "code"} <= names
    task = load_task("rms_norm")
    prompt = r.render(task, H200, parent=r.Parent(GOOD_KERNEL, leaky_verdict(task)),
                      inspirations=[r.Inspiration(GOOD_KERNEL)], lessons=["a lesson"])
    for name in names:
        assert f"${name}" not in prompt.system + prompt.user
    with pytest.raises(KeyError):
        r.fill("task", name="only one placeholder given")


def test_last_line_of_defence_refuses_a_leak():
    task = load_task("rms_norm")
    with pytest.raises(r.PromptLeak):
        r._refuse_leaks(task, "it failed at T=77 H=5120")
    r._refuse_leaks(task, "```python\nT = 77\nH = 5120\n```\nand T=77, H=4096")  # code and partial labels pass


# ---- torch.compile's code ------------------------------------------------------------------------
TORCH_COMPILE = "# What torch.compile does for this reference: beat it"


def torch_compile_part(user: str) -> str:
    """The section: from its heading to the end of its code block (the code has lines that start "# ")."""
    assert TORCH_COMPILE in user
    head, code = user.split(TORCH_COMPILE, 1)[1].split("```python\n", 1)
    return head + "```python\n" + code.split("\n```", 1)[0] + "\n```"


@pytest.fixture(scope="module")
def rms_norm_inductor():
    """rms_norm's reference compiled by Inductor on the CPU, as the LLM proposer captures it."""
    task = load_task("rms_norm")
    code = asyncio.run(output_code_async(task, "cpu"))
    assert isinstance(code, str), code
    return task, code, listing(code)


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_torch_compile_section_shows_inductors_own_code_to_beat(rms_norm_inductor, device_kind):
    task, code, shown = rms_norm_inductor
    user = r.render(task, H200, device_kind=device_kind, torch_compile=r.TorchCompile(shown.text, shown.total_lines)).user
    part = torch_compile_part(user)
    assert "torch.compile's own code for the reference" in part and "the goal is to be faster than this code" in part
    assert f"Trimmed from Inductor's {shown.total_lines}-line output file to its kernels and `call`" in part
    assert "```python\n" + shown.text.strip() + "\n```" in part  # all of it: short enough
    for name in shown.kernels:
        assert f"def {name}(" in part
    # Inductor's decorators and benchmark harness hold its example shape's sizes: never shown
    for gone in ("triton_heuristics", "size_hints", "def get_args", "rand_strided"):
        assert gone in code and gone not in user
    assert "torch.compile us" not in part  # no measured time given: none shown
    assert user.index(TORCH_COMPILE) < user.index("# Your job")
    assert_no_hidden_shape(task, user)


def test_torch_compile_times_are_shown_for_public_shapes_only():
    task = load_task("rms_norm")
    public = [s.label for s in task.shapes("cuda", hidden=False)]
    hidden = label(hidden_dicts(task)[0])
    times = ((public[0], 12.25), (hidden, HIDDEN_TIME), (public[1], 0.0))
    user = r.render(task, H200, torch_compile=r.TorchCompile("@triton.jit\ndef k(x_ptr):\n    pass\n", times_us=times)).user
    part = torch_compile_part(user)
    assert f"| shape | torch.compile us |\n|---|---|\n| {public[0]} | 12.25 |\n" in part
    assert f"| {public[1]} |" not in part  # no time known for it
    assert "Trimmed" not in part  # given whole: nothing said about trimming
    assert_no_hidden_shape(task, user)


def test_long_torch_compile_code_is_cut_and_says_so():
    task = load_task("rms_norm")
    kernel = "@triton.jit\ndef k(x_ptr):\n" + "    x = tl.load(x_ptr)\n" * 2_000
    limits = r.Limits(torch_compile_chars=3_000)
    part = torch_compile_part(r.render(task, H200, limits=limits, torch_compile=r.TorchCompile(kernel, 9_000)).user)
    assert "The listing is cut after 3000 characters." in part and "characters cut ...]" in part
    assert "Trimmed from Inductor's 9000-line output file" in part
    assert kernel[:3_000] in part and len(part) < 3_000 + 1_500


@pytest.mark.parametrize("compiled", [None, r.TorchCompile("  \n", times_us=(("T=1 H=4096", 3.0),))])
def test_no_torch_compile_code_no_section(compiled):
    user = r.render(load_task("rms_norm"), H200, torch_compile=compiled).user
    assert "torch.compile's own code" not in user and "torch.compile us" not in user


def test_torch_compile_code_goes_after_lessons_when_the_prompt_is_too_long():
    task = load_task("rms_norm")
    bare = r.render(task, H200, parent=r.Parent(GOOD_KERNEL))
    compiled = r.TorchCompile("@triton.jit\ndef k(x_ptr):\n" + "    x = tl.load(x_ptr)\n" * 300)
    limits = r.Limits(total_chars=bare.chars + 200)
    prompt = r.render(task, H200, parent=r.Parent(GOOD_KERNEL), lessons=["use fp32 accumulation"], limits=limits,
                      torch_compile=compiled)
    assert prompt.dropped == ("lessons", "torch.compile's code") and prompt.chars <= limits.total_chars
    assert TORCH_COMPILE not in prompt.user and GOOD_KERNEL.strip() in prompt.user  # the parent stays whole
    roomy = r.render(task, H200, parent=r.Parent(GOOD_KERNEL), torch_compile=compiled)
    assert TORCH_COMPILE in roomy.user and roomy.dropped == ()


# ---- redaction and clipping ----------------------------------------------------------------------

TOY = Task(
    name="toy", ref="toy", reference_path=Path("toy.py"), reference_source="",
    public_shapes=(Shape.of({"T": 1, "H": 4096}), Shape.of({"T": 64, "H": 8192})),
    hidden_shapes=(Shape.of({"T": 3, "H": 2048}), Shape.of({"T": 77, "H": 5120})),
)


@pytest.mark.parametrize("text, expected", [
    ("hidden shape T=77 H=5120, normal inputs", "hidden shape <hidden>, normal inputs"),
    ("shape {'T': 3, 'H': 2048}", "shape <hidden>"),
    ('{"T": 77, "H": 5120}', "<hidden>"),
    ("T=77", "T=<hidden>"),
    ("H: 2048 and T=64", "H: <hidden> and T=64"),
    ("input shapes [[77, 5120], [5120]]", "input shapes [[<hidden>], [<hidden>]]"),
    ("worst at index [76, 5119]", "worst at index [<hidden>]"),
    ("torch.Size([3, 2048])", "torch.Size([<hidden>])"),
    ("invalid for input of size 394240", "invalid for input of size <hidden>"),
    ("index 5120 is out of bounds for dimension 1 with size 5120", "index <hidden> is out of bounds for dimension 1 with size <hidden>"),
    ("File \"candidate.py\", line 77, in forward", "File \"candidate.py\", line 77, in forward"),
    ("candidate.py:77: error", "candidate.py:77: error"),
    ("public T=64 H=8192 and [64, 8192]", "public T=64 H=8192 and [64, 8192]"),
    ("3 of 262144 elements", "3 of 262144 elements"),
    ("max abs err 0.0771", "max abs err 0.0771"),
])
def test_redactor(text, expected):
    assert Redactor(TOY).scrub(text) == expected


@pytest.mark.parametrize("keep, head, tail", [("head", True, False), ("tail", False, True), ("both", True, True)])
def test_clip(keep, head, tail):
    text = "HEAD" + "-" * 1000 + "TAIL"
    out = clip(text, 100, keep=keep)
    assert ("HEAD" in out) is head and ("TAIL" in out) is tail and "[... 908 characters cut ...]" in out
    assert clip("short", 100) == "short"


def test_a_rejection_after_a_hidden_shape_quotes_nothing_the_candidate_said():
    """The judge marks a rejection made after the candidate was called at a hidden shape (a process
    left running at the end, a crash, an error); the prompt quotes none of its text, whatever the
    spelling, and says why."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    task = load_task("rms_norm")
    leaked = "processes it started were still running after its calls: 77 T=0x3 H=0x60 XCVI"
    verdict = Rejected(Status.SANDBOX_VIOLATION, leaked, threat=21, check="processes",
                       evidence={"processes": ["77 T=0x3 H=0x60 XCVI"], SAW_HIDDEN: True})
    prompt = r.render(task, H200, parent=r.Parent(GOOD_KERNEL, verdict),
                      inspirations=[r.Inspiration(GOOD_KERNEL, verdict=verdict)])
    assert "0x60" not in prompt.user and "XCVI" not in prompt.user and WITHHELD in prompt.user
    # nor which way it failed: a status, a check or a threat told apart would be a bit of the shape
    assert "sandbox_violation" not in prompt.user and "processes" not in prompt.user and "#21" not in prompt.user
    assert "Parent kernel: rejected (failed at a hidden shape)" in prompt.user


def test_every_way_of_failing_after_a_hidden_shape_reads_the_same_in_a_prompt():
    """Once it has seen a hidden shape, a candidate chooses how it fails (wrong values at the
    second hidden shape, a time-out, a crash, a defence's check): a prompt that told these apart
    would carry bits of a hidden size to the next candidate, one attempt at a time."""
    from kernforge.verifier.verdict import SAW_HIDDEN

    task = load_task("rms_norm")
    ways = [
        Rejected(Status.INCORRECT, "the values differ", check=Check.VALUES,
                 evidence={"hidden": True, "hidden_passed": 1, "hidden_failed": 1, "dist": "normal", SAW_HIDDEN: True}),
        Rejected(Status.TIMEOUT, "a call ran out of time", check=Check.RUNTIME, evidence={SAW_HIDDEN: True}),
        Rejected(Status.CHEAT, "mutated its input", threat=4, check=Check.INPUT_MUTATION,
                 evidence={"hidden": True, "hidden_passed": 0, "hidden_failed": 3, SAW_HIDDEN: True}),
    ]
    prompts = {r.render(task, H200, parent=r.Parent(GOOD_KERNEL, v), inspirations=[r.Inspiration(GOOD_KERNEL, verdict=v)]).user
               for v in ways}
    assert len(prompts) == 1
    (user,) = prompts
    assert "Parent kernel: rejected (failed at a hidden shape)" in user and WITHHELD in user
    assert not any(said in user for said in ("mutated its input", "a call ran out of time", "input mutation"))
