"""``kernforge run``: the asyncio pipeline that asks for kernels, judges them and archives them.

::

    producers (LLM requests in flight, or the offline tuner)       one consumer per device
      pick a task with budget left ─ propose ─┐                ┌─ content lookup / verify ─ record
      ...                                      ├─ queue (1/dev) ┤   (judge.verify in the device's
      pick a task ... propose ────────────────┘                └─   own thread; one at a time)

* **Devices** (devices.py): one judge per device, one verification at a time each, in a thread of
  its own, so the event loop keeps LLM requests in flight meanwhile. The queue holds at most one
  proposal per device: enough that a device never waits for the next candidate when the proposer
  is fast, few enough that proposals are made from fresh feedback.
* **Every attempt is archived** in one transaction with its prompt, response, code, tokens, cost,
  parent and verdict (recorder.py, in the archive's own thread). The same normalised code for the
  same task in the same environment is judged once: a later proposal of it (archived, or being
  judged right now by another device) is recorded as a reuse of the first verdict.
* **A would-be best is audited** before it counts (search.py ``needs_audit``): accepted with GPU
  times and fitter than the task's best by more than the judge's noise (a near-tie is neither
  audited nor the best), it is judged again on the same device, in a fresh worker
  on fresh inputs (``Devices.audit``, device time), after its attempt is recorded; the audit is
  recorded in a transaction of its own (``Archive.record_audit``). When it goes is decided by
  ``AuditQueue`` (audit_queue.py): at once, or after every task's first verdict and within the
  audits' share of the device time, and at once in a benchmark run. Passed, it is the new best;
  failed, it is demoted (an accepted attempt, never the best) and the display says why. A run
  stopped between the two leaves an attempt without an audit: simply not a best (the next
  session of the run audits it, as does ``kernforge archive audit``). Interpreter verdicts and
  rejections are never audited.
* **Stopping.** Budgets (budget.py), every task done (attempts used, or nothing left to tune), a
  fatal LLM error, or Ctrl-C. The first Ctrl-C (SIGINT) stops asking: in-flight LLM requests
  are cancelled, the candidates already proposed are judged and recorded. A second Ctrl-C, or
  SIGTERM, abandons the verifications in flight (never recorded half-way). Either way the run
  is marked ``interrupted``. The time budget is a hard stop: once it is spent nothing new is
  judged (a verification under way finishes; queued proposals are left, and counted). A run
  killed outright (SIGKILL, a power cut) stays ``running``; ``--resume RUN_ID`` continues any
  run: its tasks and proposer from the archive, its spent budget counted from its rows, its next
  sequence number after its last recorded attempt.
* **One process per run.** The process running a run holds it in the archive and writes a
  heartbeat with the run's wall time (liveness.py); ``--resume`` of a run whose holder is alive
  is refused before anything is written, and a dead holder's run is taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import replace
from typing import Any, Mapping

from kernforge.archive.content import code_hash
from kernforge.archive.history import HistoryRow, judged_code
from kernforge.archive.records import AttemptRecord
from kernforge.archive.store import Archive
from kernforge.tasks.spec import Task
from kernforge.verifier import contender
from kernforge.verifier.audit import Audit
from kernforge.verifier.cache import compiled_dir
from kernforge.verifier.checks import Check
from kernforge.verifier.judge import GpuBusy, JudgeError, JudgeOptions
from kernforge.verifier.judge_errors import out_of_memory
from kernforge.verifier.verdict import Rejected, Status, Verdict

from .audit_queue import AuditQueue
from .budget import Meter, Spent
from .compile_ahead import Background, CompileAhead
from .display import AttemptEvent, Display, GuardedDisplay, QuietDisplay, RunView
from .errors import LoopError
from .devices import Devices
from .evaluate import resolve_devices
from .fairness import FairShare
from .kernels_ahead import KernelsAhead
from .knobs import clusters_in
from .lessons import Failure
from .liveness import Heartbeat, holder_alive, this_process
from .llm import LLMError
from .plan import (RunResult, RunSettings, TaskState, dead_gap_s, judge_options, load_run_tasks, resumed_spent,
                   settings_for_resume, task_state)
from .proposers import LLMProposer, NoProposal, OfflineTuner, Proposal, Proposer, llm_config, seed_rng
from .recorder import RunRecorder
from .search import Member, Population, geomean_us, row_fitness, speedups
from .strategy import Bandit, reward

__all__ = ["RunResult", "RunSettings", "Runner", "run", "run_async"]

#: An LLM provider failing this many requests in a row (after each one's own retries) ends the run.
MAX_CONSECUTIVE_LLM_FAILURES = 5
#: a task whose judge runs out of GPU memory this many times is set aside; before, each time its
#: attempt is left unjudged (the memory may have been held for a moment)
MEMORY_TRIES = 3


class Runner:
    def __init__(self, settings: RunSettings, display: Display | None = None) -> None:
        self.settings = settings
        # a display that cannot write (stdout closed: `kernforge run | tee log` and a Ctrl-C) goes quiet
        self.display = GuardedDisplay(display or QuietDisplay())
        self.owner = this_process()
        self._heartbeat: Heartbeat | None = None
        self._before = Spent()
        self.unjudged = 0  # proposals left unjudged because the time budget was spent
        self.archive: Archive | None = None
        self.run_id: int | None = None
        self.states: list[TaskState] = []
        self.devices: Devices | None = None
        self.recorder: RunRecorder | None = None  # the run's archive, in its own thread (recorder.py)
        self.proposer: Proposer | None = None
        self.bandit: Bandit | None = None
        self.meter: Meter | None = None
        self.stopping: str | None = None
        self.abandon = False
        self.failure: BaseException | None = None
        self.retries = 0
        self.llm_failures = 0
        self._consecutive_failures = 0
        self._t0 = time.monotonic()
        self._t_devices: float | None = None
        self._t_end: float | None = None  # when the pipeline ended (before the judges close)
        self._inflight: dict[tuple[int, str], asyncio.Future] = {}
        self._auditing: dict[int, asyncio.Future] = {}  # attempt id -> its audit being made (None if it failed)
        #: the would-be bests that wait for an audit, and when each goes (audit_queue.py)
        self.audits = AuditQueue(self._audit, at_once=self._audits_go_at_once,
                                 first_verdicts_pending=self._first_verdicts_pending, time_left_s=self._time_left_s,
                                 note=self.display.note)
        self._producers: list[asyncio.Task] = []
        self._consumers: list[asyncio.Task] = []
        self._turn = 0
        self.fair = FairShare(())
        self._interrupts = 0
        #: torch.compile's baselines compiled ahead, in the background (loop/compile_ahead.py)
        self._ahead = Background()
        #: the Triton kernels of queued proposals compiled ahead, by the proposal's id (loop/kernels_ahead.py)
        self._kernels_ahead: dict[int, KernelsAhead] = {}
        self._ahead_off_said = False

    async def _fitting(self, tasks: list[Task], task_ids: list[int]) -> tuple[list[Task], list[int]]:
        """The tasks these devices can judge at all (the GPUs, or the CPU interpreter); each one too
        large is said and left out, and the run's record keeps why (a benchmark's report says it). A task
        whose attempts are all recorded (a resumed run) is not sized: it judges nothing more, and
        sizing runs its reference at every shape (on the H200 a resumed KernelBench run of 43
        problems spent its first minute sizing problems it had finished)."""
        assert self.meter is not None and self.archive is not None and self.run_id is not None
        kept, left_out = [], {}
        for task, task_id in zip(tasks, task_ids):
            why = None if self.meter.task_done(task.name) else await self.devices.too_large(task)
            if why:
                self.display.note(f"left out: {why}")
                left_out[task.name] = why
            else:
                kept.append((task, task_id))
        self.archive.set_left_out(self.run_id, left_out)  # a benchmark's report says why (archive/bench_runs.py)
        if not kept:
            raise LoopError("no task of this run fits these devices (see above)")
        return [t for t, _ in kept], [i for _, i in kept]

    # ---- the whole run -------------------------------------------------------------------------
    async def run(self) -> RunResult:
        s = self.settings
        status = "failed"
        if s.resume is not None:
            self.archive = Archive.open(s.db)
        try:
            if s.resume is not None:
                s = settings_for_resume(self.archive, s)
                self.settings = s
            if s.sandbox not in ("process", "docker"):
                raise LoopError(f"--sandbox must be 'process' or 'docker', not {s.sandbox!r}")
            if s.lanes < 1:
                raise LoopError(f"--lanes must be 1 or more (verdicts in flight per device), not {s.lanes}")
            tasks = load_run_tasks(s.tasks)
            config = llm_config(provider=s.provider, base_url=s.base_url, models=s.models, offline=s.offline)
            names = resolve_devices(s.gpus)
            self._check_cost_budget(config)
            if self.archive is None:  # a new run: its archive is created once the input is known good
                self.archive = Archive.create(s.db)
            self.bandit = Bandit(seed_rng(s.seed, "bandit"))
            task_ids = [self.archive.register_task(t) for t in tasks]
            self.run_id, before, next_seq = self._start_run(config, tasks, task_ids)
            self._before = before
            self._heartbeat = Heartbeat(s.db, self.run_id, self.owner, self.charged_seconds)
            self.display.note(f"run {self.run_id}: starting sandbox workers and the reference on {', '.join(names)}...")
            if config is not None and s.budget.unlimited:
                self.display.note("no budget given (--max-attempts, --hours, --max-tokens, --max-cost): "
                                  "the run goes on until Ctrl-C")
            self.devices = Devices(names, sandbox=s.sandbox, pool_size=s.pool_size, tasks=tasks, lanes=s.lanes,
                                   options=judge_options(s))
            self.recorder = RunRecorder(self.archive, self.run_id, self.devices, next_seq)
            await self.devices.open()
            self.recorder.share_baselines()
            self.meter = Meter(s.budget, before)
            tasks, task_ids = await self._fitting(tasks, task_ids)
            self._load_states(tasks, task_ids)
            self.fair = FairShare((state.task.name for state in self.states), earlier=self._before.attempts)
            self._compile_ahead()
            # a capture on a GPU never overlaps a timed phase there (verifier/gate.py)
            gpu_hold = None if self.devices.on_cpu else self.devices.gpu_child
            if config is None:
                self.proposer = OfflineTuner(seed=s.seed, device_kind="cpu" if self.devices.on_cpu else "cuda",
                                             clusters=not self.devices.on_cpu and clusters_in(self.devices.env),
                                             gpu_hold=gpu_hold)
            else:
                hardware = dict(self.devices.env) | await self.devices.ceilings()
                self.proposer = LLMProposer(config, s.models, self.bandit, hardware=hardware,
                                            device_kind="cpu" if self.devices.on_cpu else "cuda", note=self.display.note,
                                            gpu_hold=gpu_hold)
            self._prime()
            self._note_reach()
            # in the background, in the order the tasks will first be picked (``FairShare.order``: those
            # with no verdict yet first): the tuner's Inductor starts, the LLM's torch.compile listings
            self.proposer.prepare((state.task, state.population) for state in self._turn_order())
            await self.proposer.start()
            self._t_devices = time.monotonic()
            self.display.start(self.view)
            try:
                await self._pipeline()
            finally:
                self._t_end = time.monotonic()
                self.display.stop()
            status = "failed" if self.failure else ("interrupted" if self._interrupts else "finished")
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            await self._close()
            if self._heartbeat is not None:
                self._heartbeat.stop()
            if self.archive is not None:
                if self.run_id is not None:
                    self.archive.finish_run(self.run_id, status, owner=self.owner, seconds=self.charged_seconds())
                self.archive.close()
        if self.failure is not None:
            if self.run_id is not None:
                self.display.note(f"run {self.run_id} failed; once the cause is fixed, continue it with "
                                  f"kernforge run --resume {self.run_id} --db {self.settings.db}")
            raise self.failure
        return self.result(status)

    def _check_cost_budget(self, config: Any) -> None:
        if self.settings.budget.max_cost is None or config is None:
            return
        for model in self.settings.models or (config.model,):
            if model and config.price(model) is None:
                raise LoopError(f"--max-cost needs a price for model {model!r}: add [prices.\"{model}\"] input/output "
                                "(USD per million tokens) to the config file")

    def _start_run(self, config: Any, tasks: list[Task], task_ids: list[int]) -> tuple[int, Spent, int]:
        """The run's id, what its earlier sessions spent, and its next attempt's sequence number."""
        assert self.archive is not None
        s = self.settings
        if s.resume is None:
            stored = {"settings": s.stored(), "llm": config.to_dict() if config else None,
                      "task_refs": {t.name: t.ref for t in tasks}}
            return self.archive.start_run(stored, owner=self.owner), Spent(), 0
        # refused (RunBusyError) while the process running it is alive; nothing is written then
        self.archive.resume_run(s.resume, self.owner, holder_alive)
        gap = dead_gap_s(config, JudgeOptions())
        spent, next_seq = resumed_spent(self.archive, s.resume, tasks, task_ids, gap)
        return s.resume, spent, next_seq

    async def _close(self) -> None:
        await self._ahead.stop()
        for ahead in self._kernels_ahead.values():  # proposals never judged: their workers let go
            ahead.cancel()
        self._kernels_ahead.clear()
        if self.devices is not None:
            await self.devices.close()
        if self.recorder is not None:
            self.recorder.close()
        if self.proposer is not None:
            with contextlib.suppress(Exception):
                await self.proposer.aclose()

    # ---- state from the archive ----------------------------------------------------------------
    def _load_states(self, tasks: list[Task], task_ids: list[int]) -> None:
        assert self.archive is not None and self.bandit is not None
        replay: list[HistoryRow] = []
        demoted: set[int] = set()  # replayed as they counted live: no fitness, never a new best
        for task, task_id in zip(tasks, task_ids):
            population = Population(rng=seed_rng(self.settings.seed, "search", task.name))
            state, rows = task_state(self.archive, task, task_id, env=self.devices.env, env_key=self.devices.env_key,
                                     population=population, on_cpu=self.devices.on_cpu)
            self.states.append(state)
            replay += rows
            audits = self.archive.latest_audits([r.id for r in rows if r.accepted and r.reuse_of is None])
            demoted |= {i for i, a in audits.items() if not a.passed}
            waiting = population.contenders()
            if waiting and not self.devices.on_cpu:
                self.audits.take_leftovers(state, waiting, self._passed_before(waiting) if self._audits_go_at_once() else set())
            elif waiting:
                self.display.note(f"[{task.name}] {len(waiting)} archived kernel(s) fitter than the audited best have no "
                                  f"audit, so none is the best; `kernforge archive audit --task {task.name}` audits them")
        replay.sort(key=lambda r: r.id)
        self.bandit.replay(replay, {r.id: None if r.id in demoted else row_fitness(r) for r in replay})

    def _prime(self) -> None:
        """Tell the proposer what the archive judged for each task in this environment."""
        assert self.archive is not None and self.proposer is not None
        for state in self.states:
            ids = list(state.ids.values())[-2000:]
            self.proposer.prime(state.task, lambda ids=ids: judged_code(self.archive, ids))

    def _compile_ahead(self) -> None:
        """torch.compile's baselines of every task never judged on this GPU and these versions
        compiled in the background, on the CPU cores, into the reference workers' trusted compiler
        cache (loop/compile_ahead.py), in the order of first verdicts, then the hidden shapes' of
        every task never audited here (audits time them): a GPU run only."""
        if self.devices is None or self.devices.on_cpu or not self.states or not _cuda_here():
            return
        device = self.devices.names[0]
        cache = compiled_dir(self.devices.options.cache_dir)
        # a task judged on this GPU and these versions before, by any judge, has its public shapes'
        # baselines in the archive: nothing to compile there (after an upgrade of kernforge a warm
        # night compiled all 143 shapes again, and its first verdict waited 10 s at the gate for
        # them); its hidden shapes' only where an audit timed them: a second run's audits of tasks
        # the first had not audited compiled 3-12 s each while holding the GPU (H100, session 56)
        assert self.archive is not None
        order = self._turn_order()
        judged = self.archive.tasks_judged_on(self.devices.env)  # this environment's tasks among them
        audited = self.archive.tasks_audited_on(self.devices.env) if self.devices.options.time_hidden != "never" else None
        fresh = [s.task for s in order if s.task_id not in judged]
        # the hidden shapes of the tasks whose kernels an earlier run left unaudited first: their
        # audits go at the start of this run, ahead of any new verdict
        waiting = {task_id: i for i, task_id in enumerate(dict.fromkeys(state.task_id for state, _ in self.audits.leftover))}
        hidden = [] if audited is None else [s.task for s in sorted(order, key=lambda s: waiting.get(s.task_id, len(waiting)))
                                             if s.task_id not in audited]
        if not fresh and not hidden:
            return
        ahead = CompileAhead(fresh, device, str(cache), self.devices.gates[device].shared_async, note=self.display.note,
                             hidden=hidden)
        self._ahead = Background(note=self.display.note)
        self._ahead.start(ahead)

    def _turn_order(self) -> list[TaskState]:
        """The open tasks in the order they will be picked (``FairShare.order``: those with no
        verdict yet first): the order the proposer prepares them and their baselines compile ahead."""
        open_ = {s.task.name: s for s in self.states if not self._finished(s)}
        return [open_[name] for name in self.fair.order([(name, s.pending) for name, s in open_.items()])]

    def _note_reach(self) -> None:
        """Say up front, per task, when --max-attempts is more than the proposer can reach (the
        offline tuner's configurations)."""
        assert self.proposer is not None and self.meter is not None
        limit = self.settings.budget.max_attempts
        for state in self.states if limit is not None else ():
            left = self.meter.attempts_left(state.task.name)
            reach = self.proposer.reach(state.task, state.population)
            if reach is None or left <= reach.left:
                continue
            whose = "the seed's" if state.task.seed_source is not None else "its kernel's"
            what = (f"{whose} knobs ({', '.join(reach.labels)})" if reach.families == 1
                    else f"the knobs of the {reach.families} kernels it starts from")
            earlier = f", {reach.tried} of them tried already" if reach.tried else ""
            self.display.note(f"[{state.task.name}] the offline tuner can reach only {reach.total} configurations of "
                              f"{what}{earlier}; --max-attempts {limit} will not be reached")

    # ---- the pipeline --------------------------------------------------------------------------
    async def _pipeline(self) -> None:
        n_devices = len(self.devices.slots)  # every lane of every device verifies
        self._queue = asyncio.Queue(maxsize=n_devices)
        self._progress = asyncio.Event()
        self._late: list[tuple[TaskState, Proposal]] = []
        n = self.proposer.concurrency
        self._consumers = [asyncio.create_task(self._consume(i)) for i in range(n_devices)]
        self._producers = [asyncio.create_task(self._produce()) for _ in range(n)]
        watch = asyncio.create_task(self._watch_clock())
        await asyncio.gather(*self._producers, return_exceptions=True)
        watch.cancel()
        # Proposals made but not queued when the producers were stopped: their tokens are spent,
        # so they are judged and archived like the rest (unless everything is being abandoned).
        for item in self._late:
            if self.abandon:
                break
            if self._out_of_time():
                state, _ = item
                state.pending -= 1
                self._leave_unjudged(state)
                continue
            await self._queue.put(item)
        if not self.abandon:
            for _ in self._consumers:
                await self._queue.put(None)
        await asyncio.gather(*self._consumers, return_exceptions=True)
        if self.audits.pending() and not self.abandon:  # audits still waiting at the run's end
            ends = await asyncio.gather(*(self._audit_waiting(i, at_end=True) for i in range(n_devices)),
                                        return_exceptions=True)
            for error in ends:
                if isinstance(error, Exception):
                    self._fail(error)

    def _first_verdicts_pending(self, but: TaskState | None = None) -> bool:
        """Some open task (other than ``but``) has had no verdict yet in this session of the run."""
        return any(s is not but and s.stats.first_verdict_s is None and not self._finished(s) for s in self.states)

    def _audits_go_at_once(self) -> bool:
        """A benchmark run audits every would-be best as it comes. A benchmark counts a problem only
        once its best is audited (an unaudited one is untimed), and each problem's budget is fixed,
        so waiting reorders nothing but what a run cut short has to show: the H100's KernelBench
        slices of 43 problems, each cut by its time limit, ended with 11 correct problems and
        none of them timed. Audited as they come, every problem judged is a problem counted."""
        return self.settings.benchmark is not None

    async def _audit_waiting(self, index: int, at_end: bool = False) -> None:
        """Audit on lane ``index`` the kernels whose audits may go now (audit_queue.py); ``at_end``:
        the run has nothing more to judge, so all of them, unless it was interrupted."""
        if at_end:
            def carry_on() -> bool:
                return not self.abandon and not self._interrupts and not self._out_of_time()
        else:
            def carry_on() -> bool:
                return self.stopping is None and not self._out_of_time()
        await self.audits.go(index, carry_on, at_end=at_end)

    def _passed_before(self, waiting: list[Member]) -> set[int]:
        """Which of these kernels passed their latest audit by an earlier judge. A benchmark counts
        that audit already (archive/bench_runs.py), so in a benchmark run the installed judge audits
        them again only after every problem's first verdict (``AuditQueue.reaudit``): a KernelBench
        slice resumed after the judge changed spent its 330 s auditing eight such kernels again and
        judged no new problem."""
        assert self.archive is not None
        audits = self.archive.latest_audits([m.attempt_id for m in waiting if m.attempt_id is not None], any_judge=True)
        return {i for i, a in audits.items() if a.passed}

    def _time_left_s(self) -> float | None:
        """The time budget left, in seconds (None: no time budget)."""
        if self.meter is None or self.meter.budget.hours is None:
            return None
        return self.meter.budget.hours * 3600 - self.meter.seconds

    async def _watch_clock(self) -> None:
        assert self.meter is not None
        if self.meter.budget.hours is None:
            return
        left = self.meter.budget.hours * 3600 - self.meter.seconds
        await asyncio.sleep(max(0.0, left))
        self.stop(self.meter.stopped() or "the time budget is spent")

    def charged_seconds(self) -> float:
        """The run's wall time: its earlier sessions' and this one's so far."""
        return self._before.seconds + (time.monotonic() - self._t0)

    def stop(self, reason: str) -> None:
        """Ask for no more proposals; cancel the requests in flight; judge what is queued (unless
        the time budget is spent: then nothing more is started)."""
        first = self.stopping is None
        if first:
            self.stopping = reason
        for task in self._producers:
            task.cancel()
        if first:
            self.display.note(f"stopping: {reason}")

    def _out_of_time(self) -> bool:
        """The time budget is spent: no verification may start any more (one running finishes)."""
        if self.meter is None or not self.meter.time_spent():
            return False
        self.stop(self.meter.stopped() or "the time budget is spent")
        return True

    def _leave_unjudged(self, state: TaskState) -> None:
        self.unjudged += 1
        self.meter.release(state.task.name)

    def abandon_all(self) -> None:
        """Stop at once: verifications in flight are abandoned, never recorded."""
        self.stop(self.stopping or "interrupted")
        self.abandon = True
        for task in self._consumers:
            task.cancel()
        queue = getattr(self, "_queue", None)
        while queue is not None and not queue.empty():
            queue.get_nowait()

    def interrupt(self, signum: int) -> None:
        """SIGINT: stop asking (a second one abandons); SIGTERM: abandon."""
        self._interrupts += 1
        if signum == signal.SIGINT and self._interrupts == 1:
            busy = sum(1 for t in self._consumers if not t.done())
            self.stop("interrupted (Ctrl-C): finishing the candidates already proposed; Ctrl-C again to abandon them"
                      if busy else "interrupted (Ctrl-C)")
        else:
            self.abandon_all()

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.stop(f"error: {error}")

    def _finish_task(self, state: TaskState, reason: str) -> None:
        if state.done is None:
            state.done = reason
            state.stats.note = reason
            self.display.note(f"[{state.task.name}] {reason}")

    def _finished(self, state: TaskState) -> bool:
        assert self.meter is not None
        return state.done is not None or self.meter.task_done(state.task.name)

    def _pick(self) -> TaskState | None:
        """The next task to ask a proposal for, with an attempt reserved for it: first verdicts
        first, then the task charged the least device time, round robin on ties (fairness.py)."""
        assert self.meter is not None
        n = len(self.states)
        rotated = [self.states[(self._turn + k) % n] for k in range(n)]
        open_ = [s for s in rotated if not self._finished(s) and not s.waiting]
        by_name = {s.task.name: s for s in open_}
        for name in self.fair.order([(s.task.name, s.pending) for s in open_]):
            state = by_name[name]
            if self.meter.reserve(name):
                self._turn = (self.states.index(state) + 1) % n
                state.pending += 1
                return state
        return None

    async def _produce(self) -> None:
        assert self.meter is not None and self.proposer is not None
        item = None
        try:
            while self.stopping is None:
                reason = self.meter.stopped()
                if reason is not None:
                    self.stop(reason)
                    return
                self._progress.clear()
                state = self._pick()
                if state is None:
                    if all(self._finished(s) for s in self.states):
                        return
                    await self._progress.wait()
                    continue
                proposal = await self._propose(state)
                if proposal is None:
                    state.pending -= 1
                    self.meter.release(state.task.name)
                    self._progress.set()
                    continue
                item = (state, proposal)
                if proposal.unusable is None:
                    # its kernels compile while the lanes judge what is before it: from before it
                    # waits for room in the queue, so it has the verdict in flight and the one
                    # queued to compile in, not only the one in flight
                    ahead = self.devices.kernels_ahead(proposal.code, state.task)
                    if ahead is not None:
                        self._kernels_ahead[id(proposal)] = ahead
                await self._queue.put(item)
                item = None
        except asyncio.CancelledError:
            if item is not None:
                self._late.append(item)
            return
        except Exception as error:  # ours or a bug: either ends the run cleanly, marked failed, and re-raised
            self._fail(error)

    async def _propose(self, state: TaskState) -> Proposal | None:
        assert self.proposer is not None
        if state.seed_code is not None:
            code, state.seed_code = state.seed_code, None
            return Proposal(code=code, proposer="seed", description="the task's seed kernel")
        try:
            result = await self.proposer.propose(state.task, state.population, state.lessons)
        except asyncio.CancelledError:
            state.pending -= 1
            self.meter.release(state.task.name)
            raise
        except LLMError as error:
            self.llm_failures += 1
            self.retries += error.retries
            self._consecutive_failures += 1
            self.display.note(f"[{state.task.name}] LLM request failed: {error}")
            if error.fatal or self._consecutive_failures >= MAX_CONSECUTIVE_LLM_FAILURES:
                why = "" if error.fatal else f" ({self._consecutive_failures} requests in a row)"
                self._fail(LoopError(f"the LLM provider failed{why}: {error}"))
            return None
        if isinstance(result, NoProposal):
            if result.kind == "exhausted" and state.pending > 1:
                state.waiting = True  # in-flight verdicts may open new configurations
            else:
                self._finish_task(state, result.reason)
            return None
        self._consecutive_failures = 0
        self.retries += result.retries
        return result

    async def _consume(self, index: int) -> None:
        while True:
            try:
                await self._audit_waiting(index)
            except asyncio.CancelledError:
                return
            except Exception as error:  # ours or a bug: ends the run cleanly, marked failed
                self._fail(error)
            item = await self._queue.get()
            if item is None:
                return
            state, proposal = item
            ahead = self._kernels_ahead.pop(id(proposal), None)  # its kernels compiled ahead, if any
            try:
                if self._out_of_time():  # stop means stop: nothing new starts once the time is spent
                    self._leave_unjudged(state)
                    continue
                await self._judge_and_record(index, state, proposal, ahead)
            except asyncio.CancelledError:
                return
            except GpuBusy as error:  # another process's GPU work: nobody's verdict, the task goes on
                await self._ahead.make_room(error)  # GpuMemoryHeld: our own compiles ahead may hold the memory
                self.display.note(f"[{state.task.name}] an attempt was left unjudged: {error}"[:600])
            except JudgeError as error:
                ours = await self._ahead.make_room(error)  # our own compiles ahead held it: not the task's try
                if out_of_memory(error) and (ours or state.memory_failures + 1 < MEMORY_TRIES):
                    # the GPU's memory ran out under the judge: our own compiles ahead, or a process
                    # outside kernforge, may have held it for a moment (on the H100 fused_moe's arena
                    # could not be made while its torch.compile baseline was compiled beside it)
                    state.memory_failures += not ours
                    if proposal.proposer == "seed":
                        state.seed_code = proposal.code  # judged again: the seed is the task's yardstick
                    tries = "beside the compiles ahead, now stopped" if ours else f"{state.memory_failures} of {MEMORY_TRIES} tries"
                    self.display.note(f"[{state.task.name}] an attempt was left unjudged: the GPU's memory ran out under "
                                      f"the judge ({tries}; tried again later): {error}"[:600])
                    continue
                # the task's reference (or the judge on it) failed, not the candidate: that task is set
                # aside and said why; the other tasks of the night go on
                self._finish_task(state, f"set aside: the judge failed on it, not a candidate ({error})"[:600])
            except Exception as error:  # ours or a bug: either ends the run cleanly, marked failed, and re-raised
                self._fail(error)
            finally:
                if ahead is not None:  # used, or no verdict made: its worker let go
                    ahead.cancel()
                state.pending -= 1
                state.waiting = False
                self._progress.set()

    async def _judge_and_record(self, index: int, state: TaskState, proposal: Proposal,
                                ahead: KernelsAhead | None = None) -> None:
        """Judge ``proposal`` in slot ``index`` (or reuse a verdict of the same code) and record
        it; ``ahead``: its kernels compiled ahead (loop/kernels_ahead.py)."""
        assert self.meter is not None
        loop = asyncio.get_running_loop()
        task, code = state.task, proposal.code
        key = (state.task_id, code_hash(code))
        reuse_of: int | None = None
        verify_s: float | None = None
        mine: asyncio.Future | None = None
        hit: AttemptRecord | None = None
        try:
            if proposal.unusable is not None:
                verdict: Verdict = _unusable(proposal, self.devices.env)
            else:
                hit = await self.recorder.lookup(state, code)
                if hit is None and key in self._inflight:
                    # Another device is judging the same code: wait for its verdict and reuse it.
                    twin = self._inflight[key]
                    try:
                        original = await asyncio.shield(twin)
                    except asyncio.CancelledError:
                        if not twin.cancelled() or self.abandon:
                            raise
                        original = None  # the twin was abandoned: judge it here
                    if original is not None:
                        hit = await self.recorder.attempt(original)
                if hit is not None:
                    verdict, reuse_of = hit.verdict, hit.id
                else:
                    mine = self._inflight[key] = loop.create_future()
                    best = state.population.best
                    # the confirmed best's times: a candidate clearly slower at a shape is timed no further
                    bar = contender.bar_of(best.verdict) if best is not None else None
                    verdict, verify_s = await self.devices.verify(index, code, task, bar, ahead)
                    if self.devices.ahead_off and not self._ahead_off_said:
                        self._ahead_off_said = True
                        self.display.note(f"Triton kernels are no longer compiled ahead in this run: {self.devices.ahead_off}")
                    self.audits.verify_s += verify_s
            if self.abandon:
                raise asyncio.CancelledError
            attempt_id, seq = await self.recorder.attempt_judged(state, proposal, verdict, reuse_of)
        except BaseException:
            self.meter.release(task.name)
            if mine is not None and not mine.done():
                mine.cancel()
                self._inflight.pop(key, None)
            raise
        if mine is not None:
            mine.set_result(attempt_id)
            self._inflight.pop(key, None)
        # Recorded; a would-be best is audited before it counts (a stop here leaves it unaudited: not a best).
        parent = proposal.parent
        depth = parent.depth + 1 if parent is not None and proposal.arm and proposal.arm[0] == "repair" else 0
        member = Member(code, verdict, reuse_of or attempt_id, proposal.proposer, depth=depth,
                        audit_passed=hit.audit_passed if hit is not None else None)
        audit: Audit | None = None
        if state.population.needs_audit(member):
            if self.audits.waits(but=state):
                # an audit is several verdicts' device time: every task's first verdict comes before
                # it (a seed's audit per task would otherwise hold the later tasks back by minutes),
                # and audits have at most their share of the GPU while new verdicts are made
                self.audits.defer(state, member)
            else:
                try:
                    audit = await self._audit(index, state, member)
                except asyncio.CancelledError:
                    self._learn(state, proposal, member, attempt_id, seq, reuse_of, verify_s, None)
                    raise
                except GpuBusy as error:  # nobody's verdict: audited again at a later turn (audit_queue.py)
                    self.audits.retry(state, member, error)
                if audit is not None:
                    member = replace(member, audit_passed=audit.passed)
        elif state.population.near_tie(member):
            state.stats.near_ties += 1
        self._learn(state, proposal, member, attempt_id, seq, reuse_of, verify_s, audit)

    async def _audit(self, index: int, state: TaskState, member: Member) -> Audit | None:
        """Audit ``member`` on device ``index`` and record the audit; the audit, or None when it could
        not be made. The same attempt reached by two devices at once is audited once."""
        assert self.devices is not None and member.attempt_id is not None and member.verdict is not None
        pending = self._auditing.get(member.attempt_id)
        if pending is not None:
            return await asyncio.shield(pending)
        mine = self._auditing[member.attempt_id] = asyncio.get_running_loop().create_future()
        audit: Audit | None = None
        try:
            try:
                audit, spent = await self.devices.audit(index, member.code, state.task, member.verdict)
            except JudgeError as error:  # out of memory beside our own compiles ahead: they stop, the audit goes again
                if not await self._ahead.make_room(error):
                    raise
                audit, spent = await self.devices.audit(index, member.code, state.task, member.verdict)
            self.fair.charge(state.task.name, spent)
            self.audits.count(member, spent)
            if self.abandon:
                raise asyncio.CancelledError
            await self.recorder.audited(member.attempt_id, audit)
        except BaseException:
            audit = None
            raise
        finally:
            mine.set_result(audit)
            self._auditing.pop(member.attempt_id, None)
        state.stats.audits += 1
        state.stats.audits_failed += not audit.passed
        return audit

    def _learn(self, state: TaskState, p: Proposal, member: Member, attempt_id: int, seq: int,
               reuse_of: int | None, verify_s: float | None, audit: Audit | None) -> None:
        """Everything a verdict teaches: population, lessons, bandit, tuner, budget, display. A
        demoted kernel (its audit failed) teaches what its audit found, never a new best."""
        assert self.meter is not None and self.proposer is not None and self.bandit is not None
        verdict = member.verdict
        assert verdict is not None
        state.ids.setdefault(code_hash(p.code), reuse_of or attempt_id)
        pop = state.population
        best_before = pop.best.fitness if pop.best else None
        new_best = pop.add(member)
        if p.proposer == "seed":
            state.stats.seed_time_us = geomean_us(verdict)
        if isinstance(verdict, Rejected) and reuse_of is None:
            state.lessons.observe(Failure.of_verdict(verdict))
        if audit is not None and isinstance(audit.verdict, Rejected):
            state.lessons.observe(Failure.of_verdict(audit.verdict))  # it behaved once, not the second time
        if p.arm is not None:
            parent = p.parent
            value = reward(verdict.accepted, parent.fitness if parent else None,
                           None if member.demoted else member.fitness, best_before,
                           parent_accepted=bool(parent and parent.accepted), reused=reuse_of is not None)
            self.bandit.update(p.arm, value)
        # the tuner learns from the truer measurement: a demoted kernel's second verdict
        truer = audit.verdict if member.demoted and audit is not None and audit.verdict is not None else verdict
        self.proposer.observe(state.task, p.code, truer)
        self.meter.record(state.task.name, p.tokens_in + p.tokens_out, p.cost)
        self.fair.judged(state.task.name, verify_s or 0.0)
        state.stats.count(verdict, tokens=p.tokens_in + p.tokens_out, cost=p.cost, cost_known=p.cost_known,
                          reused=reuse_of is not None, at_s=time.monotonic() - self._t0)
        if new_best:
            state.note_best()
        self.display.attempt(AttemptEvent(
            task=state.task.name, seq=seq, attempt_id=attempt_id, status=verdict.status.value, threat=verdict.threat,
            reused=reuse_of is not None, proposer=p.proposer, model=p.model if p.proposer != "offline" else "",
            time_us=geomean_us(verdict), interpreter=state.stats.interpreter, new_best=new_best and not state.stats.interpreter,
            speedup_eager=speedups(verdict)["speedup_eager"],
            reason=p.description if verdict.accepted else verdict.reason,
            tokens=p.tokens_in + p.tokens_out, cost=p.cost, verify_s=verify_s,
            audit_passed=member.audit_passed if audit is not None or member.demoted else None,
            audit_reason=audit.reason if audit is not None else "",
            not_contender=next((f for f in verdict.flags if f.startswith(contender.NOT_A_CONTENDER)), "")
            if verdict.accepted else "",
        ))

    # ---- reporting -----------------------------------------------------------------------------
    def view(self) -> RunView:
        assert self.meter is not None
        return RunView(
            run_id=self.run_id or 0, proposer=self.proposer.describe() if self.proposer else "",
            devices=tuple(self.devices.names if self.devices else ()), elapsed_s=time.monotonic() - self._t0, busy=self._busy(),
            tokens=self.meter.tokens, cost=self.meter.cost, stopping=self.stopping,
            tasks=tuple(s.stats for s in self.states),
        )

    def _busy(self) -> float | None:
        if self._t_devices is None or self.devices is None:
            return None
        span = ((self._t_end or time.monotonic()) - self._t_devices) * len(self.devices.names)
        return min(1.0, sum(self.devices.busy_s.values()) / span) if span > 0 else None

    def result(self, status: str) -> RunResult:
        assert self.meter is not None and self.run_id is not None
        inner = self.display.inner
        notes = inner.notes if isinstance(inner, QuietDisplay) else []
        return RunResult(
            run_id=self.run_id, status=status, db=str(self.settings.db),
            proposer=self.proposer.describe() if self.proposer else "", devices=tuple(self.devices.names),
            tasks=[s.stats for s in self.states], attempts=sum(s.stats.attempts for s in self.states),
            wall_s=time.monotonic() - self._t0, pipeline_s=(self._t_end or time.monotonic()) - (self._t_devices or self._t0),
            verify_s=sum(self.devices.busy_s.values()),
            verify_s_per_device=dict(self.devices.busy_s), verified_per_device=dict(self.devices.verified),
            audited_per_device=dict(self.devices.audited),
            startup_s=(self._t_devices or time.monotonic()) - self._t0, busy=self._busy(), tokens=self.meter.tokens,
            cost=self.meter.cost, retries=self.retries, llm_failures=self.llm_failures,
            stop_reason=self.stopping, arms=self.bandit.table() if self.bandit else [], notes=list(notes),
            unjudged=self.unjudged, verdict_log=list(self.devices.log),
        )


def _unusable(p: Proposal, env: Mapping[str, Any]) -> Rejected:
    """The verdict on a reply that held no module: nothing could be built, so nothing was run."""
    return Rejected(Status.COMPILE_ERROR, f"the reply held no candidate module ({p.unusable}): {p.note}",
                    check=Check.EXTRACTION, evidence={"kind": p.unusable}, environment=dict(env))


async def run_async(settings: RunSettings, display: Display | None = None) -> RunResult:
    runner = Runner(settings, display)
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, runner.interrupt, sig)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    try:
        return await runner.run()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def run(settings: RunSettings, display: Display | None = None) -> RunResult:
    """Run (or resume) the loop to the end of its budget; Ctrl-C stops it cleanly."""
    return asyncio.run(run_async(settings, display))


def _cuda_here() -> bool:
    """Whether this machine has a GPU to compile for (a run's judges may be stand-ins without one)."""
    import torch

    return torch.cuda.is_available()
