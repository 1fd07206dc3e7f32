"""``kernforge bench kernelbench``: KernelBench problems through the normal run, then its metrics.

A benchmark is one run of the loop (runner.py) over the problem files, with the configured
proposer (the LLM, or with no API key the offline tuner) and a budget per problem: attempts per
problem, and wall time (``minutes`` per problem, spent by the whole run while problems take
turns). The run is tagged with the benchmark's name in its stored settings, so the archive knows
it as a benchmark run: ``--resume RUN`` continues it like any run, and ``bench report`` reads
its results and KernelBench's metrics back (archive/bench_runs.py, archive/bench_metrics.py),
alone or beside another model's run.

Input is checked before anything starts: every path must exist and be a KernelBench problem file
(``Model``, ``get_inputs``, ``get_init_inputs``) or a folder of them; every broken file is named
at once, instead of a run that stops at the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kernforge.archive.bench_report import BenchReport, bench_report
from kernforge.archive.bench_runs import BenchRun, bench_run, benchmark_runs
from kernforge.archive.store import Archive
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import load_tasks

from .budget import Budget
from .display import Display
from .errors import LoopError
from .plan import RunResult, RunSettings
from .runner import run

BENCHMARK = "kernelbench"
#: attempts per problem when neither --max-attempts nor --minutes is given
DEFAULT_ATTEMPTS = 10


@dataclass(frozen=True)
class BenchSettings:
    """What ``kernforge bench kernelbench`` was asked to do."""

    problems: tuple[str, ...] = ()
    db: Path = Path("kernforge.db")
    provider: str | None = None
    base_url: str | None = None
    models: tuple[str, ...] = ()
    offline: bool = False
    #: attempts per problem
    max_attempts: int | None = None
    #: wall time per problem (the run's budget is this times the number of problems)
    minutes: float | None = None
    gpus: tuple[int, ...] = ()
    #: verdicts in flight per device (``kernforge run --lanes``)
    lanes: int = 1
    sandbox: str = "process"
    resume: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class BenchResult:
    run: RunResult
    report: BenchReport

    def to_dict(self) -> dict:
        return {"status": self.run.status, "wall_s": self.run.wall_s, "proposer": self.run.proposer,
                "devices": list(self.run.devices), **self.report.to_dict()}


def problem_refs(paths: Sequence[str]) -> tuple[str, ...]:
    """The problem files behind ``paths`` (files and level folders), every one checked to load."""
    if not paths:
        raise LoopError("no problems: give KernelBench problem files or a level folder, "
                        "e.g. `kernforge bench kernelbench bench/kernelbench/problems/level1`")
    refs: dict[str, str] = {}
    broken: list[str] = []
    for given in paths:
        path = Path(given).expanduser()
        if not path.exists():
            raise LoopError(f"{given}: no such file or folder")
        if path.is_file() and path.suffix != ".py":
            raise LoopError(f"{given}: not a KernelBench problem (a .py file defining Model, get_inputs and "
                            "get_init_inputs) nor a folder of them")
        try:
            tasks, errors = load_tasks(path)
        except TaskError as error:
            raise LoopError(f"{given}: {error}") from None
        broken += [str(e) for e in errors]
        for task in tasks:
            if task.name in refs and refs[task.name] != task.ref:
                raise LoopError(f"two problems are named {task.name!r} ({refs[task.name]} and {task.ref}); "
                                "benchmark them in separate runs")
            refs[task.name] = task.ref
    if broken:
        listed = "\n  ".join(broken)
        raise LoopError(f"{len(broken)} file(s) are not KernelBench problems that load; "
                        f"fix or leave them out:\n  {listed}")
    return tuple(refs.values())


def _budget(settings: BenchSettings, n_problems: int, *, resuming: bool) -> Budget:
    attempts = settings.max_attempts
    if attempts is None and settings.minutes is None and not resuming:
        attempts = DEFAULT_ATTEMPTS
    hours = None if settings.minutes is None else settings.minutes * n_problems / 60
    return Budget(max_attempts=attempts, hours=hours)


def _stored_problems(settings: BenchSettings) -> int:
    """How many problems the benchmark run to resume has (it must be one)."""
    if settings.problems or settings.provider or settings.base_url or settings.models or settings.offline:
        raise LoopError(f"--resume {settings.resume} continues the benchmark run with its own problems and proposer; "
                        "only --max-attempts, --minutes, --gpu and --sandbox may be given with it")
    with Archive.open(settings.db, readonly=True) as archive:
        found = bench_run(archive, settings.resume)
    if found.benchmark != BENCHMARK:
        raise LoopError(f"run {settings.resume} is a {found.benchmark} run, not a {BENCHMARK} run")
    return len(found.problems)


def run_benchmark(settings: BenchSettings, display: Display | None = None) -> BenchResult:
    """Run (or resume) the benchmark to the end of its budget, then read its results back."""
    for value, flag in ((settings.max_attempts, "--max-attempts"), (settings.minutes, "--minutes")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise LoopError(f"{flag} must be a positive number, not {value:g}")
    if settings.resume is not None:
        refs: tuple[str, ...] = ()
        n_problems = _stored_problems(settings)
    else:
        refs = problem_refs(settings.problems)
        n_problems = len(refs)
    result = run(RunSettings(
        tasks=refs, db=settings.db, provider=settings.provider, base_url=settings.base_url, models=settings.models,
        offline=settings.offline, budget=_budget(settings, n_problems, resuming=settings.resume is not None),
        gpus=settings.gpus, lanes=settings.lanes, sandbox=settings.sandbox, resume=settings.resume, seed=settings.seed,
        benchmark=None if settings.resume is not None else BENCHMARK,
    ), display)
    return BenchResult(result, read_reports(settings.db, [result.run_id])[0])


def read_reports(db: Path, run_ids: Sequence[int]) -> list[BenchReport]:
    """The results and metrics of these benchmark runs, in the order given."""
    with Archive.open(db, readonly=True) as archive:
        return [bench_report(archive, bench_run(archive, i)) for i in dict.fromkeys(run_ids)]


def list_runs(db: Path) -> list[BenchRun]:
    """Every benchmark run in the archive, oldest first."""
    with Archive.open(db, readonly=True) as archive:
        return benchmark_runs(archive)
