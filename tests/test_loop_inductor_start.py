"""The Inductor start (loop/inductor_start.py): torch.compile's own Triton kernels as a candidate,
judged by the real judge on the CPU (Triton interpreter) on every public and hidden CPU shape."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import functools
from pathlib import Path

import pytest

from kernforge.loop.inductor_code import example_shape
from kernforge.loop import inductor_start
from kernforge.loop.inductor_start import NoStart, Start, derive, listing, output_code_async
from kernforge.tasks.loader import load_task
from kernforge.verifier.verdict import describe

COPIES = Path(__file__).resolve().parent / "kernelbench"
TASKS = Path(__file__).resolve().parent / "tasks"
#: a problem whose forward branches on its length: Dynamo fixes it
FIXED = TASKS / "kb_fixed_length.py"


def derived(stem: str, *, check: bool = True) -> Start | NoStart:
    """The start of a KernelBench copy as ``derive`` gives it; with ``check`` False, before
    ``inductor_start.checked`` looks at its fixed sizes."""
    start = _captured(stem)
    return inductor_start.checked(load_task(_path(stem)), "cpu", start) if check else start


def _path(stem: str) -> Path:
    """The problem file of a stem this module captures: a KernelBench copy, or ``FIXED``."""
    return FIXED if stem == FIXED.stem else COPIES / f"{stem}.py"


def _captured(stem: str) -> Start | NoStart:
    """Derived once for this module (each derivation is a child process that runs two Inductor
    captures: tens of seconds on the CPU). A Start is frozen."""
    return _captures()[("start", stem)]


def _output_code(stem: str) -> str | NoStart:
    """``output_code_async`` of a KernelBench copy, captured once for this module."""
    return _captures()[("code", stem)]


def _raw_reply(stem: str) -> dict | NoStart:
    """The capture child's own reply (``_child_reply``) behind ``_captured(stem)``."""
    return copy.deepcopy(_captures()[("raw", stem)])


#: the KernelBench copies whose start (``captured_async``) or output code (``output_code_async``)
#: this module's tests read
_STARTS = ("26_GELU_", "23_Softmax", "36_RMSNorm_", "2_Standard_matrix_multiplication_", "76_Gemm_Add_ReLU",
           "40_LayerNorm", "3_Batched_matrix_multiplication", "34_InstanceNorm", "41_Max_Pooling_1D",
           "48_Mean_reduction_over_a_dimension", "47_Sum_reduction_over_a_dimension", FIXED.stem)
_OUTPUT_CODES = ("23_Softmax", "2_Standard_matrix_multiplication_", "12_Gemm_Multiply_LeakyReLU")


@functools.lru_cache(maxsize=None)
def _captures() -> dict[tuple[str, str], object]:
    """Every capture above, made on the first use, two at a time: each is a child process running
    Inductor on one core (TORCHINDUCTOR_COMPILE_THREADS=1), so one after another they left the
    second core of the 2-core CI machine idle. Each is the real call, as a test would make it; the
    children's replies to the starts' calls are kept too (``_raw_reply``)."""
    def task(stem: str):
        return load_task(_path(stem))

    jobs = [(("start", s), lambda s=s: inductor_start.captured_async(task(s), "cpu")) for s in _STARTS]
    jobs += [(("code", s), lambda s=s: output_code_async(task(s), "cpu")) for s in _OUTPUT_CODES]
    raw: dict[tuple[str, str], object] = {}
    held = inductor_start._child_reply

    async def recorded(command: list[str], timeout_s: float, hold=None):
        reply = await held(command, timeout_s, hold)
        if command[-1] == "cpu":  # a start's capture (an output code's ends with "public")
            raw[("raw", Path(command[-2]).stem)] = copy.deepcopy(reply)
        return reply

    async def all_of() -> dict:
        slots = asyncio.Semaphore(2)

        async def one(make):
            async with slots:
                return await make()

        return dict(zip([key for key, _ in jobs], await asyncio.gather(*(one(make) for _, make in jobs))))

    with pytest.MonkeyPatch.context() as monkeypatch:  # only while these captures run, before any test's patch
        monkeypatch.setattr(inductor_start, "_child_reply", recorded)
        done = asyncio.run(all_of())
    return done | raw


@pytest.fixture(scope="module")
def judge(cpu_judge):
    return cpu_judge  # conftest's, shared with the other modules that only ask for verdicts


