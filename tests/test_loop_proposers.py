"""loop/proposers.py: which proposer a run gets, the LLM proposer's prompts and accounting, and the
offline tuner saying plainly when it has nothing to tune."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import sys
from pathlib import Path

import pytest

from kernforge.loop import inductor_start, proposers
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
    primed.prime(task, lambda: [(code, None) for code in seen])  # archived attempts count as tried
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
        proposer.prepare([(task, population)])
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


# ---- the offline tuner's Inductor starts, derived in the background -------------------------------
#: what the fake derivation answers by default: a start to propose
FAKE_START = proposers.Start(HONEST, ("_norm_kernel",), "", "TorchInductor's Triton kernels (a stand-in)")


class Derivations:
    """The offline tuner's Inductor starts in these tests: who was asked, how many ran at once, who
    was cancelled; with ``held``, each runs until the test lets it end (``let``), so concurrency is
    counted, never timed."""

    def __init__(self):
        self.asked: list[str] = []
        self.cancelled: list[str] = []
        self.running = 0
        self.most = 0
        self.held = False
        self._gates: dict[str, asyncio.Event] = {}

    def let(self, *names: str) -> None:
        for name in names:
            self._gates.setdefault(name, asyncio.Event()).set()

    async def derive(self, task, device_kind, hold=None):
        self.asked.append(task.name)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if self.held:
                await self._gates.setdefault(task.name, asyncio.Event()).wait()
        except asyncio.CancelledError:
            self.cancelled.append(task.name)
            raise
        finally:
            self.running -= 1
        return FAKE_START


@pytest.fixture
def derivations(monkeypatch):
    fake = Derivations()
    monkeypatch.setattr(proposers, "derive_async", fake.derive)
    return fake


def named(name: str):
    """tiny_norm (no seed) under another name: one more kernel-less task."""
    return dataclasses.replace(load_task(TINY), name=name)


def empty() -> Population:
    return Population(rng=random.Random(0))


async def settle(holds, turns: int = 500) -> None:
    """Let the event loop run until ``holds()`` is true: turns of the loop, no clock."""
    for _ in range(turns):
        if holds():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"still not true after {turns} turns of the event loop")


async def spin(turns: int = 50) -> None:
    """Give everything ready to run enough turns to do so (before asserting that it did not)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def test_prepare_derives_the_starts_in_the_background_a_few_ahead(derivations):
    """No proposal asked: the starts are derived in the order given, never more than the slots at
    once, and no more than PREPARED_AHEAD ahead of the producer taking them: a derivation holds the
    GPU's gate shared, and a verdict's timed phases wait for it."""
    ahead = proposers.PREPARED_AHEAD
    names = [f"t{i}" for i in range(ahead + 2)]
    derivations.held = True

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([named(n) for n in names])
        await settle(lambda: len(derivations.asked) == min(ahead, proposers.CAPTURE_SLOTS))
        await spin()
        assert derivations.asked == names[:ahead]
        derivations.let(names[0])
        await settle(lambda: derivations.running == ahead - 1)
        await spin()
        assert derivations.asked == names[:ahead], "derived, not taken: nothing more is started"
        assert (await tuner.propose(named(names[0]), empty(), Lessons())).proposer == "inductor"
        await settle(lambda: derivations.asked == names[:ahead + 1])
        derivations.let(*names)
        for name in names[1:]:
            assert (await tuner.propose(named(name), empty(), Lessons())).proposer == "inductor"
        await settle(lambda: derivations.asked == names and derivations.running == 0)
        await tuner.aclose()

    asyncio.run(go())
    assert derivations.most == min(ahead, proposers.CAPTURE_SLOTS) and derivations.cancelled == []


def test_a_prepared_start_is_proposed_without_deriving_it_again(derivations):
    """The producer takes the start prepared in the background; a task not prepared is derived when asked."""

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([named("a")])
        await settle(lambda: derivations.asked == ["a"])
        pop = empty()
        made = [await tuner.propose(named("a"), pop, Lessons()), await tuner.propose(named("a"), pop, Lessons())]
        made.append(await tuner.propose(named("b"), empty(), Lessons()))
        await tuner.aclose()
        return made

    first, second, unprepared = asyncio.run(go())
    assert first.proposer == "inductor" and first.code == HONEST and first.description == FAKE_START.description
    assert isinstance(second, NoProposal) and second.kind == "exhausted"  # waiting for the start's verdict
    assert unprepared.proposer == "inductor" and derivations.asked == ["a", "b"]


