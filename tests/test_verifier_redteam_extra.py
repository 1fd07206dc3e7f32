"""The red-team cases of redteam_extra.py on the CPU (Triton interpreter): attacks judged with the
static screen on, a candidate that tries to reach the next verdict, a hang after a wrong answer,
and a flood of output aimed at the trusted side's disk."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import redteam_extra as X
from candidates import HONEST
from kernforge.loop.evaluate import open_judge
from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeOptions

# timer attacks are called cheats on a quiet host (conftest.quiet_host)
pytestmark = pytest.mark.usefixtures("quiet_host")

TASKS = Path(__file__).parent / "tasks"


def _describe(v) -> str:
    return f"{v.status.value} #{v.threat} [{getattr(v, 'check', None)}]: {v.reason}"


@pytest.fixture(scope="module")
def screened_judge(cpu_judge):
    return cpu_judge  # conftest's, shared with the other modules that only ask for verdicts


@pytest.fixture(scope="module")
def runtime_judge(cpu_runtime_judge):
    return cpu_runtime_judge


@pytest.mark.parametrize("case", X.SCREENED, ids=[c.name for c in X.SCREENED])
def test_screened_case_gets_its_verdict(screened_judge, case):
    verdict = screened_judge.verify(case.source, load_task(TASKS / "tiny_norm"))
    got = (verdict.status.value, verdict.threat)
    assert any(got[0] == status and (threat is None or got[1] == threat) for status, threat in case.expect), _describe(verdict)


def test_a_candidate_cannot_reach_the_next_verdict(runtime_judge):
    task = load_task(TASKS / "tiny_norm")
    first = runtime_judge.verify(X.OUTLIVES_ITS_VERDICT, task)
    assert not first.accepted
    for _ in range(2):  # the daemon would still be zeroing the shared arena now
        verdict = runtime_judge.verify(HONEST, task)
        assert verdict.accepted, _describe(verdict)


def test_nothing_a_candidate_leaves_in_the_arena_reaches_the_next(tmp_path):
    """The reference worker keeps its arena from one verdict to the next; every byte of it is
    zeroed before the next candidate gets it. Before that, a reader found what the writer had
    recorded there (every shape it was called at) and was right where it did."""
    task = load_task(TASKS / "tiny_norm")
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path), tasks=[task]) as judge:
        assert judge.verify(X.ARENA_WRITER, task).accepted
        verdict = judge.verify(X.ARENA_READER, task)
    assert verdict.status.value == "incorrect", _describe(verdict)


def test_what_a_candidate_says_at_a_hidden_shape_never_reaches_a_prompt(screened_judge):
    """It raises at the first shape it was not shown, spelling the shape in hex (a redaction of the
    sizes masks decimals): the judge marks the rejection, and the next prompt quotes none of it."""
    from kernforge.prompts import render
    from kernforge.verifier.verdict import SAW_HIDDEN

    task = load_task(TASKS / "tiny_norm")
    public = sorted({tuple(s.as_dict().values()) for s in task.shapes("cpu", hidden=False)})
    source = HONEST.replace("        return norm(x, w)", f"""        if tuple(x.shape) not in {public!r}:
            raise RuntimeError(f"unsupported size {{x.shape[0]:#x}}/{{x.shape[1]:#x}}")
        return norm(x, w)""")
    assert source != HONEST
    verdict = screened_judge.verify(source, task)
    assert verdict.status.value == "runtime_error" and verdict.evidence.get(SAW_HIDDEN) is True, _describe(verdict)
    spelled = verdict.reason.split("unsupported size ", 1)[1].split()[0]
    prompt = render.render(task, {}, device_kind="cpu", parent=render.Parent(source, verdict))
    assert spelled not in prompt.user and render.WITHHELD in prompt.user


def test_no_figure_a_prompt_shows_comes_after_a_hidden_shape(tmp_path):
    """The public shapes' times (here the interpreter's walls; on a GPU the timed batches) are
    taken before the first hidden shape reaches the worker. Before, a GPU verdict timed them
    after the hidden checks, and a candidate could wait there for as long as a hidden size said."""
    task = load_task(TASKS / "tiny_norm")
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path), tasks=[task]) as judge:
        steps, check, times = [], judge._check_all, judge._interpreter_times

        def checking(session, task, hidden, *args):
            steps.append("hidden checks" if hidden else "public checks")
            return check(session, task, hidden, *args)

        def timing(task, timed):
            steps.append("times of " + ("hidden" if any(h for _, h in timed) else "public") + " shapes")
            return times(task, timed)

        judge._check_all, judge._interpreter_times = checking, timing
        verdict = judge.verify(HONEST, task)
    assert verdict.accepted, _describe(verdict)
    assert steps == ["public checks", "times of public shapes", "hidden checks"]


def test_a_flag_raised_at_a_hidden_shape_is_for_people_only(tmp_path):
    """A just-out-of-tolerance element passes (one per million) and is flagged with the verdict:
    at a hidden shape, whether it is raised and its excess are the candidate's choice, and its text
    names the shape. It goes to ``hidden_flags`` (archive show, eval), never to a prompt's flags."""
    from kernforge.prompts import render

    big = tmp_path / "kb_relu_big.py"  # a hidden shape's output of a million elements or more
    big.write_text((TASKS / "kb_relu.py").read_text().replace("batch_size = 16", "batch_size = 64")
                   .replace("dim = 1000", "dim = 32768"))
    task = load_task(big)
    with open_judge("cpu", pool_size=1, options=JudgeOptions(cache_dir=tmp_path / "cache"), tasks=[task]) as judge:
        verdict = judge.verify(X.MARGINAL_AT_HIDDEN, task)
    assert verdict.accepted, _describe(verdict)
    assert verdict.hidden_flags and all("just out of tolerance" in f and "hidden shape" in f for f in verdict.hidden_flags)
    assert not any("tolerance" in f for f in verdict.flags)
    prompt = render.render(task, {}, device_kind="cpu", parent=render.Parent(X.MARGINAL_AT_HIDDEN, verdict))
    assert "just out of tolerance" not in prompt.user


