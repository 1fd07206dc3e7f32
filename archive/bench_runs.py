"""Benchmark runs in the archive: which runs measure a benchmark, and each problem's result.

A benchmark run is an ordinary run (``kernforge bench kernelbench`` starts it through the loop)
whose stored settings name the benchmark (``settings.benchmark``); its problems are the run's
tasks (``task_refs``: name -> file), its level the folder a problem's file lies in. Nothing else
is stored for it: the results are read from the run's own attempts, so a resumed run's results
are simply its rows so far.

A problem is **correct** when the run has an accepted attempt of it whose latest audit (if any)
did not fail. Its **speedups** are those of its fastest correct kernel over PyTorch eager and
``torch.compile``, at the problem's public shapes (a KernelBench file's own sizes; the geometric
mean where a side file gives several), from GPU timings only and only of a kernel whose latest
audit passed (what ``archive best`` ranks). A reuse row (code judged before, in any run) counts
with its original's verdict, measurements and audits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .bench_metrics import ProblemResult, geomean, natural_key
from .errors import ArchiveError
from .queries import guarded
from .records import RunRecord
from .score import GPU_TIMINGS
from .store import Archive


@dataclass(frozen=True)
class BenchRun:
    run_id: int
    benchmark: str
    #: who proposed: the model(s), or "offline" for the offline tuner
    label: str
    status: str
    started: str
    attempts: int
    #: problem (task) name -> the file it was loaded from
    problems: Mapping[str, str]
    #: problem name -> why its latest session left it out unjudged (too large for its devices)
    left_out: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "problems": dict(self.problems), "left_out": dict(self.left_out)}


def level_of(ref: str) -> str:
    """A problem's level: the folder its file lies in (KernelBench's ``level1/``, ``level2/``)."""
    return "builtin" if ref.startswith("builtin:") else Path(ref).parent.name or "-"


def _label(config: Mapping[str, Any]) -> str:
    settings = config.get("settings") or {}
    llm = config.get("llm")
    if not llm:
        return "offline"
    models = list(settings.get("models") or ()) or [llm.get("model") or "?"]
    return ",".join(str(m) for m in models)


def _bench_run(run: RunRecord) -> BenchRun | None:
    settings = run.config.get("settings")
    if not isinstance(settings, Mapping) or not settings.get("benchmark"):
        return None
    return BenchRun(run_id=run.id, benchmark=str(settings["benchmark"]), label=_label(run.config), status=run.status,
                    started=run.started, attempts=run.attempts, problems=dict(run.config.get("task_refs") or {}),
                    left_out=dict(run.config.get("left_out") or {}))


def benchmark_runs(archive: Archive, benchmark: str | None = None) -> list[BenchRun]:
    """Every benchmark run (of ``benchmark`` only, if given), oldest first."""
    found = [b for b in map(_bench_run, archive.runs()) if b is not None]
    return [b for b in found if benchmark is None or b.benchmark == benchmark]


def bench_run(archive: Archive, run_id: int) -> BenchRun:
    found = _bench_run(archive.run_status(run_id).run)
    if found is None:
        raise ArchiveError(f"run {run_id} in {archive.path} is not a benchmark run "
                           "(started by `kernforge run`, not `kernforge bench`)")
    return found


def _public_speedups(rows: list[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Geometric means over the public, GPU-timed shapes of one attempt (eager, compile)."""
    eager, compiled = [], []
    for m in rows:
        if m["hidden"] or m["timing"] not in GPU_TIMINGS or not m["time_us"] or m["time_us"] <= 0:
            continue
        e = m["speedup_eager"] or (m["eager_us"] / m["time_us"] if m["eager_us"] else None)
        c = m["speedup_compile"] or (m["compile_us"] / m["time_us"] if m["compile_us"] else None)
        eager += [e] if e and e > 0 else []
        compiled += [c] if c and c > 0 else []
    return geomean(eager), geomean(compiled)


@guarded
def problem_results(archive: Archive, run: BenchRun) -> list[ProblemResult]:
    """Each problem of ``run``, by level and number (see the module docstring)."""
    rows = list(archive.db.query(
        "SELECT a.id, coalesce(a.reuse_of, a.id) AS src, a.accepted, a.gpu, t.name FROM attempts a"
        " JOIN tasks t ON t.id = a.task_id WHERE a.run_id = ? ORDER BY a.id", [run.run_id]))
    sources = sorted({r["src"] for r in rows if r["accepted"]})
    audits = archive.latest_audits(sources, any_judge=True)  # the run's record, as its judge audited it
    # a kernel demoted by its audit is not correct (a cheat found there, or rejected when judged
    # again), except one whose time alone did not hold: correct, and untimed
    demoted = {i for i, a in audits.items() if not a.passed and not a.audit.only_slower}
    passed = [i for i in sources if i in audits and audits[i].passed]
    measured: dict[int, list[Mapping[str, Any]]] = {}
    for start in range(0, len(passed), 500):  # stay under SQLite's bound-parameter limit
        chunk = passed[start:start + 500]
        for m in archive.db.query(
                "SELECT attempt_id, hidden, timing, time_us, eager_us, compile_us, speedup_eager, speedup_compile"
                f" FROM measurements WHERE attempt_id IN ({','.join('?' * len(chunk))})", chunk):
            measured.setdefault(m["attempt_id"], []).append(m)
    speed = {i: _public_speedups(measured.get(i, [])) for i in passed}

    out = []
    # by level, then KernelBench's number (2_ before 19_)
    for name, ref in sorted(run.problems.items(), key=lambda kv: (natural_key(level_of(kv[1])), natural_key(kv[0]))):
        mine = [r for r in rows if r["name"] == name]
        good = [r["src"] for r in mine if r["accepted"] and r["src"] not in demoted]
        gpu = next((r["gpu"] for r in mine if r["gpu"] != "cpu"), mine[0]["gpu"] if mine else None)
        timed = [i for i in dict.fromkeys(good) if i in speed and any(s is not None for s in speed[i])]
        # the fastest kernel: by its speedup over torch.compile, else over eager (the same time ranks both)
        best = max(timed, key=lambda i: (speed[i][1] or 0.0, speed[i][0] or 0.0), default=None)
        eager, compiled = speed[best] if best is not None else (None, None)
        out.append(ProblemResult(
            name=name, level=level_of(ref), attempts=len(mine), correct=bool(good), gpu=gpu,
            speedup_eager=eager, speedup_compile=compiled, attempt_id=best if best is not None else (good or [None])[0],
            left_out=run.left_out.get(name) if not mine else None,
        ))
    return out