def test_a_producer_cancelled_while_it_waits_leaves_the_derivation_running(derivations):
    """A stopped producer (the run stopping, or its turn cancelled) must not cancel the derivation:
    the next proposal for that task takes it, derived once."""
    derivations.held = True

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([named("a")])
        waiting = asyncio.create_task(tuner.propose(named("a"), empty(), Lessons()))
        await settle(lambda: derivations.asked == ["a"])
        await spin()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        derivations.let("a")
        result = await tuner.propose(named("a"), empty(), Lessons())
        await tuner.aclose()
        return result

    result = asyncio.run(go())
    assert result.proposer == "inductor" and derivations.asked == ["a"] and derivations.cancelled == []


def test_aclose_cancels_the_derivations_in_flight_and_those_waiting(derivations):
    derivations.held = True
    names = [f"t{i}" for i in range(proposers.CAPTURE_SLOTS + 1)]

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([named(n) for n in names])
        await settle(lambda: len(derivations.asked) == proposers.CAPTURE_SLOTS)
        closing = asyncio.create_task(tuner.aclose())
        await settle(lambda: len(derivations.cancelled) == proposers.CAPTURE_SLOTS)  # not waited for
        await closing

    asyncio.run(go())
    # the last was never started: prepared beyond PREPARED_AHEAD, dropped from the queue
    assert sorted(derivations.cancelled) == names[:proposers.CAPTURE_SLOTS] == derivations.asked
    assert derivations.running == 0


def test_aclose_kills_the_child_of_a_derivation_in_flight(tmp_path, monkeypatch):
    """A run that ends while a start is being derived leaves no compiling child process behind."""
    pid_file = tmp_path / "pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    monkeypatch.setattr(inductor_start, "_child_command", lambda task, kind, **kw: [sys.executable, "-c", sleeper])

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([load_task(TINY)])
        while not pid_file.exists() or not pid_file.read_text():
            await asyncio.sleep(0.05)
        await tuner.aclose()

    asyncio.run(go())
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.parametrize("error", [OSError("[Errno 24] Too many open files"),
                                   ValueError("Expecting value: line 1 column 1 (char 0)"),
                                   SyntaxError("invalid syntax")])
def test_a_derivation_that_cannot_run_is_a_start_that_is_not_there(monkeypatch, error):
    """The child not starting, or a reply that cannot be read, is said as the reason; the run goes on."""
    from kernforge.loop import inductor_start

    async def failing(command, timeout_s, hold=None):
        raise error

    monkeypatch.setattr(inductor_start, "_child_reply", failing)

    async def go():
        tuner = OfflineTuner()
        tuner.derive_ahead([named("a")])
        result = await tuner.propose(named("a"), empty(), Lessons())
        await tuner.aclose()
        return result

    result = asyncio.run(go())
    assert isinstance(result, NoProposal) and result.kind == "nothing_to_tune"
    assert f"no TorchInductor start ({type(error).__name__}: {str(error).rstrip('.')})" in result.reason


def seed_rejected(task) -> Population:
    pop = empty()
    pop.set_seed(HONEST)
    pop.add(Member(HONEST, Rejected(Status.CRASHED, "the candidate's process crashed: SIGSEGV"), attempt_id=1))
    return pop


def seed_unjudged(task) -> Population:
    pop = empty()
    pop.set_seed(HONEST)
    return pop


def accepted(task) -> Population:
    pop = empty()
    pop.add(Member(HONEST, Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter",
                                                        time_us=900.0),)), attempt_id=1))
    return pop


def inductor_rejected(task) -> Population:
    """Its Inductor start judged and rejected (a resumed run): the start is derived again, and its
    archived verdict reused, so that ``propose`` says why there is nothing."""
    pop = empty()
    pop.add(Member(HONEST, Rejected(Status.INCORRECT, "output mismatch at index 3"), attempt_id=1))
    return pop


@pytest.mark.parametrize("task, population, needs", [
    (TINY, lambda task: empty(), True),
    (TINY, inductor_rejected, True),
    (TINY, seed_unjudged, False),
    (TINY, seed_rejected, False),
    (TINY, accepted, False),
    ("fp8_quant_per_group", lambda task: empty(), False),  # its seed runs on a GPU only: left out on the CPU
])
def test_only_a_task_with_nothing_to_tune_and_no_seed_to_blame_needs_a_start(derivations, task, population, needs):
    """``needs_start`` is what ``propose`` does: the Inductor start exactly when it says so."""
    task = load_task(task)
    pop = population(task)
    tuner = OfflineTuner()
    assert tuner.needs_start(task, pop) is needs
    result = asyncio.run(tuner.propose(task, pop, Lessons()))
    assert (getattr(result, "proposer", None) == "inductor") is needs
    assert derivations.asked == ([task.name] if needs else [])