# elementwise (one pointwise kernel), a row softmax (a looped reduction and a pointwise pass) and
# RMSNorm over dim 1 of a 4-d tensor (strided reduction, sizes as kernel arguments)
@pytest.mark.parametrize("stem", ["26_GELU_", "23_Softmax", "36_RMSNorm_"])
def test_inductor_start_accepted_on_cpu_shapes(judge, stem):
    task = load_task(COPIES / f"{stem}.py")
    start = derived(stem)
    assert isinstance(start, Start), start
    assert "@triton.jit" in start.source and start.kernels
    assert "def call(" in start.output_code  # the output code itself, for a prompt to show
    _assert_two_paths(start)
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


# Inductor hands each GEMM to ATen (extern_kernels.mm, addmm with the Linear's bias, bmm): the start
# launches kernforge's own GEMM there. LayerNorm holds a weight and a bias whose sizes follow the
# shape (its normalized_shape is traced as sizes, not the example's literals); 76's Linear has its
# weight transposed by reinterpret_tensor and a separate bias Parameter. InstanceNorm returns a
# view of its output (reinterpret_tensor in the return statement).
@pytest.mark.parametrize("stem", ["2_Standard_matrix_multiplication_", "76_Gemm_Add_ReLU", "40_LayerNorm",
                                  "3_Batched_matrix_multiplication", "34_InstanceNorm"])
def test_inductor_start_with_gemm_or_weights_accepted_on_cpu_shapes(judge, stem):
    task = load_task(COPIES / f"{stem}.py")
    start = derived(stem)
    assert isinstance(start, Start), start
    assert "extern_kernels" not in start.source.split("class ModelNew")[1]
    _assert_two_paths(start)
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


def _assert_two_paths(start: Start) -> None:
    """Inductor's static code for the timed shape and its dynamic code, apart in one module: the
    static kernels prefixed, both sets named in the description, forward choosing between them."""
    static = [k for k in start.kernels if k.startswith("static_")]
    dynamic = [k for k in start.kernels if k != "_kf_gemm" and not k.startswith("static_")]
    assert "def _at_static_sizes(inputs)" in start.source and "def call(" in start.static_output_code
    assert "def _inductor_static(" in start.source and "def _inductor_dynamic(" in start.source
    assert "with static sizes for the timed shape" in start.description
    for name in static + dynamic:
        assert f"def {name}(" in start.source and f"_launch_{name}(" in start.source and name in start.description
    gemm = "_kf_gemm" in start.kernels
    assert (static and dynamic) or gemm  # a plain matmul has only kernforge's GEMM on each path
    if gemm:
        static_path, dynamic_path = start.source.split("def _inductor_static(")[1].split("def _inductor_dynamic(")
        assert "_launch_kf_gemm(" in static_path and "general=True" not in static_path
        # every shape but the timed one takes the dynamic path: its GEMM is compiled once for them all
        launches = [line for line in dynamic_path.splitlines() if "_launch_kf_gemm(" in line]
        assert launches and all(line.endswith(", general=True)") for line in launches), launches


def _load(source: str, tmp_path: Path, name: str):
    """The start's module, imported from a file as the judge imports a candidate."""
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launches(module) -> list[str]:
    """Every ``_launch_*`` function of ``module`` wrapped to record its name when called: the
    forward paths look their launchers up in the module's globals at each call."""
    ran: list[str] = []
    for name in [n for n in vars(module) if n.startswith("_launch_")]:
        def recorded(*args, _name=name, _launch=getattr(module, name), **kwargs):
            ran.append(_name.removeprefix("_launch_"))
            return _launch(*args, **kwargs)
        setattr(module, name, recorded)
    return ran


# RMSNorm (a persistent reduction at the timed shape, a looped one with dynamic sizes) and a
# Linear (kernforge's GEMM on both paths, weights compared with their literal sizes too)
@pytest.mark.parametrize("stem", ["36_RMSNorm_", "76_Gemm_Add_ReLU"])
def test_static_kernels_run_at_the_timed_shape_and_dynamic_ones_elsewhere(tmp_path, stem):
    import torch

    from kernforge.tasks.runtime import build_model, make_init_inputs, make_inputs, reference_module

    task = load_task(COPIES / f"{stem}.py")
    start = derived(stem)
    assert isinstance(start, Start), start
    candidate = _load(start.source, tmp_path, f"start_{stem}")
    ran = _launches(candidate)
    timed, hidden = task.shapes("cpu", hidden=False)[0], task.shapes("cpu", hidden=True)
    for shape in (timed, *hidden):
        ran.clear()
        init = make_init_inputs(task, shape)
        reference = build_model(reference_module(task).Model, init, 0, "cpu")
        model = build_model(candidate.ModelNew, init, 0, "cpu")
        inputs = make_inputs(task, shape, "default", 0, "cpu")
        with torch.no_grad():
            torch.testing.assert_close(model(*inputs), reference(*inputs), rtol=1e-4, atol=1e-4)
        inductors = [k for k in ran if k != "kf_gemm"]
        assert inductors, (shape, ran)
        on_static = all(k.startswith("static_") for k in inductors)
        on_dynamic = not any(k.startswith("static_") for k in inductors)
        assert on_static if shape == timed else on_dynamic, (shape.as_dict(), ran)
        assert ("kf_gemm" in ran) == ("_kf_gemm" in start.kernels)