@pytest.mark.parametrize("screened", [True, False], ids=["screen", "no_screen"])
def test_torch_ops_under_a_fake_definition_are_not_the_candidates(screened_judge, runtime_judge, screened):
    """A custom op the source defines is its own whatever its namespace; "defines" means a
    top-level torch.library call, never a function of its own named ``define``, code that does not
    run, or a torch namespace."""
    judge = screened_judge if screened else runtime_judge
    verdict = judge.verify(X.OWN_OP_ALIAS, load_task(TASKS / "tiny_norm"))
    expected = ("static_rejected", 16) if screened else ("cheat", 16)
    assert (verdict.status.value, verdict.threat) == expected, _describe(verdict)


@pytest.mark.parametrize("screened", [True, False], ids=["screen", "no_screen"])
def test_a_raw_thread_started_through_threadings_own_starter_is_seen(screened_judge, runtime_judge, screened):
    judge = screened_judge if screened else runtime_judge
    source = X.THREAD_PAST_THE_SCREEN if screened else X.RAW_THREAD_AT_IMPORT
    verdict = judge.verify(source, load_task(TASKS / "tiny_norm"))
    if screened:  # the computed attribute of something reached from threading
        assert verdict.status.value == "static_rejected" and "computed attribute" in verdict.reason, _describe(verdict)
    else:  # the start is recorded by every name threading and _thread reach a raw start by
        assert (verdict.status.value, verdict.threat) == ("cheat", 6), _describe(verdict)


def test_a_declared_encoding_is_refused_with_the_screen_off_too(runtime_judge):
    """Not a screen rule: the check that the text is what Python will run holds without it."""
    verdict = runtime_judge.verify(X.DECLARED_ENCODING, load_task(TASKS / "tiny_norm"))
    assert verdict.status.value == "compile_error" and "raw_unicode_escape" in verdict.reason, _describe(verdict)


@pytest.fixture(scope="module")
def starting_judge(tmp_path_factory):
    """A CPU judge whose candidates' workers may start programs, as a GPU judge's may (nvcc and
    ptxas need to): what the parent's look at the process tree must catch there."""
    from kernforge.loop import evaluate

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "WorkerSpec", lambda **kw: WorkerSpec(**{**kw, "fork": True}))
        options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), static_screen=False)
        with open_judge("cpu", pool_size=1, options=options) as judge:
            yield judge