def test_prepare_derives_ahead_only_the_starts_the_tasks_will_need(derivations):
    """The runner hands the tuner every open task with its population, in the order it will pick
    them: a task with a kernel to tune, or a seed still to judge, needs no start; the others' are
    derived ahead in that order."""
    async def go():
        tuner = OfflineTuner()
        tuner.prepare([(named("tuned"), accepted(None)), (named("first"), empty()), (named("seeded"), seed_unjudged(None)),
                       (named("second"), empty())])
        await settle(lambda: derivations.asked == ["first", "second"])
        await spin()
        await tuner.aclose()

    asyncio.run(go())
    assert derivations.asked == ["first", "second"]


def test_a_parent_whose_record_names_a_hidden_shape_is_left_out_and_the_run_goes_on(monkeypatch):
    """The prompt is refused where it names a hidden shape: first without lessons and
    inspirations, then without the parent (a fresh kernel is asked for, and the proposal names no
    parent). Before, a parent that still leaked ended the whole run."""
    from types import SimpleNamespace

    from kernforge.prompts.render import Parent, PromptLeak, render

    task = load_task("rms_norm")
    shown = []

    def refusing(task, hardware, *, parent=None, **kw):
        shown.append((parent is not None, bool(kw.get("lessons"))))
        if parent is not None:
            raise PromptLeak("names a hidden shape")
        return render(task, hardware, parent=parent, **kw)

    monkeypatch.setattr(proposers, "render", refusing)
    me = SimpleNamespace(hardware={}, device_kind="cpu")
    prompt, parent_shown = LLMProposer._render(me, task, Parent(HONEST, None), [], ["a lesson"], None)
    assert not parent_shown and shown == [(True, True), (True, False), (False, False)]
    assert HONEST.strip()[:80] not in prompt.user

    monkeypatch.setattr(proposers, "render", lambda *a, **k: (_ for _ in ()).throw(PromptLeak("the task itself")))
    with pytest.raises(LoopError, match="the task itself"):
        LLMProposer._render(me, task, None, [], [], None)


@pytest.mark.parametrize("outcomes, tries, proposer", [
    (["oom", "start"], 2, "inductor"),
    (["oom", "oom", "oom"], 3, None),
    (["exit"], 1, None),
], ids=["out of memory once, then a start", "out of memory every time", "another failure: not tried again"])
def test_a_capture_that_ran_out_of_gpu_memory_is_derived_again_later(monkeypatch, outcomes, tries, proposer):
    """A capture runs beside the verdicts, whose arena may hold the GPU for a moment: out of memory
    it is derived again, a little later, a few times; any other failure is said at once."""
    said = {"oom": inductor_start.NoStart("the Inductor capture exited with status 1: torch.OutOfMemoryError: CUDA out "
                                          "of memory. Tried to allocate 3.38 GiB"),
            "exit": inductor_start.NoStart("the Inductor capture exited with status 1: SyntaxError"),
            "start": FAKE_START}
    asked, slept = [], []

    async def derive(task, device_kind, hold=None):
        asked.append(task.name)
        return said[outcomes[len(asked) - 1]]

    async def nap(seconds):
        slept.append(seconds)

    monkeypatch.setattr(proposers, "derive_async", derive)
    monkeypatch.setattr(proposers.asyncio, "sleep", nap)

    async def go():
        tuner = OfflineTuner(device_kind="cuda")
        made = await tuner.propose(named("a"), empty(), Lessons())
        await tuner.aclose()
        return made

    made = asyncio.run(go())
    assert len(asked) == tries and slept == [proposers.START_MEMORY_WAIT_S] * (tries - 1)
    if proposer is not None:
        assert made.proposer == proposer
    else:
        assert isinstance(made, NoProposal) and made.kind == "nothing_to_tune"
        assert ("(3 tries, 20 s apart)" in made.reason) is (tries == 3)


@pytest.mark.parametrize("cls", [LLMProposer, OfflineTuner])
def test_both_proposers_are_what_the_runner_drives(cls):
    """The runner sees a ``Proposer`` only: each one has every member of it, with its parameters."""
    import inspect

    members = [n for n in vars(proposers.Proposer) if not n.startswith("_")] + ["kind"]
    for name in members:
        assert hasattr(cls, name), name
        want = getattr(proposers.Proposer, name, None)
        if inspect.isfunction(want):
            assert list(inspect.signature(getattr(cls, name)).parameters) == list(inspect.signature(want).parameters), name