def test_the_dynamic_kernels_index_in_64_bits_and_the_static_ones_as_inductor_chose():
    """The dynamic code runs at every hidden shape with no guard on its sizes: with Inductor's
    32-bit indices for the small example, 45_Average_Pooling_2D's start overflowed at its hidden
    shapes of 3.5e9 elements (a CUDA error on the H200). Its program ids are widened to 64 bits;
    the static code, taken at exactly the sizes it was compiled for, keeps Inductor's choice."""
    checked = 0
    for stem in _STARTS:
        start = derived(stem)
        if not isinstance(start, Start):
            continue
        tree = ast.parse(start.source)
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith(("triton_", "static_"))):
            ids = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.program_id"]
            widened = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("tl.program_id(")
                       and ast.unparse(n).endswith(".to(tl.int64)")]
            if fn.name.startswith("triton_"):
                assert ids and len(widened) == len(ids), (stem, ast.unparse(fn))
                checked += 1
            else:
                assert not widened, (stem, ast.unparse(fn))  # the CPU shapes fit 32 bits: Inductor's own choice
    assert checked >= 8  # a dynamic kernel or more in each start of a pointwise op, a reduction, a norm, a GEMM's epilogue


def test_a_size_dynamo_specialised_is_refused_by_the_dynamic_path_with_the_reason(tmp_path):
    """Dynamo fixes a size the forward branches on although every size is marked dynamic (on the
    H200, 41_Max_Pooling_1D's start gave an output of the example's length at every other length:
    rejected as wrong). The dynamic path refuses a call whose fixed size differs, saying so, and
    runs where it holds."""
    import torch

    task = load_task(FIXED)
    start = derived("kb_fixed_length", check=False)
    assert isinstance(start, Start), start
    length = example_shape(task, "cpu").as_dict()["sequence_length"]
    candidate = _load(start.source, tmp_path, "start_fixed")
    assert (0, 2, length) in candidate._FIXED_SIZES
    other = torch.randn(3, 5, length + 15)
    with pytest.raises(ValueError, match=f"dimension 2 of input 0 fixed at {length} .*this call has {length + 15}"):
        candidate.ModelNew()(other)
    assert candidate._dynamic_code_holds((torch.randn(3, 5, length),)) is None


def test_no_start_where_a_size_dynamo_specialised_varies_across_the_tasks_shapes(tmp_path):
    """A hidden shape of another length: a start whose dynamic code holds the length would be
    rejected there, so there is none, and the reason says why without the hidden shape's sizes.
    Where every other shape keeps the fixed size (the hidden lengths set to the public one's), the
    start stands."""
    task = load_task(FIXED)
    length = example_shape(task, "cpu").as_dict()["sequence_length"]  # what the dynamic code holds
    other = ({s.as_dict()["sequence_length"] for s in task.shapes("cpu", hidden=True)} - {length}).pop()
    start = derived("kb_fixed_length")
    assert isinstance(start, NoStart)
    assert (f"holds dimension 2 of input 0 at {length} (Dynamo specialised it), and a hidden shape has {other} there"
            in start.reason), start.reason
    folder = tmp_path / "same_length"
    folder.mkdir()
    (folder / "kb_fixed_length.py").write_text(FIXED.read_text())
    meta = FIXED.with_suffix(".meta.py").read_text()
    hidden = meta[meta.index("CPU_HIDDEN_SHAPES"):].replace(f"'sequence_length': {other}", f"'sequence_length': {length}")
    (folder / "kb_fixed_length.meta.py").write_text(meta[:meta.index("CPU_HIDDEN_SHAPES")] + hidden)
    same = inductor_start.checked(load_task(folder / "kb_fixed_length.py"), "cpu", derived("kb_fixed_length", check=False))
    assert isinstance(same, Start) and (0, 2, length) in same.fixed