@pytest.mark.parametrize("source", [X.PROGRAM_AT_IMPORT, X.ZOMBIE_LEADER_AT_IMPORT], ids=["program", "zombie_leader"])
def test_a_helper_program_started_at_import_is_seen_from_outside(starting_judge, source):
    """A program started while the module is imported, computing every output from what forward
    sends it down a pipe: no trace of the worker covers it. The parent sees it in the worker's
    process tree once the module has loaded, also when its main thread has gone and it shows as
    a zombie while a thread of it works."""
    verdict = starting_judge.verify(source, load_task(TASKS / "tiny_norm"))
    assert (verdict.status.value, verdict.threat) == ("sandbox_violation", 21), _describe(verdict)
    assert "after its module loaded" in verdict.reason
    assert ("main thread gone" if source is X.ZOMBIE_LEADER_AT_IMPORT else "-c") in verdict.reason


def test_a_cpu_judges_worker_starts_no_program_at_all(runtime_judge):
    """Where nothing is built (the CPU), a worker's seccomp filter refuses every new process: the
    helper program is never started, and the import fails saying so."""
    verdict = runtime_judge.verify(X.PROGRAM_AT_IMPORT, load_task(TASKS / "tiny_norm"))
    assert verdict.status.value == "compile_error" and "Operation not permitted" in verdict.reason, _describe(verdict)


@pytest.mark.parametrize("name", sorted(X.SABOTAGE))
def test_sabotage_of_shared_state_gets_a_verdict_and_the_judge_goes_on(tmp_path, name):
    """A candidate that shrinks the shared arena, or leaves a tree too deep for a recursive
    removal, computes honestly: before the fix, the first made the reference worker die of SIGBUS
    and the judge raise (the run set the whole task aside), the second made the worker's cleanup
    raise RecursionError out of the verdict and out of every later judge's start. Now each gets its
    verdict, the judge judges the next candidate, and a new judge starts beside the first's leavings."""
    task = load_task(TASKS / "tiny_norm")
    options = JudgeOptions(cache_dir=tmp_path, static_screen=False)
    with open_judge("cpu", pool_size=1, options=options) as judge:
        verdict = judge.verify(X.SABOTAGE[name], task)
        assert verdict.accepted, _describe(verdict)  # the kernel is honest; what it broke is the judge's to withstand
        assert judge.verify(HONEST, task).accepted
        with open_judge("cpu", pool_size=1, options=options) as other:
            assert other.verify(HONEST, task).accepted


def test_a_wrong_answer_is_not_held_up_by_the_call_sent_ahead(tmp_path):
    """Call limits of 10 s (first call at a shape) and 5 s against the session's 300 s: the
    verdict comes after the hanging call's own limit, never the session's."""
    options = JudgeOptions(cache_dir=tmp_path, static_screen=False, first_call_timeout_cpu_s=10.0, call_timeout_min_s=5.0)
    with open_judge("cpu", pool_size=1, options=options) as judge:
        started = time.monotonic()
        verdict = judge.verify(X.WRONG_THEN_HANGS, load_task(TASKS / "tiny_norm"))
        took = time.monotonic() - started
    assert verdict.status.value == "incorrect", _describe(verdict)
    assert took < X.WRONG_THEN_HANGS_LIMIT_S, f"{took:.0f} s"


def test_a_flood_of_output_stays_off_the_trusted_disk():
    """A candidate's stdout goes to a file on the trusted side's disk: what it may put there must be
    bounded by far less than the judge's default file-size limit (4 GiB per stream)."""
    tests = Path(__file__).resolve().parent
    backend = ProcessBackend(WorkerSpec(env={"PYTHONPATH": str(tests)}), pool_size=1)
    try:
        limits = JudgeOptions().limits
        session = backend.session("sandbox_jobs.hostile:flood", {"megabytes": 64}, Limits(**{**limits.to_dict(), "wall_seconds": 120}))
        try:
            assert session.recv(120) == {"flooded": True}
            on_disk = sum(p.stat().st_size for p in session.worker.private.rglob("*") if p.is_file())
            kept = session.worker.tail("stdout", 1 << 30)
        finally:
            session.close()
    finally:
        backend.close()
    assert on_disk <= 16 * limits.output_bytes + (1 << 20), f"{on_disk >> 20} MiB of the candidate's output on the trusted disk"
    assert "earlier bytes dropped" in kept and len(kept) < 2 << 20  # the newest output is kept, in memory, bounded
