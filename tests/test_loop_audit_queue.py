"""When a run audits its would-be bests (loop/audit_queue.py): which kernels wait, for what, and
what an audit's outcome does to the task's population."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kernforge.loop.audit_queue import AUDIT_BUSY_TRIES, AUDIT_GRACE_S, AuditQueue, audits_may_run
from kernforge.verifier.audit import Audit
from kernforge.verifier.judge import JudgeError
from kernforge.verifier.judge_errors import GpuMemoryHeld

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from loop_helpers import audited_kernel as kernel, task_state as state  # noqa: E402


def _queue(states, *, at_once=False, time_left=None, outcome=None):
    """A queue over ``states`` (a task awaits its first verdict while its stats have none), its
    audits listed (attempt ids, in order) and passed unless ``outcome(member)`` says otherwise;
    (queue, audited, notes)."""
    audited, notes = [], []

    async def audit(index, st, member):
        audited.append(member.attempt_id)
        if outcome is not None:
            return outcome(member)
        return Audit(passed=True, reason="", recorded_us=20.0, measured_us=20.0)

    def first_verdicts_pending(but):
        return any(s is not but and s.stats.first_verdict_s is None for s in states)

    queue = AuditQueue(audit, at_once=lambda: at_once, first_verdicts_pending=first_verdicts_pending,
                       time_left_s=lambda: time_left, note=notes.append)
    return queue, audited, notes


def _waiting(st):
    return (st, st.population.contenders()[0])


def _go(queue, *, at_end=False, carry_on=lambda: True):
    asyncio.run(queue.go(0, carry_on, at_end=at_end))


def _three_tasks():
    """"judged" and "newer", each an audited kernel (1, 3) and a faster one not yet audited (2, 4),
    and a task with no verdict yet."""
    return (state("judged", kernel(1, 50.0, True), kernel(2, 20.0)), state("newer", kernel(3, 50.0, True), kernel(4, 20.0)),
            state("never judged"))


def test_the_audits_share_of_the_device_time():
    """An audit may start while audits have had at most their first minute, or at most a third of
    the device time spent verifying and auditing."""
    assert audits_may_run(AUDIT_GRACE_S, 0.0)
    assert audits_may_run(1000.0, 2000.0)
    assert not audits_may_run(1000.0, 1999.0)


def test_a_passed_audit_makes_the_best_a_failed_one_demotes_and_a_judge_failure_is_said():
    """A run stopped between a verdict and its audit (a benchmark call cut by its time limit) left a
    kernel fitter than the best unaudited: the resumed run audits it, and a passed audit makes it
    the best; a failed one demotes it; a judge failure is said and the next is audited."""
    a = state("a", kernel(1, 50.0, True), kernel(2, 20.0))
    b = state("b", kernel(3, 50.0, True), kernel(4, 20.0))
    c = state("c", kernel(5, 50.0, True), kernel(6, 20.0))

    def outcome(member):
        if member.attempt_id == 6:
            raise JudgeError("the reference worker failed on arena: OutOfMemoryError")
        return Audit(passed=member.attempt_id == 2, reason="" if member.attempt_id == 2 else "slower by 30%",
                     recorded_us=20.0, measured_us=20.0 if member.attempt_id == 2 else 26.0)

    queue, audited, notes = _queue((a, b, c), outcome=outcome)
    for st in (a, b, c):
        queue.take_leftovers(st, st.population.contenders(), set())
    assert any("1 archived kernel(s) fitter than the audited best have no audit" in n for n in notes)
    _go(queue)  # no task awaits a first verdict, no audit was made yet
    assert audited == [2, 4, 6] and not queue.pending()
    assert a.population.best.attempt_id == 2 and a.stats.best_attempt == 2
    assert b.population.best.attempt_id == 3 and [m.attempt_id for m in b.population.demoted] == [4]
    assert c.population.best.attempt_id == 5 and c.population.contenders()[0].attempt_id == 6
    assert any("attempt 6 could not be audited" in n for n in notes)
    assert any("attempt 4, left unaudited, audited: failed (slower by 30%)" in n for n in notes)
    assert any("attempt 2, left unaudited, audited: passed, the new best" in n for n in notes)


@pytest.mark.parametrize("busy_tries", [1, AUDIT_BUSY_TRIES])
def test_an_audit_nobody_could_judge_goes_again_after_a_verdict_up_to_its_tries(busy_tries):
    """Two lanes on an H100: another lane's reference worker held the GPU's memory and an audit ran
    out of it (GpuMemoryHeld: nobody's verdict). The kernel was dropped, and a run's best could end
    the night unaudited. It waits until a verdict has been made since (the GPU is as busy at
    once), then is audited; an audit that stays unjudged is given up after its tries."""
    st = state("a", kernel(1, 50.0, True), kernel(2, 20.0))
    st.stats.first_verdict_s = 1.0

    def outcome(member):
        if len(audited) <= busy_tries:
            raise GpuMemoryHeld("the GPU's memory was held by other processes (40% of it free): out of memory")
        return Audit(passed=True, reason="", recorded_us=20.0, measured_us=20.0)

    queue, audited, notes = _queue((st,), outcome=outcome)
    queue.defer(*_waiting(st))
    for turn in range(AUDIT_BUSY_TRIES + 1):
        _go(queue)
        assert len(audited) == min(turn + 1, busy_tries + 1, AUDIT_BUSY_TRIES), "one try after each verdict"
        _go(queue)
        assert len(audited) == min(turn + 1, busy_tries + 1, AUDIT_BUSY_TRIES), "no verdict since: no try"
        queue.verify_s += 2.0  # a verdict
    assert not queue.pending()
    if busy_tries < AUDIT_BUSY_TRIES:
        assert st.population.best.attempt_id == 2
        assert any(f"attempt 2 could not be audited, tried again later (1 of {AUDIT_BUSY_TRIES} tries)" in n for n in notes)
        assert any("attempt 2, its audit deferred, audited: passed, the new best" in n for n in notes)
    else:
        assert st.population.best.attempt_id == 1
        assert any(f"attempt 2 could not be audited, given up after {AUDIT_BUSY_TRIES} tries" in n for n in notes)


def test_at_the_runs_end_an_audit_nobody_could_judge_goes_again_at_once():
    """Nothing else is left to judge: its tries follow each other."""
    st = state("a", kernel(1, 50.0, True), kernel(2, 20.0))

    def outcome(member):
        if len(audited) < 3:  # its first two tries
            raise GpuMemoryHeld("the GPU's memory was held by other processes (40% of it free): out of memory")
        return Audit(passed=True, reason="", recorded_us=20.0, measured_us=20.0)

    queue, audited, notes = _queue((st,), outcome=outcome)
    queue.defer(*_waiting(st))
    _go(queue, at_end=True)
    assert audited == [2, 2, 2] and not queue.pending() and st.population.best.attempt_id == 2


def test_a_kernel_a_faster_audited_best_overtook_is_not_audited():
    """It could not lead any more: its audit would be device time for nothing."""
    st = state("a", kernel(1, 50.0, True), kernel(2, 20.0))
    st.stats.first_verdict_s = 1.0
    queue, audited, _ = _queue((st,))
    queue.defer(*_waiting(st))
    st.population.add(kernel(3, 10.0, True))  # audited meanwhile, and faster
    _go(queue)
    assert audited == [] and not queue.pending() and st.population.best.attempt_id == 3


@pytest.mark.parametrize("fittest_passes", [True, False])
def test_a_tasks_fittest_waiting_kernel_is_audited_first_and_passed_spares_the_slower_theirs(fittest_passes):
    """Several of a task's would-be bests wait (audits had their share): the fittest goes first,
    whatever its place in the queue; passed, it is the best and the slower ones cannot lead (no
    audit); failed, the next fittest is audited. Tasks keep their order (the longest waiting first)."""
    a = state("a", kernel(1, 50.0, True), kernel(2, 30.0), kernel(3, 10.0), kernel(4, 20.0))
    b = state("b", kernel(5, 50.0, True), kernel(6, 20.0))
    for st in (a, b):
        st.stats.first_verdict_s = 1.0

    def outcome(member):
        passed = fittest_passes or member.attempt_id != 3
        return Audit(passed=passed, reason="" if passed else "slower by 30%", recorded_us=10.0, measured_us=10.0 if passed else 13.0)

    queue, audited, _ = _queue((a, b), outcome=outcome)
    for n in (2, 6, 3, 4):  # a's three in the order they came, b's between them
        st = a if n != 6 else b
        queue.defer(st, next(m for m in st.population.contenders() if m.attempt_id == n))
    _go(queue)
    assert audited == ([3, 6] if fittest_passes else [3, 4, 6]) and not queue.pending()
    assert a.population.best.attempt_id == (3 if fittest_passes else 4)


def test_kernels_left_unaudited_do_not_wait_for_other_tasks_first_verdicts():
    """A resumed KernelBench run of 43 problems: problems never judged yet (or running out of memory
    every time) must not hold back the audits an earlier slice left, or the benchmark's metrics,
    which count audited kernels only, stay empty slice after slice. A new would-be best's audit
    still waits for them; both wait once audits have had their share of the device time."""
    judged, newer, never = states = _three_tasks()
    queue, audited, _ = _queue(states)
    queue.leftover.append(_waiting(judged))
    queue.defer(*_waiting(newer))
    assert queue.waits(but=newer), "a task awaits its first verdict"
    _go(queue)
    assert audited == [2] and queue.deferred, "the leftover audited; the new one waits for the first verdict"
    queue.leftover, queue.deferred = [_waiting(newer)], []
    queue.audit_s, queue.verify_s = AUDIT_GRACE_S + 1.0, 1.0  # audits took their share and more
    _go(queue)
    assert audited == [2] and queue.leftover, "past their share, leftovers wait too"
    _go(queue, at_end=True)
    assert audited == [2, 4] and not queue.pending(), "the run's end audits whatever waits"


def test_a_would_be_best_waits_only_while_a_first_verdict_is_pending_or_audits_had_their_share():
    judged, newer, never = states = _three_tasks()
    queue, audited, _ = _queue(states)
    newer.stats.first_verdict_s = 1.0
    assert queue.waits(but=judged), "a task awaits its first verdict"
    never.stats.first_verdict_s = 1.0
    assert not queue.waits(but=judged)
    queue.audit_s, queue.verify_s = AUDIT_GRACE_S + 1.0, 1.0
    assert queue.waits(but=judged)


@pytest.mark.parametrize("at_once", [False, True])
def test_a_benchmark_run_audits_every_would_be_best_as_it_comes(at_once):
    """KernelBench's metrics count audited kernels only, and a benchmark's budget per problem is
    fixed: its audits wait neither for other problems' first verdicts nor for their share of the
    device time, so a run cut short (the H100's slices of 43 problems) counts every problem it
    judged. A plain run's audits still wait."""
    judged, newer, never = states = _three_tasks()
    queue, audited, _ = _queue(states, at_once=at_once)
    queue.leftover.append(_waiting(judged))
    queue.defer(*_waiting(newer))
    queue.audit_s, queue.verify_s = AUDIT_GRACE_S + 1.0, 1.0  # audits took their share and more
    _go(queue)
    assert audited == ([2, 4] if at_once else [])
    assert queue.waits() == (not at_once)


def test_a_benchmark_audits_again_what_an_earlier_judge_passed_only_after_every_first_verdict():
    """A benchmark resumed after the judge changed: the kernels an earlier judge's audit passed
    count already, so the installed judge audits them again only once every problem has had its
    first verdict (or time runs short); a kernel never audited goes at once."""
    judged, again, fresh = states = _three_tasks()
    queue, audited, notes = _queue(states, at_once=True)
    queue.take_leftovers(judged, judged.population.contenders(), set())
    queue.take_leftovers(again, again.population.contenders(), {4})
    assert any("1 archived kernel(s) passed an earlier judge's audit" in n for n in notes)
    _go(queue)
    assert audited == [2] and queue.reaudit, "the never-audited kernel at once; the counted one waits"
    for st in states:  # every problem has had its verdict in this session
        st.stats.first_verdict_s = 1.0
    _go(queue)
    assert audited == [2, 4] and not queue.pending()


def test_outside_a_benchmark_an_earlier_judges_pass_is_no_reason_to_wait_longer():
    """A plain run re-audits its bests first (its search is centred on them): every kernel left
    unaudited by this judge is a leftover, whatever an earlier judge said."""
    judged, newer, never = states = _three_tasks()
    queue, _, _ = _queue(states)
    queue.take_leftovers(newer, newer.population.contenders(), {4})
    assert [m.attempt_id for _, m in queue.leftover] == [4] and not queue.reaudit


def test_waiting_audits_go_when_the_time_budget_would_end_before_them():
    """Audits wait for every task's first verdict, but not past the time budget: a run cut by it
    would leave its bests unaudited (a benchmark's problems correct but untimed). Each waiting
    audit is reckoned at 1.5 times its verdict's seconds."""
    from kernforge.verifier.verdict import Accepted

    judged, newer, never = _three_tasks()
    member = _waiting(newer)[1]
    slow = replace(member, verdict=Accepted(shapes=member.verdict.shapes, environment={"verify_seconds": 100.0}))
    for left, goes in ((151.0, False), (149.0, True), (None, False)):
        queue, audited, _ = _queue((judged, newer, never), time_left=left)
        queue.defer(newer, slow)
        assert queue.due() == goes, left
        _go(queue)
        assert audited == ([4] if goes else []), left


def test_the_audits_reserve_is_what_this_run_s_audits_cost_against_their_verdicts():
    """The budget kept for the waiting audits follows what the run's audits took: the H100's
    built-in tasks' audits took 2.2 times their verdicts at the median, more than the 1.5 reckoned
    before any was made; a reserve never goes below that floor."""
    from kernforge.loop.audit_queue import AUDIT_RESERVE
    from kernforge.verifier.verdict import Accepted

    judged, newer, never = _three_tasks()
    member = _waiting(newer)[1]

    def took(seconds):
        return replace(member, verdict=Accepted(shapes=member.verdict.shapes, environment={"verify_seconds": seconds}))

    queue, _, _ = _queue((judged, newer, never), time_left=180.0)
    assert queue.reserve() == AUDIT_RESERVE
    # fp8_quant_per_token's and merge_attn_states' audits on the H100: 20.2 s and 19.5 s after verdicts of 9.7 s and 7.6 s
    queue.count(took(9.72), 20.22)
    queue.count(took(7.60), 19.52)
    assert queue.reserve() == pytest.approx((20.22 + 19.52) / (9.72 + 7.60))
    queue.defer(newer, took(80.0))
    assert queue.due(), "80 s of verdict is about 184 s of audit: 180 s left must start it (1.5 times, 120 s, would wait)"
    cheap, _, _ = _queue((judged, newer, never), time_left=200.0)
    cheap.count(took(10.0), 5.0)  # an audit cheaper than its verdict: the floor holds
    assert cheap.reserve() == AUDIT_RESERVE


def test_nothing_goes_once_the_run_says_stop():
    judged, newer, never = states = _three_tasks()
    queue, audited, _ = _queue(states, at_once=True)
    queue.leftover.append(_waiting(judged))
    _go(queue, carry_on=lambda: False)
    _go(queue, at_end=True, carry_on=lambda: False)
    assert audited == [] and queue.leftover