def test_a_dilated_max_pool1d_keeps_its_length_a_symbol_and_its_start_serves_every_length():
    """41_Max_Pooling_1D (dilation 3): traced as itself, Dynamo fixed the length inside
    ``F.max_pool1d`` and there was no start; the capture traces it as the 2-d pooling over a row,
    and the start is judged at lengths 64 and 49 alike."""
    start = derived("41_Max_Pooling_1D")
    assert isinstance(start, Start) and not start.fixed, start


def test_the_captures_max_pool1d_is_torchs_at_every_setting():
    import torch

    from kernforge.loop.inductor_code import _max_pool1d_as_2d, _max_pool1d_with_indices_as_2d

    x = torch.randn(2, 3, 37)
    for k, s, p, d, ceil in [(8, 1, 4, 3, False), (3, (), 1, 1, True), (4, [], 0, 2, False), ((5,), (2,), (2,), (1,), True)]:
        want = torch.max_pool1d_with_indices(x, k, s, p, d, ceil)
        got = _max_pool1d_with_indices_as_2d(x, k, s, p, d, ceil)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), (k, s, p, d, ceil)
        assert torch.equal(_max_pool1d_as_2d(x, k, s, p, d, ceil), torch.max_pool1d(x, k, s, p, d, ceil))


def test_an_outer_reduction_is_launched_with_many_rows_and_a_short_block_on_a_gpu():
    """48_Mean_reduction_over_a_dimension reduces a strided axis (Inductor's ReductionHint.OUTER).
    Launched as an inner one (one row per program, 512 of the reduced axis: every load strided),
    its start ran at 0.10x eager on the H200. On a GPU it now gets Inductor's outer config; a
    contiguous reduction (a softmax row) keeps one row per program."""
    from kernforge.loop import inductor_start

    def launchers(stem: str) -> list[str]:
        start = derived(stem)
        assert isinstance(start, Start), start
        kernels = inductor_start._kernels(ast.parse(start.output_code))
        return [inductor_start._launcher(name, src, params, inductor_start.BLOCKS["cuda"])
                for name, (src, params) in kernels.items() if any(p.startswith("R0_") for p in params)]

    outer = launchers("48_Mean_reduction_over_a_dimension")
    assert outer and all("XBLOCK = 64" in text and "R0_BLOCK = 8" in text for text in outer), outer
    inner = launchers("23_Softmax")
    assert inner and all("XBLOCK = 1\n" in text and "R0_BLOCK = 512" in text for text in inner), inner


