"""When a run audits its would-be bests: the kernels waiting for an audit, and the rule for each.

A would-be best (search.py ``needs_audit``) is audited before it counts: judged again in a fresh
worker on fresh inputs (runner.py makes and records the audit). An audit costs three to five
verdicts of device time on the H200 (six to twenty on KernelBench's problems), so when it goes
is a scheduling decision, and this module makes it:

* **A new would-be best** is audited at once, unless another task still awaits its first verdict
  of this session, or audits have had more than ``AUDIT_SHARE`` of the session's device time
  (after ``AUDIT_GRACE_S``): then it waits (``deferred``). First verdicts come first (a seed's
  audit per task held the later tasks back by minutes), and a run of would-be bests cannot hold
  every new verdict back.
* **Kernels an earlier session left unaudited** (``leftover``: a run stopped between a verdict
  and its audit) wait only for the audits' share, ahead of the new ones: their tasks had their
  verdicts before.
* **A benchmark run audits as it goes** (``at_once``): its metrics count audited kernels only and
  its budget per problem is fixed, so waiting reorders nothing but what a run cut short shows.
  Those of its leftovers that an earlier judge's audit passed (``reaudit``: counted already) are
  audited by the installed judge after every problem's first verdict.
* **Time budget.** Once the budget left would not cover the waiting audits (their verdicts'
  seconds times ``reserve()``: what this run's audits have cost against their verdicts, at least
  ``AUDIT_RESERVE``), they all go, so a run cut by its budget does not end with its bests
  unaudited; the run's end audits whatever still waits.

One that a faster audited best has overtaken meanwhile is not audited (it could not lead).
Passed, it may be the new best (``Population.settle``); failed, it is demoted.

* **An audit nobody could judge** (GpuBusy: another process kept the GPU busy, or held its memory,
  or the worker's harness stalled) is no verdict on the kernel: it waits with the deferred ones
  once a verdict has been made since (the GPU may be as busy at once), or at the run's end, and
  is tried ``AUDIT_BUSY_TRIES`` times in all. Before, it was said and dropped, and a run's best
  kernel could end the night unaudited, so not a best.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Awaitable, Callable, Iterable, Mapping

from kernforge.verifier.audit import Audit
from kernforge.verifier.judge import GpuBusy, JudgeError

from .plan import TaskState
from .search import Member

#: the time budget kept for the audits that wait for every task's first verdict: at least this many
#: times the seconds their verdicts took (an audit judges the kernel again, in a fresh worker), more
#: where this run's audits cost more (``AuditQueue.reserve``: on an H100 the built-in tasks' audits
#: took 1.3-2.8 times their verdicts, 2.2 at the median, and a 5-minute run's six audits overran
#: the 1.5 reserved for them by 26 s)
AUDIT_RESERVE = 1.5
#: while new verdicts are being made, audits take at most this share of the session's device time;
#: the rest wait. An audit costs three to five verdicts on the H200 (it times the hidden shapes too,
#: in a fresh worker, and profiles): audited as they came, the would-be bests of a run's first
#: minutes, or the 13 kernels a stopped run had left, held every new verdict back for up to ten minutes
AUDIT_SHARE = 1 / 3
#: ...once they have had this many seconds (a run's first audit or two go as they come)
AUDIT_GRACE_S = 60.0

#: how many times an audit that nobody could judge (GpuBusy) is tried in all
AUDIT_BUSY_TRIES = 3

Waiting = tuple[TaskState, Member]
#: audit one kernel on a device lane and record it: the audit, or None when none could be made
AuditOne = Callable[[int, TaskState, Member], Awaitable[Audit | None]]


def audits_may_run(audit_s: float, verify_s: float) -> bool:
    """Whether another audit may start now: audits so far had at most ``AUDIT_GRACE_S`` seconds,
    or at most ``AUDIT_SHARE`` of the device time spent verifying and auditing (an audit that
    starts may take it over: the next one waits)."""
    return audit_s <= AUDIT_GRACE_S or audit_s <= AUDIT_SHARE * (audit_s + verify_s)


def verdict_seconds(member: Member) -> float:
    """How long ``member``'s verdict took, as the judge said (0 where it did not)."""
    env = member.verdict.environment if member.verdict is not None else {}
    seconds = env.get("verify_seconds") if isinstance(env, Mapping) else None
    return float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else 0.0


