"""What a run starts from, before its pipeline runs: its settings, tasks and devices, what a
resumed run already spent, and the state each task starts in, read from the archive.

A task starts from its archived population (search.py), the lessons of its archived rejections
(lessons.py) and its seed kernel: judged once per environment, so a later run finds the seed's
verdict in the archive instead of judging it again. The strategy bandit replays every archived
attempt of the run's tasks (strategy.py). A resumed run takes its tasks and proposer from the
settings stored with it; only budgets, devices and the sandbox may change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from kernforge.archive.history import HistoryRow, run_history, task_history
from kernforge.archive.score import library_summary
from kernforge.archive.store import Archive, gpu_label, private_files
from kernforge.tasks.loader import load_tasks
from kernforge.tasks.spec import Task
from kernforge.verifier.judge import JudgeOptions

from .budget import Budget, Spent, earlier_seconds
from .display import TaskStats
from .errors import LoopError
from .lessons import Lessons
from .search import Member, Population, geomean_us, speedups

#: Archived attempts read per task at start (lessons, bandit, the offline tuner's memory).
HISTORY_LIMIT = 5000


@dataclass(frozen=True)
class RunSettings:
    """Everything ``kernforge run`` was asked to do. Stored with the run (no secret in it)."""

    tasks: tuple[str, ...] = ()
    db: Path = Path("kernforge.db")
    provider: str | None = None
    base_url: str | None = None
    models: tuple[str, ...] = ()
    offline: bool = False
    budget: Budget = Budget()
    #: GPU indices; empty: every visible GPU, or the CPU interpreter without one
    gpus: tuple[int, ...] = ()
    sandbox: str = "process"
    resume: int | None = None
    seed: int = 0
    #: warm candidate workers per device lane; None: devices.GPU_POOL on a GPU (besides the one
    #: judged, one compiling the next candidate ahead and the rest warming), 1 on the CPU
    pool_size: int | None = None
    #: judges per device whose verdicts overlap (each timed phase has the GPU alone: verifier/gate.py)
    lanes: int = 1
    #: the benchmark this run measures (``kernforge bench kernelbench``: "kernelbench"), None for a plain run
    benchmark: str | None = None

    def stored(self) -> dict[str, Any]:
        stored = {"tasks": list(self.tasks), "provider": self.provider, "base_url": self.base_url,
                  "models": list(self.models), "offline": self.offline, "budget": self.budget.to_dict(),
                  "gpus": list(self.gpus), "sandbox": self.sandbox, "seed": self.seed, "lanes": self.lanes}
        if self.benchmark is not None:
            stored["benchmark"] = self.benchmark
        return stored


@dataclass
class RunResult:
    run_id: int
    status: str
    db: str
    proposer: str
    devices: tuple[str, ...]
    tasks: list[TaskStats]
    attempts: int
    wall_s: float
    #: from the devices' being ready to the last verdict: what the busy fraction is a fraction of
    pipeline_s: float
    verify_s: float
    verify_s_per_device: dict[str, float]
    verified_per_device: dict[str, int]
    #: from the start until every device had a warm judge (workers started, reference loaded)
    startup_s: float
    busy: float | None
    tokens: int
    cost: float
    retries: int
    llm_failures: int
    stop_reason: str | None
    arms: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: audits of would-be bests per device (their time is in ``verify_s_per_device``)
    audited_per_device: dict[str, int] = field(default_factory=dict)
    #: proposals made but never judged: the time budget was spent before a device was free
    unjudged: int = 0
    #: every verification and audit: lane, task, start, seconds, a verdict's steps (Devices.log)
    verdict_log: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "tasks"}
        out["tasks"] = [t.to_dict() for t in self.tasks]
        out["devices"] = list(self.devices)
        return out


@dataclass
class TaskState:
    task: Task
    task_id: int
    population: Population
    lessons: Lessons
    stats: TaskStats
    seed_code: str | None = None  # the seed, while it still has to be judged
    pending: int = 0  # proposals being asked for, queued or being judged
    done: str | None = None  # why no more proposals are asked for this task
    waiting: bool = False  # the tuner has nothing until an in-flight verdict arrives
    memory_failures: int = 0  # attempts left unjudged because the GPU's memory ran out under the judge
    ids: dict[str, int] = field(default_factory=dict)  # code hash -> attempt id (parents' ids)

    def note_best(self, *, new: bool = True) -> None:
        """Copy the population's best into the stats the display shows. On the interpreter the
        population still leads from one, but the display shows none: interpreter verdicts are never
        a best (``kernforge archive best`` shows none either)."""
        best = self.population.best
        if best is None or self.stats.interpreter:
            return
        st = self.stats
        summary = speedups(best.verdict)
        st.best_attempt = best.attempt_id
        st.best_time_us = geomean_us(best.verdict)
        st.best_score = summary["score"]
        st.best_speedup_eager = summary["speedup_eager"]
        st.best_speedup_library = library_summary(best.verdict.shapes)[0]
        st.best_is_new = new


def load_run_tasks(refs: tuple[str, ...]) -> list[Task]:
    tasks: dict[str, Task] = {}
    for ref in refs:
        found, errors = load_tasks(ref)
        if errors:
            raise errors[0]
        for task in found:
            if task.name in tasks and tasks[task.name].ref != task.ref:
                raise LoopError(f"two tasks are named {task.name!r} ({tasks[task.name].ref} and {task.ref}); run them separately")
            tasks[task.name] = task
    if not tasks:
        raise LoopError("no task: give --task NAME_OR_PATH (see `kernforge tasks list`)")
    return list(tasks.values())


def settings_for_resume(archive: Archive, given: RunSettings) -> RunSettings:
    run = archive.run_status(given.resume).run
    if given.tasks or given.provider or given.base_url or given.models or given.offline:
        raise LoopError(
            f"--resume {given.resume} continues the run with its own tasks and proposer (as stored in the archive); "
            "only budgets, --gpu, --lanes and --sandbox may be given with it")
    stored = run.config.get("settings")
    if not isinstance(stored, Mapping) or "tasks" not in stored:
        raise LoopError(f"run {given.resume} in {archive.path} was not started by `kernforge run`; it cannot be resumed")
    settings = replace(
        given, tasks=tuple(stored["tasks"]), provider=stored.get("provider"), base_url=stored.get("base_url"),
        models=tuple(stored.get("models") or ()), offline=bool(stored.get("offline")), seed=int(stored.get("seed", 0)),
        budget=Budget.from_dict(stored.get("budget") or {}).merged(given.budget), benchmark=stored.get("benchmark"),
    )
    return settings


def resumed_spent(archive: Archive, run_id: int, tasks: list[Task], task_ids: list[int],
                  dead_gap_s: float) -> tuple[Spent, int]:
    """What a resumed run spent before (attempts per task, tokens, cost, wall time alive) and
    the sequence number of its next attempt."""
    status = archive.run_status(run_id)
    rows = run_history(archive, run_id)
    names = dict(zip(task_ids, (t.name for t in tasks)))
    counts: dict[str, int] = {}
    for r in rows:
        if r.task_id in names:
            counts[names[r.task_id]] = counts.get(names[r.task_id], 0) + 1
    run = status.run
    # the wall time its sessions recorded (heartbeats, the end of each), or, for a run recorded
    # before runs kept it, the time its attempts' timestamps show it alive
    seconds = max(run.seconds, earlier_seconds(run.started, [r.created for r in rows], dead_gap_s))
    return Spent(attempts=counts, tokens=run.tokens_in + run.tokens_out, cost=run.cost_usd, seconds=seconds), status.next_seq


def judge_options(settings: RunSettings) -> JudgeOptions:
    """How the run's judges time. Every verdict checks every hidden shape; a routine one is timed
    at the public shapes only (about half a GPU verdict's timing and baselines), and an audit
    times the hidden ones too before a best is believed. A KernelBench run is ranked as
    KernelBench ranks it, at each problem's public (default) size: not even its audits time the
    hidden shapes (up to 8 of them, at sizes up to the default's)."""
    return JudgeOptions(time_hidden="never" if settings.benchmark is not None else "audit",
                        private_paths=private_files(settings.db))


def dead_gap_s(config: Any, options: JudgeOptions) -> float:
    """The longest a live run can go without recording an attempt: an LLM request's whole deadline
    (retries and back-off included) plus a verification's timeout."""
    llm = 60.0
    if config is not None:
        llm = config.total_timeout_s or (config.max_retries + 1) * (config.request_timeout_s + config.backoff_max_s)
    return llm + options.message_timeout_s


def task_state(archive: Archive, task: Task, task_id: int, *, env: Mapping[str, Any], env_key: str,
               population: Population, on_cpu: bool) -> tuple[TaskState, list[HistoryRow]]:
    """One task's starting state, and its archived history (for the bandit to replay)."""
    # on the CPU no audit confirms a verdict: only this judge's count (verifier/revision.py)
    population.load_archived(archive.population(task_id, gpu_label(env), top=8, diverse=4, recent=8, failures=4,
                                                env_key=env_key if on_cpu else None))
    rows = task_history(archive, task_id, limit=HISTORY_LIMIT)
    lessons = Lessons()
    lessons.replay(rows)
    state = TaskState(task, task_id, population, lessons, TaskStats(task.name, interpreter=on_cpu))
    state.ids.update({r.code_hash: r.id for r in rows if r.reuse_of is None and r.env_key == env_key})
    seed = task.seed_source
    if seed is not None and on_cpu and task.interpreter_unsupported:
        state.stats.note = f"seed not run on the interpreter: {task.interpreter_unsupported}"
        seed = None
    if seed is not None:
        population.set_seed(seed)
        hit = archive.lookup(task_id, seed, env_key)
        if hit is not None:  # judged in an earlier run: known, not judged again
            population.add(Member.from_record(hit))
            state.stats.seed_time_us = geomean_us(hit.verdict)
        else:
            state.seed_code = seed
    state.note_best(new=False)
    return state, rows
