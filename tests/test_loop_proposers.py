"""loop/proposers.py: which proposer a run gets, the LLM proposer's prompts and accounting, and the
offline tuner saying plainly when it has nothing to tune."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest

from kernforge.loop import proposers
from kernforge.loop.config import ConfigError
from kernforge.loop.errors import LoopError
from kernforge.loop.lessons import Failure, Lessons
from kernforge.loop.proposers import LLMProposer, NoProposal, OfflineTuner, llm_config
from kernforge.loop.search import Member, Population
from kernforge.loop.strategy import Bandit
from kernforge.tasks.loader import load_task
from kernforge.verifier.checks import Check
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status

sys.path.append(str(Path(__file__).resolve().parent))
from candidates import HONEST  # noqa: E402
from fake_llm import BROKEN_KERNEL, GOOD_KERNEL, fake_llm, fenced, reply  # noqa: E402

__all__ = ["fake_llm"]
TINY = Path(__file__).resolve().parent / "tasks" / "tiny_norm"
KEY = "sk-proposer-test-0a1b2c"
TORCH_COMPILE = "# What torch.compile does for this reference: beat it"


@pytest.fixture(scope="module")
def tiny_inductor_code():
    """tiny_norm's reference compiled by Inductor on the CPU: captured once for this module."""
    code = asyncio.run(proposers.output_code_async(load_task(TINY), "cpu"))
    assert isinstance(code, str), code
    return code


class Captures:
    """The LLM proposer's Inductor captures in these tests: the tasks asked for, and the answer."""

    def __init__(self, answer):
        self.asked: list[str] = []
        self.answer = answer


@pytest.fixture(autouse=True)
def captures(monkeypatch, tiny_inductor_code):
    """Each capture answered with the real code captured once (a capture is a child process that
    compiles for seconds), or with ``captures.answer`` (raised if it is an exception)."""
    fake = Captures(tiny_inductor_code)

    async def capture(task, device_kind, hold=None):
        fake.asked.append(task.name)
        if isinstance(fake.answer, BaseException):
            raise fake.answer
        return fake.answer

    monkeypatch.setattr(proposers, "output_code_async", capture)
    return fake


def env(tmp_path, **extra):
    return {"XDG_CONFIG_HOME": str(tmp_path), **extra}


def test_no_key_means_the_offline_tuner(tmp_path):
    assert llm_config(provider=None, base_url=None, models=(), offline=False, env=env(tmp_path)) is None


def test_a_key_means_the_llm_default_minimax_m3(tmp_path):
    config = llm_config(provider=None, base_url=None, models=(), offline=False, env=env(tmp_path, MINIMAX_API_KEY=KEY))
    assert (config.provider, config.model, config.key_source) == ("minimax", "MiniMax-M3", "MINIMAX_API_KEY")


def test_a_base_url_needs_no_key(tmp_path):
    config = llm_config(provider=None, base_url="http://127.0.0.1:9/v1", models=("m",), offline=False, env=env(tmp_path))
    assert config.provider == "custom" and config.api_key is None


@pytest.mark.parametrize("kwargs", [{"provider": "minimax"}, {"models": ("MiniMax-M3",)}])
def test_asking_for_a_provider_without_a_key_is_an_error(tmp_path, kwargs):
    args = {"provider": None, "base_url": None, "models": (), "offline": False} | kwargs
    with pytest.raises(ConfigError, match="no API key"):
        llm_config(**args, env=env(tmp_path))


def test_offline_takes_no_llm_options(tmp_path):
    assert llm_config(provider=None, base_url=None, models=(), offline=True, env=env(tmp_path, KERNFORGE_API_KEY=KEY)) is None
    with pytest.raises(LoopError, match="--offline"):
        llm_config(provider=None, base_url=None, models=("m",), offline=True, env=env(tmp_path))


def test_offline_tuner_starts_a_kernel_less_task_from_inductor_once():
    """No seed, nothing archived: the TorchInductor start comes first, and only once; while it is
    unjudged the tuner waits ("exhausted"), it does not finish the task."""
    task = load_task(TINY)  # no seed
    tuner = OfflineTuner()

    async def twice():
        population = Population(rng=random.Random(0))
        return await tuner.propose(task, population, Lessons()), await tuner.propose(task, population, Lessons())

    first, second = asyncio.run(twice())
    assert not isinstance(first, NoProposal) and first.proposer == "inductor", first
    assert isinstance(second, NoProposal) and second.kind == "exhausted", second


def test_a_gpu_only_seed_on_the_cpu_is_called_gpu_only_not_missing():
    """`tasks list` says the task has a seed: on the CPU the tuner says it runs on a GPU only."""
    task = load_task("fp8_quant_per_group")
    assert task.seed_source is not None and task.interpreter_unsupported
    result = asyncio.run(OfflineTuner().propose(task, Population(rng=random.Random(0)), Lessons()))
    assert isinstance(result, NoProposal) and result.kind == "nothing_to_tune"
    assert "runs on a GPU only" in result.reason and "no seed kernel" not in result.reason