class AuditQueue:
    """The kernels of a run that wait for an audit, and when each may go.

    ``audit`` makes and records one audit; ``first_verdicts_pending(but)`` says whether an open
    task other than ``but`` has had no verdict yet this session; ``time_left_s()`` is the time
    budget left (None: no time budget); ``at_once()`` whether this is a benchmark run."""

    def __init__(self, audit: AuditOne, *, at_once: Callable[[], bool],
                 first_verdicts_pending: Callable[[TaskState | None], bool],
                 time_left_s: Callable[[], float | None], note: Callable[[str], None]) -> None:
        self._audit = audit
        self._at_once = at_once
        self._first_verdicts_pending = first_verdicts_pending
        self._time_left_s = time_left_s
        self._note = note
        #: kernels an earlier session of the run left unaudited, fitter than their task's best
        self.leftover: list[Waiting] = []
        #: in a benchmark run, those of them an earlier judge's audit passed (counted already)
        self.reaudit: list[Waiting] = []
        #: would-be bests of this session whose audits wait (``waits``)
        self.deferred: list[Waiting] = []
        #: those whose audit nobody could judge (``retry``): deferred again at the next turn
        self.again: list[Waiting] = []
        #: tries so far of each such audit, by attempt id; ``verify_s`` at the last such failure
        self._busy_tries: dict[int | None, int] = {}
        self._busy_at_verify_s = 0.0
        #: device seconds this session spent auditing, and verifying (``AUDIT_SHARE``)
        self.audit_s = 0.0
        self.verify_s = 0.0
        #: the seconds the audited kernels' own verdicts took (``reserve``)
        self.audited_verdicts_s = 0.0

    # ---- what waits ----------------------------------------------------------------------------
    def take_leftovers(self, state: TaskState, members: Iterable[Member], passed_before: set[int]) -> None:
        """Kernels of ``state`` an earlier session left unaudited; in a benchmark run, those in
        ``passed_before`` (an earlier judge's audit passed them) wait for every first verdict."""
        members = list(members)
        again = {m.attempt_id for m in members if m.attempt_id in passed_before} if self._at_once() else set()
        self.leftover += [(state, m) for m in members if m.attempt_id not in again]
        self.reaudit += [(state, m) for m in members if m.attempt_id in again]
        name = state.task.name
        if len(again) < len(members):
            self._note(f"[{name}] {len(members) - len(again)} archived kernel(s) fitter than the audited best have no "
                       "audit (a stopped run left them): audited as the run goes, before the new ones")
        if again:
            self._note(f"[{name}] {len(again)} archived kernel(s) passed an earlier judge's audit (the benchmark counts "
                       "it): audited again by this judge after every problem's first verdict")

    def defer(self, state: TaskState, member: Member) -> None:
        """A would-be best whose audit waits (``waits``)."""
        self.deferred.append((state, member))

    def retry(self, state: TaskState, member: Member, error: GpuBusy) -> None:
        """``member``'s audit could not be judged (``error``): tried again at the next turn, after
        the verdict in flight, up to ``AUDIT_BUSY_TRIES`` tries in all; the run is told either way."""
        tries = self._busy_tries[member.attempt_id] = self._busy_tries.get(member.attempt_id, 0) + 1
        left = AUDIT_BUSY_TRIES - tries
        if left > 0:
            self.again.append((state, member))
            self._busy_at_verify_s = self.verify_s
        then = f"tried again later ({tries} of {AUDIT_BUSY_TRIES} tries)" if left > 0 else \
            f"given up after {AUDIT_BUSY_TRIES} tries: not a best this run"
        self._note(f"[{state.task.name}] attempt {member.attempt_id} could not be audited, {then}: {error}"[:600])

    def pending(self) -> bool:
        return bool(self.leftover or self.deferred or self.reaudit or self.again)

    # ---- when ----------------------------------------------------------------------------------
    def waits(self, but: TaskState | None = None) -> bool:
        """A new would-be best's audit waits now: another task than ``but`` awaits its first
        verdict of this session, or audits have had their share of the device time. Never in a
        benchmark run."""
        if self._at_once():
            return False
        return self._first_verdicts_pending(but) or not audits_may_run(self.audit_s, self.verify_s)

    def count(self, member: Member, seconds: float) -> None:
        """An audit of ``member`` took ``seconds`` of device time."""
        self.audit_s += seconds
        self.audited_verdicts_s += verdict_seconds(member)

    def reserve(self) -> float:
        """How many times its verdict's seconds a waiting audit is reckoned to take: what this
        session's audits took against their verdicts, at least ``AUDIT_RESERVE``."""
        if self.audited_verdicts_s <= 0:
            return AUDIT_RESERVE
        return max(AUDIT_RESERVE, self.audit_s / self.audited_verdicts_s)

    def due(self) -> bool:
        """The time budget would run out before the waiting audits were made, each ``reserve()``
        times as long as its verdict took: they start now, first verdicts or not."""
        left = self._time_left_s()
        waiting = self.leftover + self.deferred + self.reaudit + self.again
        if left is None or not waiting:
            return False
        return left <= self.reserve() * sum(verdict_seconds(member) for _, member in waiting)

    async def go(self, index: int, carry_on: Callable[[], bool], *, at_end: bool = False) -> None:
        """Audit on lane ``index`` what may go now, while ``carry_on()``: the leftovers, then the
        deferred would-be bests, then a benchmark's kernels to audit again. ``at_end``: the run
        has nothing more to judge, so everything goes."""
        def leftover_go() -> bool:  # their tasks had verdicts in an earlier session: no first verdict waits on them
            return at_end or self._at_once() or audits_may_run(self.audit_s, self.verify_s) or self.due()

        def deferred_go() -> bool:
            return at_end or not self.waits() or self.due()

        def reaudit_go() -> bool:  # counted already: after every problem's first verdict, or when time is short
            return at_end or not self._first_verdicts_pending(None) or self.due()

        while True:
            if at_end or self.verify_s > self._busy_at_verify_s:  # a verdict since, or nothing else to do
                self.deferred += self.again  # not judged at their last turn: tried again from this one on
                self.again = []
            for waiting, why, may in ((self.leftover, "left unaudited", leftover_go),
                                      (self.deferred, "its audit deferred", deferred_go),
                                      (self.reaudit, "audited by an earlier judge", reaudit_go)):
                await self._drain(index, waiting, why, lambda may=may: carry_on() and may())
            if not (at_end and self.again and carry_on()):
                return

    async def _drain(self, index: int, waiting: list[Waiting], why: str, go_on: Callable[[], bool]) -> None:
        """Audit the kernels in ``waiting`` (judged, recorded, in their populations, not yet audited)
        while ``go_on()``, the task that has waited longest first and its fittest kernel first: a
        passed audit may make one the best (``Population.settle``) and then the task's slower ones
        cannot lead and need none; a failed one demotes it, and the next fittest is audited; a
        judge failure is said, the next goes on."""
        while waiting and go_on():
            state, member = waiting.pop(_fittest_of_the_first_task(waiting))
            if member.code not in {m.code for m in state.population.contenders()}:
                continue  # a faster kernel was confirmed meanwhile: this one cannot lead, no audit
            try:
                audit = await self._audit(index, state, member)
            except GpuBusy as error:  # nobody's verdict: its next turn
                self.retry(state, member, error)
                continue
            except JudgeError as error:
                self._note(f"[{state.task.name}] attempt {member.attempt_id} could not be audited: {error}"[:600])
                continue
            if audit is None:
                continue
            best = state.population.settle(replace(member, audit_passed=audit.passed))
            if best:
                state.note_best()
            outcome = ("passed, the new best" if best else "passed") if audit.passed else f"failed ({audit.reason[:200]})"
            self._note(f"[{state.task.name}] attempt {member.attempt_id}, {why}, audited: {outcome}")


def _fittest_of_the_first_task(waiting: list[Waiting]) -> int:
    """The index in ``waiting`` of the fittest kernel of the task whose kernel waited longest (the
    first): audited first, it may spare the task's others their audits."""
    task = waiting[0][0]
    mine = [i for i, (state, _) in enumerate(waiting) if state is task]
    return max(mine, key=lambda i: waiting[i][1].fitness or ())