def test_the_tuner_moves_the_block_sizes_of_both_paths_and_the_start_stays_correct(judge):
    """The offline tuner's knob analysis finds the launches of both paths' kernels; a configuration
    that moves every block size of both is still accepted on every CPU shape."""
    from kernforge.loop import knobs

    task = load_task(COPIES / "36_RMSNorm_.py")
    start = derived("36_RMSNorm_")
    assert isinstance(start, Start), start
    analysis = knobs.analyse(start.source)
    blocks = [k for k in analysis.knobs if k.kind not in ("option", "eviction")]
    tuned = {k.kernel for k in blocks}
    assert {k for k in start.kernels if k.startswith("static_")} <= tuned, analysis.notes
    assert {k for k in start.kernels if not k.startswith("static_")} <= tuned, analysis.notes
    moved = knobs.rewrite(start.source, analysis, {k.label: max(1, k.value // 2) for k in blocks})
    assert moved != start.source
    verdict = judge.verify(moved, task)
    assert verdict.accepted, describe(verdict)


@pytest.mark.parametrize("broken", ["untranslatable", "capture failed"])
def test_without_a_usable_static_capture_the_start_is_dynamic_only_and_says_why(judge, monkeypatch, broken):
    """Where the static capture fails, or its code is not all Triton, the start is the dynamic one
    alone (still a start: hidden shapes need only that), and its description says why."""
    from kernforge.loop import inductor_start

    captured = _raw_reply("26_GELU_")  # the capture child's real reply (the one behind _captured's start)
    assert isinstance(captured, dict) and "static" in captured, captured

    async def static_broken(command, timeout_s, hold=None):
        assert command == inductor_start._child_command(task, "cpu")
        reply = copy.deepcopy(captured)
        if broken == "capture failed":
            reply["static"] = {"error": "torch.compile failed on the reference: a test's reason"}
        else:  # an ATen fallback where the static code allocates: nothing of ours stands in
            reply["static"]["wrapper"] = reply["static"]["wrapper"].replace("empty_strided_cpu(", "extern_kernels.empty(", 1)
        return reply

    monkeypatch.setattr(inductor_start, "_child_reply", static_broken)
    task = load_task(COPIES / "26_GELU_.py")  # the smallest start: the fallback is the same for any op
    start = derive(task, "cpu")
    assert isinstance(start, Start), start
    assert "_at_static_sizes" not in start.source and "_inductor_static" not in start.source
    assert start.kernels and not any(k.startswith("static_") for k in start.kernels)
    assert start.static_output_code == ""
    assert "dynamic sizes only, on every shape" in start.description
    assert ("a test's reason" if broken == "capture failed" else "extern_kernels.empty") in start.description
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


def test_start_of_reference_with_weights_builds_them_as_the_reference_does():
    """ModelNew's __init__ is the reference's (drawn under the same seed: the same weights), and
    forward passes them to Inductor's call in the capture's order, by name."""
    start = derived("76_Gemm_Add_ReLU")
    assert isinstance(start, Start), start
    model_new = start.source.split("class ModelNew")[1]
    assert "def __init__(self, in_features, out_features, bias_shape):\n        super().__init__()" in model_new
    assert "self.gemm = nn.Linear(in_features, out_features, bias=False)" in model_new
    assert 'self.get_parameter("bias"), self.get_parameter("gemm.weight")' in model_new
    assert "_launch_kf_gemm(" in model_new and "_kf_gemm" in start.kernels


def _problem(tmp_path: Path, stem: str, source: str) -> Path:
    """A KernelBench-style problem file beside a copy of 76's CPU shapes."""
    (tmp_path / f"{stem}.py").write_text(source)
    (tmp_path / f"{stem}.meta.py").write_text((COPIES / "76_Gemm_Add_ReLU.meta.py").read_text())
    return tmp_path / f"{stem}.py"


_WITH_HELPER = """import torch
import torch.nn as nn

def make_linear(i, o):
    return nn.Linear(i, o)

class Model(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super(Model, self).__init__()
        self.gemm = make_linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.gemm(x))

batch_size = 8
in_features = 16
out_features = 16
bias_shape = (out_features,)

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, bias_shape]
"""


def test_reference_whose_init_reads_a_module_helper_has_no_start_and_says_why(tmp_path):
    result = derive(load_task(_problem(tmp_path, "helper_linear", _WITH_HELPER)), "cpu")
    assert isinstance(result, NoStart), result
    assert "make_linear" in result.reason and "Model.__init__" in result.reason


def test_a_module_int_that_differs_between_shapes_and_is_no_size_says_so():
    """The CPU copy of 47 reduces over every reduce_dim: Inductor's code holds one reduction axis."""
    result = derived("47_Sum_reduction_over_a_dimension")  # derive's own steps: captured_async, then checked
    assert isinstance(result, NoStart), result
    assert "Model.dim differs between the task's shapes" in result.reason


def test_other_aten_fallback_has_no_start_and_the_reason_names_the_call(tmp_path):
    """A convolution is still ATen's (extern_kernels.convolution): no kernel of ours stands in."""
    source = _WITH_HELPER.replace("self.gemm = make_linear(in_features, out_features)",
                                  "self.conv = nn.Conv1d(1, 2, 3)").replace(
        "return torch.relu(self.gemm(x))", "return self.conv(x[:, None, :])")
    result = derive(load_task(_problem(tmp_path, "conv", source)), "cpu")
    assert isinstance(result, NoStart), result
    assert "not all Triton" in result.reason and "convolution" in result.reason


def test_run_without_key_on_unseeded_kernelbench_problem_makes_accepted_attempts(tmp_path):
    """`kernforge run` with no key on a KernelBench file with no seed: the Inductor start is judged
    first and accepted, and the offline tuner goes on from it."""
    import os
    import sqlite3
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("KERNFORGE_")}
    db = tmp_path / "run.db"
    done = subprocess.run([sys.executable, "-m", "kernforge.cli", "run", "--task", str(COPIES / "19_ReLU.py"),
                           "--max-attempts", "2", "--db", str(db)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT proposer, status FROM attempts ORDER BY id").fetchall()
    assert rows[0] == ("inductor", "accepted"), rows
    assert len(rows) == 2 and rows[1][0] == "offline", rows


# ---- what a prompt shows -------------------------------------------------------------------------
def test_listing_of_real_output_code_is_the_kernels_and_call():
    """A row softmax: Inductor writes two kernels (a looped reduction, then the normalising pass)."""
    code = _output_code("23_Softmax")
    assert isinstance(code, str), code
    shown = listing(code)
    assert shown is not None and len(shown.kernels) >= 1 and shown.total_lines == len(code.splitlines())
    ast.parse(shown.text)  # still Python: kernels and call() as Inductor wrote them
    for name in shown.kernels:
        assert f"def {name}(" in shown.text and f"{name}.run(" in shown.text
    assert shown.text.count("@triton.jit") == len(shown.kernels) and "def call(" in shown.text
    assert "# Topologically Sorted Source Nodes" in shown.text  # which ops each kernel fuses
    # the autotuning decorators, imports and benchmark harness are left out
    for gone in ("triton_heuristics", "size_hints", "def get_args", "benchmark_compiled_module", "import "):
        assert gone in code and gone not in shown.text


def test_listing_is_none_where_inductor_writes_no_triton():
    """A plain matmul is handed to ATen: there is output code, but no Triton kernel to show."""
    code = _output_code("2_Standard_matrix_multiplication_")
    assert isinstance(code, str) and "extern_kernels.mm" in code
    assert listing(code) is None


def test_output_code_of_a_reference_with_parameters_takes_them_as_arguments():
    """The Linear's weight and bias are arguments of Inductor's call, as the forward's input is."""
    code = _output_code("12_Gemm_Multiply_LeakyReLU")
    assert isinstance(code, str), code
    assert "extern_kernels.addmm" in code and listing(code) is not None


def test_output_code_is_captured_on_a_public_shape_only(tmp_path):
    """The start may compile on a hidden shape (fewest 1s, then smallest); the code shown in a prompt
    never is: Inductor's file holds its example shape's sizes (and a specialised size is a literal)."""
    folder = tmp_path / "norm_small_hidden"
    folder.mkdir()
    (folder / "reference.py").write_text((TASKS / "tiny_norm" / "reference.py").read_text())
    meta = (TASKS / "tiny_norm" / "meta.py").read_text()
    meta = meta.replace('PUBLIC_SHAPES = [{"T": 4, "H": 64}, {"T": 8, "H": 128}]', 'PUBLIC_SHAPES = [{"T": 6, "H": 96}]')
    meta = meta.replace('HIDDEN_SHAPES = [{"T": 3, "H": 96}, {"T": 5, "H": 200}]', 'HIDDEN_SHAPES = [{"T": 3, "H": 40}]')
    (folder / "meta.py").write_text(meta)
    task = load_task(folder)
    assert example_shape(task, "cpu").as_dict() == {"T": 3, "H": 40}  # what the start compiles on
    assert example_shape(task, "cpu", public_only=True).as_dict() == {"T": 6, "H": 96}
    code = asyncio.run(output_code_async(task, "cpu"))
    assert isinstance(code, str), code
    assert "rand_strided((6, 96)" in code and "(3, 40)" not in code and "= 40\n" not in code


def test_a_capture_past_its_time_is_killed_and_says_so():
    result = asyncio.run(output_code_async(load_task(COPIES / "19_ReLU.py"), "cpu", timeout_s=0.01))
    assert isinstance(result, NoStart) and "took more than" in result.reason


def test_a_cancelled_start_capture_kills_its_child(tmp_path, monkeypatch):
    """A run that stops while the Inductor start is being captured must not wait for the capture:
    on the H200 a stopped KernelBench run sat until its time ran out behind captures run in
    threads. The capture is a child process of the event loop, killed when cancelled."""
    import asyncio
    import os
    import sys

    from kernforge.loop import inductor_start
    from kernforge.tasks.loader import load_task

    pid_file = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    monkeypatch.setattr(inductor_start, "_child_command", lambda task, kind, **kw: [sys.executable, "-c", sleeper])
    task = load_task(TASKS / "tiny_norm")

    async def main():
        capture = asyncio.create_task(inductor_start.derive_async(task, "cpu"))
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.05)
        capture.cancel()
        with pytest.raises(asyncio.CancelledError):
            await capture

    asyncio.run(main())
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_capture_runs_its_child_inside_the_runs_gpu_hold(monkeypatch):
    """On a GPU the child allocates and fills inputs: the hold (Devices.gpu_child) starts it and
    keeps it (enlisted with every gate) while it runs, and lets it go after, also on a failure."""
    from kernforge.loop import inductor_start

    events: list[str] = []

    @contextlib.asynccontextmanager
    async def hold(start):
        events.append("held")
        child = await start()
        events.append("started")
        try:
            yield child
        finally:
            events.append("released")

    async def child(started, timeout_s):
        events.append("child")
        started.kill()
        await started.wait()
        return NoStart("the child failed")

    monkeypatch.setattr(inductor_start, "_child_answer", child)
    task = load_task(COPIES / "19_ReLU.py")
    assert isinstance(asyncio.run(inductor_start.derive_async(task, "cuda", hold=hold)), NoStart)
    assert isinstance(asyncio.run(inductor_start.output_code_async(task, "cuda", hold=hold)), NoStart)
    assert events == ["held", "started", "child", "released"] * 2


_POOL_2D = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)

batch_size = 2
channels = 3
height = 8
width = 8
kernel_size = 4
stride = 1
padding = 1

def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]

def get_init_inputs():
    return [kernel_size, stride, padding]
"""

#: 42_Max_Pooling_2D's trouble in small: the smallest shape pools a height of 2 into one row
_POOL_2D_META = """CPU_PUBLIC_SHAPES = [{'batch_size': 2, 'channels': 3, 'height': 8, 'width': 8, 'kernel_size': 4, 'stride': 1, 'padding': 1}]
CPU_HIDDEN_SHAPES = [
    {'batch_size': 2, 'channels': 3, 'height': 2, 'width': 8, 'kernel_size': 4, 'stride': 1, 'padding': 1},
    {'batch_size': 3, 'channels': 2, 'height': 9, 'width': 7, 'kernel_size': 4, 'stride': 1, 'padding': 1},
]
"""


def test_a_start_is_captured_on_the_next_shape_where_the_smallest_makes_dynamo_fix_a_size(judge, tmp_path):
    """On the H100, 42_Max_Pooling_2D had no start: its smallest shape (height 2) pools into one
    row, Dynamo fixed the height at 2 there, and the other shapes' heights vary. The start is now
    captured on the next example shape, where the height stays a symbol, and is accepted at every
    shape, the height-2 one included."""
    (tmp_path / "pool2d.py").write_text(_POOL_2D)
    (tmp_path / "pool2d.meta.py").write_text(_POOL_2D_META)
    task = load_task(tmp_path / "pool2d.py")
    assert example_shape(task, "cpu").as_dict()["height"] == 2
    start = derive(task, "cpu")
    assert isinstance(start, Start), start
    assert not any(d == 2 for _, d, _ in start.fixed), start.fixed
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


@pytest.mark.parametrize("guards, retry", [
    (("Ne(s71 - 1, 1)", "Eq(s18 - 1, 1)", "Max(1, s71 - 1) > 1"), True),   # a pooled height of one row
    (("Eq(s18, 64)",), False),                                            # a branch on the length
    (("Eq(s18 - 1, 1)", "Eq(s18, 64)"), False),
    (("Ne(s18, 64)",), False),                                            # nothing was fixed
    ((), False),
    (("Eq(0, s3)",), True),
])
def test_only_a_size_dynamo_fixed_at_0_or_1_is_worth_a_capture_on_another_shape(guards, retry):
    assert inductor_start.zero_one_only(guards) is retry


_Y_SPILLING_KERNEL = '''import triton
import triton.language as tl


@triton.jit
def triton_poi_fused_transpose_0(in_ptr0, out_ptr0, ynumel, xnumel, YBLOCK: tl.constexpr, XBLOCK: tl.constexpr):
    yoffset = (tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)).to(tl.int64) * YBLOCK
    yindex = yoffset + tl.arange(0, YBLOCK)[None, :]
    ymask = yindex < ynumel
    xoffset = tl.program_id(0).to(tl.int64) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + (xindex + xnumel * yindex), xmask & ymask)
    tl.store(out_ptr0 + (yindex + ynumel * xindex), tmp0, xmask & ymask)
'''


def _y_spilling_launcher(tmp_path, kernel=None):
    """The launcher the start writes for a kernel whose y axis may spill into z (Inductor's code
    for any dynamic y size, 44_Average_Pooling_1D's on the H100), its kernel imported from a file;
    ``kernel``: a stand-in to launch instead."""
    import importlib.util

    path = tmp_path / "spilling.py"
    path.write_text(_Y_SPILLING_KERNEL)
    spec = importlib.util.spec_from_file_location("spilling", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = "triton_poi_fused_transpose_0"
    text = inductor_start._launcher(name, _Y_SPILLING_KERNEL, ["in_ptr0", "out_ptr0", "ynumel", "xnumel", "YBLOCK", "XBLOCK"],
                                    inductor_start.BLOCKS["cuda"])
    space = {"triton": module.triton, name: kernel or getattr(module, name)}
    exec(text, space)
    return space[f"_launch_{name}"], text


def test_a_y_axis_that_spills_into_z_is_launched_with_as_many_z_rows_as_the_y_limit_needs(tmp_path, device):
    """44_Average_Pooling_1D had no start on the H100: its kernel's y block is program id 1 plus
    program id 2 times the y grid (Inductor's overflow form for a y size it cannot bound), which
    the start did not launch. It now does: the y blocks over rows of at most 65535, the rows on z."""
    import torch

    grids = []

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda *args, **kw: None

    launch, text = _y_spilling_launcher(tmp_path, Spy())
    assert "_y_rows" in text
    for ynumel, expected in ((100, (1, 4, 1)), (65535 * 32, (1, 65535, 1)), (65535 * 32 * 3 + 1, (1, 49152, 4))):
        grids.clear()
        launch(None, None, ynumel, 5)
        (x, y, z), = grids
        assert (x, y, z) == expected and y <= inductor_start.MAX_Y_GRID and y * z * 32 >= ynumel, (ynumel, grids)
    # the kernel itself, launched so, moves every element (the interpreter on a CPU; a small y)
    launch, _ = _y_spilling_launcher(tmp_path)
    x = torch.randn(37, 5, device=device)
    out = torch.empty(5, 37, device=device)
    launch(x, out, 37, 5)
    assert torch.equal(out, x.t())


def test_a_persistent_outer_reduction_is_launched_with_as_many_rows_as_inductor_gives_it(judge):
    """36_RMSNorm_'s static kernel on the H100 reduced 64 elements 256 KiB apart, one row per
    program: every load its own memory transaction, 0.12x torch.compile. A persistent reduction
    that Inductor marks outer now gets Inductor's own rows per program on a GPU (the most of 1, 8,
    32, 128 within 4096 elements: 32 rows of 64); the CPU's blocks stay the interpreter's. The
    start launched with the GPU's blocks is still right (judged here by the interpreter)."""
    from kernforge.loop import inductor_paths

    stem = "48_Mean_reduction_over_a_dimension"  # its CPU shapes make the static kernel persistent, 64 wide
    raw = _raw_reply(stem)
    kernels = inductor_start._kernels(ast.parse(raw["static"]["wrapper"]))
    persistent = {n: k for n, k in kernels.items() if n.startswith("triton_per_")}
    assert persistent, list(kernels)
    for name, (src, params) in persistent.items():
        assert inductor_start._hint(src) == inductor_start.OUTER_HINT
        assert "R0_BLOCK: tl.constexpr = 64" in src
        on_gpu = inductor_start._launcher(inductor_paths.STATIC + name, src, params, inductor_start.BLOCKS["cuda"])
        assert "    XBLOCK = 32\n" in on_gpu, on_gpu
        on_cpu = inductor_start._launcher(inductor_paths.STATIC + name, src, params, inductor_start.BLOCKS["cpu"])
        assert f"    XBLOCK = {inductor_start.BLOCKS['cpu']['XR']}\n" in on_cpu, on_cpu
    task = load_task(COPIES / f"{stem}.py")
    start = inductor_start._from_child(raw, "", "cuda", task.reference_path.read_text())
    assert isinstance(start, Start), start
    assert "    XBLOCK = 32\n" in start.source
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


@pytest.mark.parametrize("src, rows", [
    (f"{inductor_start.OUTER_HINT}\ndef k():\n    xnumel = 4096\n    R0_BLOCK: tl.constexpr = 16", 128),
    (f"{inductor_start.OUTER_HINT}\ndef k():\n    xnumel = 20\n    R0_BLOCK: tl.constexpr = 16", 8),    # no more rows than there are
    (f"{inductor_start.OUTER_HINT}\ndef k():\n    R0_BLOCK: tl.constexpr = 1024", 1),
    (f"{inductor_start.OUTER_TINY_HINT}\ndef k():\n    R0_BLOCK: tl.constexpr = 4", 128),
    (f"{inductor_start.OUTER_HINT}\ndef k(R0_BLOCK: tl.constexpr):\n    pass", None),          # no literal block: dynamic code
    ("def k():\n    R0_BLOCK: tl.constexpr = 64", None),                                          # no outer hint
])
def test_a_persistent_reduction_s_rows_follow_inductor_s_own_rule(src, rows):
    assert inductor_start._persistent_rows(src) == rows