def test_offline_tuner_tunes_the_seed_and_never_repeats():
    task = load_task(TINY)
    pop = Population(rng=random.Random(0))
    pop.set_seed(HONEST)
    tuner = OfflineTuner(seed=1)
    # num_warps 1, 2, 4 (the seed's), 8, 16 times an eviction hint for each of its two loads
    assert (tuner.reach(task, pop).total, tuner.reach(task, pop).tried) == (5 * 3 * 3, 0)
    seen = {HONEST}
    for _ in range(60):
        p = asyncio.run(tuner.propose(task, pop, Lessons()))
        if isinstance(p, NoProposal):
            break
        assert p.proposer == "offline" and p.parent.code == HONEST and p.tokens_in == 0
        assert p.code not in seen and "offline tuning of _norm_kernel" in p.description
        seen.add(p.code)
    else:
        pytest.fail(f"the offline tuner never ran out: {len(seen)} kernels and still proposing")
    assert p.kind == "exhausted" and len(seen) == 45 == tuner.reach(task, pop).total
    primed = OfflineTuner(seed=1)
    primed.prime(task, [(code, None) for code in seen])  # archived attempts count as tried
    assert asyncio.run(primed.propose(task, pop, Lessons())).kind == "exhausted"
    assert primed.reach(task, pop).left == 0


def test_offline_tuner_reach_is_none_without_knobs():
    task = load_task(TINY)
    pop = Population(rng=random.Random(0))
    assert OfflineTuner().reach(task, pop) is None  # nothing to start from
    pop.set_seed("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    assert OfflineTuner().reach(task, pop) is None  # no Triton kernel: no knobs


def trained(favourite: str) -> Bandit:
    """A bandit that has learned ``favourite`` pays and every other strategy does not."""
    bandit = Bandit(random.Random(0), discount=1.0)
    for strategy in ("improve", "explore", "repair", "fresh"):
        for _ in range(50):
            bandit.update((strategy, "fake-model"), 1.0 if strategy == favourite else 0.0)
    return bandit


def propose(server, tmp_path, population, lessons=None, script=None, bandit=None):
    server.script = script or [reply(fenced(GOOD_KERNEL), prompt_tokens=300, completion_tokens=200)]
    config = llm_config(provider=None, base_url=server.base_url, models=("fake-model",), offline=False,
                        env=env(tmp_path, KERNFORGE_API_KEY=KEY))

    async def go():
        proposer = LLMProposer(config, ("fake-model",), bandit or Bandit(random.Random(0)), hardware={"torch": "2.x"}, device_kind="cpu")
        await proposer.start()
        try:
            return await proposer.propose(load_task(TINY), population, lessons or Lessons())
        finally:
            await proposer.aclose()

    return asyncio.run(go())


def test_llm_proposal_carries_prompt_response_and_accounting(fake_llm, tmp_path):
    p = propose(fake_llm, tmp_path, Population(rng=random.Random(0)))
    assert p.code == GOOD_KERNEL and p.unusable is None and p.arm == ("fresh", "fake-model")
    assert p.proposer == "llm/fresh" and p.model == "fake-model" and p.parent is None
    assert (p.tokens_in, p.tokens_out, p.retries) == (300, 200, 0)
    assert json.loads(p.prompt) == fake_llm.completions[0].body["messages"]
    assert KEY not in p.prompt + p.response


def test_repair_turn_shows_the_failure_and_the_lessons(fake_llm, tmp_path):
    pop = Population(rng=random.Random(0))
    failed = Rejected(Status.COMPILE_ERROR, "compiling failed while loading the module: NameError: name 'tl' is not defined",
                      evidence={"check": "compile", "error": "NameError: name 'tl' is not defined"})
    pop.add(Member(BROKEN_KERNEL, failed, attempt_id=4))
    lessons = Lessons(min_count=1)
    lessons.observe(Failure.of_verdict(failed))
    p = propose(fake_llm, tmp_path, pop, lessons, bandit=trained("repair"))
    assert p.arm == ("repair", "fake-model") and p.proposer == "llm/repair" and p.parent.attempt_id == 4
    user = json.loads(p.prompt)[1]["content"]
    assert "Fix the parent kernel" in user and "name 'tl' is not defined" in user
    assert "Compiling failed with `NameError: name 'tl' is not defined` (1x, compile check)" in user  # the lesson
    assert "Check: compile. What passes it: Fix the error the traceback names" in user  # the defence's remedy


def test_verdicts_reach_the_prompt_typed(fake_llm, tmp_path, monkeypatch):
    """Population -> choice -> Parent/Inspiration -> render: the verdict objects themselves travel."""
    pop = Population(rng=random.Random(0))
    good = Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter", time_us=900.0),))
    bad = Rejected(Status.RUNTIME_ERROR, "running failed while checking: IndexError", check=Check.RUNTIME,
                   evidence={"error": "IndexError: out of range"})
    pop.add(Member(HONEST, good, attempt_id=1))
    pop.add(Member(BROKEN_KERNEL, bad, attempt_id=2))
    seen = []
    real = proposers.render

    def spy(task, hardware, *, parent=None, inspirations=(), **kw):
        seen.append((parent, tuple(inspirations)))
        return real(task, hardware, parent=parent, inspirations=inspirations, **kw)

    def no_dicts(self):
        raise AssertionError("a verdict became a dict before the archive")

    monkeypatch.setattr(proposers, "render", spy)
    monkeypatch.setattr(Accepted, "to_dict", no_dicts)
    monkeypatch.setattr(Rejected, "to_dict", no_dicts)
    p = propose(fake_llm, tmp_path, pop, bandit=trained("repair"))
    (parent, inspirations), = seen
    assert p.parent.verdict is bad and parent.verdict is bad and [i.verdict for i in inspirations] == [good]
    assert "Check: runtime. What passes it: " in json.loads(p.prompt)[1]["content"]


def test_improve_turn_shows_the_parent_and_a_reply_without_code_is_kept(fake_llm, tmp_path):
    pop = Population(rng=random.Random(0))
    times = Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter", time_us=900.0),))
    pop.add(Member(HONEST, times, attempt_id=1))
    p = propose(fake_llm, tmp_path, pop, script=[reply("no code here, sorry")], bandit=trained("improve"))
    assert p.unusable == "no_code" and p.code == "no code here, sorry"  # archived as the attempt's text
    assert p.arm == ("improve", "fake-model") and p.parent.attempt_id == 1
    assert "Write a faster kernel than the parent" in json.loads(p.prompt)[1]["content"]


def test_offline_tuner_says_when_the_seed_itself_was_rejected():
    task = load_task(TINY)
    pop = Population(rng=random.Random(0))
    pop.set_seed(HONEST)
    pop.add(Member(HONEST, Rejected(Status.CRASHED, "the candidate's process crashed: SIGSEGV"), attempt_id=1))
    result = asyncio.run(OfflineTuner().propose(task, pop, Lessons()))
    assert isinstance(result, NoProposal) and result.kind == "nothing_to_tune"
    assert "seed kernel was rejected (crashed: the candidate's process crashed" in result.reason


def proposals(server, tmp_path, population, n: int, notes: list[str]) -> list:
    """``n`` proposals for tiny_norm from one LLM proposer (one run), its notes kept."""
    server.script = [reply(fenced(GOOD_KERNEL))] * n
    config = llm_config(provider=None, base_url=server.base_url, models=("fake-model",), offline=False,
                        env=env(tmp_path, KERNFORGE_API_KEY=KEY))

    async def go():
        proposer = LLMProposer(config, ("fake-model",), Bandit(random.Random(0)), hardware={"torch": "2.x"},
                               device_kind="cpu", note=notes.append)
        task = load_task(TINY)
        proposer.prepare([task])
        await proposer.start()
        try:
            return [await proposer.propose(task, population, Lessons()) for _ in range(n)]
        finally:
            await proposer.aclose()

    return asyncio.run(go())


def test_every_prompt_shows_torch_compiles_code_captured_once_per_run(fake_llm, tmp_path, captures, tiny_inductor_code):
    pop = Population(rng=random.Random(0))
    timed = Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "graph", time_us=30.0, compile_us=42.0),
                             ShapeResult({"T": 3, "H": 96}, True, "float32", "graph", time_us=30.0, compile_us=987.0)))
    pop.add(Member(HONEST, timed, attempt_id=1))
    notes: list[str] = []
    made = proposals(fake_llm, tmp_path, pop, 3, notes)
    assert captures.asked == ["tiny_norm"] and notes == []  # once for the run, though prepared and asked 3 times
    shown = proposers.listing(tiny_inductor_code)
    for p in made:
        user = json.loads(p.prompt)[1]["content"]
        assert TORCH_COMPILE in user and shown.text.strip() in user
        assert "| T=4 H=64 | 42 |" in user and "987" not in user  # the judge's baseline, public shapes only


@pytest.mark.parametrize("answer, why", [
    ("def call(args):\n    return (extern_kernels.mm(args[0], args[1]),)\n", "Inductor writes no Triton kernel for it"),
    (proposers.NoStart("the reference holds parameters or buffers (weight)"), "the reference holds parameters"),
    (OSError("[Errno 24] Too many open files"), "OSError: [Errno 24] Too many open files"),
])
def test_no_triton_no_section_and_the_proposal_is_still_made(fake_llm, tmp_path, captures, answer, why):
    captures.answer = answer
    notes: list[str] = []
    p, = proposals(fake_llm, tmp_path, Population(rng=random.Random(0)), 1, notes)
    assert p.code == GOOD_KERNEL and "torch.compile's own code" not in json.loads(p.prompt)[1]["content"]
    assert len(notes) == 1 and notes[0].startswith(f"[tiny_norm] prompts show no torch.compile code: {why}")
