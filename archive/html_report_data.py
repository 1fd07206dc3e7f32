"""What ``kernforge report`` shows, read from the archive: one frozen ``ReportData`` per page.

The page (html_report.py) draws only what is here; every number on it comes from one of these
records, so the tests check the records and the browser test checks that the page shows them.

* **Timed means GPU-timed.** A point of a task's progress is an accepted evaluation (not a reuse
  row) with per-shape times of record from the GPU (timing "graph" or "eager"); its time is the
  geometric mean of those. Interpreter (CPU) times are correctness-only figures: they are never a
  point, a best or a bar, and a CPU-only archive has no timed results at all (``TaskSection``
  counts its interpreter-only acceptances so the page can say so).
* **Best means audited** (queries.py): per task version and GPU model, the highest-score
  evaluation whose latest audit passed, exactly what ``kernforge archive best`` shows for the
  whole archive; with ``run_id``, the same among that run's own evaluations. The running best of
  the progress plot is, after each attempt, the time of that best among the attempts so far.
* **Baselines** are read from whichever of ``BASELINES``' columns the measurements table has; a
  column a later schema adds (the library baseline) appears on the page with no other change.
* **Not recorded** facts are named in ``ReportData.not_recorded`` instead of being estimated: the
  archive keeps no GPU busy time (``kernforge run`` shows it live and in its summary only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from kernforge.verifier.verdict import BOUNDED, THREATS

from .errors import ArchiveError
from .queries import CURRENT_AUDIT, guarded
from .records import AttemptSummary, _Record
from .score import GPU_TIMINGS, geomean
from .store import Archive


@dataclass(frozen=True)
class Baseline(_Record):
    """What a kernel is compared with: its name on the page and its ``measurements`` column (us)."""

    key: str
    label: str
    column: str


BASELINES = (
    Baseline("eager", "PyTorch eager", "eager_us"),
    Baseline("compile", "torch.compile", "compile_us"),
    # a production kernel library (Liger-Kernel, FlashInfer, vLLM) where one covers the op and was
    # installed (verifier/library.py); an archive from before schema v4 has no column for it, and
    # the page says so until a writer migrates it
    Baseline("library", "kernel library", "library_us"),
)
GPU_BUSY_NOT_RECORDED = (
    "GPU busy time is not recorded in the archive: `kernforge run` shows it live (busy verifying %) and in its"
    " closing summary only. What the archive keeps is each run's wall-clock span (started to ended, including"
    " any time it was stopped before a resume) and the proposer's latency per attempt (LLM round trips).")
#: measurement rows with a time of record from the GPU (never the interpreter's)
_TIMED = f"timing IN ({', '.join(repr(t) for t in GPU_TIMINGS)}) AND time_us > 0"
_CHUNK = 500  # ids per IN (...): under SQLite's bound-parameter limit


@dataclass(frozen=True)
class Point(_Record):
    """One accepted GPU-timed evaluation of a task, in the order of the task's attempts."""

    attempt_id: int
    #: the attempt's position among the task's attempts in scope (1 = first, rejections included)
    n: int
    run_id: int
    seq: int
    created: str
    time_us: float
    score: float | None
    #: "passed", "failed" (demoted) or "not audited": the latest audit's outcome
    audit: str
    model: str
    #: the time of the best (highest-score audited attempt) among the attempts up to this one
    best_us: float | None = None


@dataclass(frozen=True)
class ShapeRow(_Record):
    """One shape of a best attempt: its time, the baselines' times and its % of roofline."""

    label: str
    hidden: bool
    dtype: str
    timing: str
    time_us: float | None
    baselines: Mapping[str, float | None] = field(default_factory=dict)  # Baseline.key -> us
    pct_roofline: float | None = None
    #: its time of record is a bound (ShapeResult.bounded)
    bounded: bool = False

    def speedup(self, key: str) -> float | None:
        base = self.baselines.get(key)
        return base / self.time_us if base and self.time_us else None


@dataclass(frozen=True)
class Step(_Record):
    """One attempt of a best's lineage (root first)."""

    attempt_id: int
    run_id: int
    status: str
    reason: str
    model: str
    threat: int | None = None
    score: float | None = None
    time_us: float | None = None
    parent_id: int | None = None
    reuse_of: int | None = None


@dataclass(frozen=True)
class GpuSection(_Record):
    """A task version's GPU-timed results on one GPU model."""

    gpu: str
    points: tuple[Point, ...] = ()
    best: Point | None = None
    best_speedup_eager: float | None = None
    best_pct_roofline: float | None = None
    shapes: tuple[ShapeRow, ...] = ()
    lineage: tuple[Step, ...] = ()
    audits_passed: int = 0
    audits_failed: int = 0
    _rebuild = {
        "points": lambda rows: tuple(Point.from_dict(r) for r in rows),
        "best": Point.from_dict,
        "shapes": lambda rows: tuple(ShapeRow.from_dict(r) for r in rows),
        "lineage": lambda rows: tuple(Step.from_dict(r) for r in rows),
    }

    def baseline_geomean(self, key: str) -> float | None:
        """A baseline's geometric-mean time over the best's shapes (the best's own time is over the same)."""
        return geomean(s.baselines.get(key) for s in self.shapes if s.time_us)


@dataclass(frozen=True)
class Counts(_Record):
    """Attempts of one task or one model in scope, by verdict; reuse rows count (they cost tokens)."""

    key: str
    attempts: int = 0
    accepted: int = 0
    reused: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    by_status: Mapping[str, int] = field(default_factory=dict)
    by_threat: Mapping[int, int] = field(default_factory=dict)  # THREATS class -> attempts caught
    _rebuild = {"by_threat": lambda m: {int(k): v for k, v in m.items()}}

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.attempts if self.attempts else 0.0


@dataclass(frozen=True)
class TaskSection(_Record):
    """One task version: its verdict counts, and its GPU-timed results per GPU model."""

    task: str
    task_id: int
    source_hash: str
    counts: Counts
    gpus: tuple[GpuSection, ...] = ()
    #: accepted evaluations verified only under the interpreter (CPU): correctness, no time
    interpreter_accepted: int = 0
    _rebuild = {"counts": Counts.from_dict, "gpus": lambda rows: tuple(GpuSection.from_dict(r) for r in rows)}


@dataclass(frozen=True)
class RunRow(_Record):
    id: int
    status: str
    started: str
    ended: str | None
    attempts: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    #: the sum of the run's attempts' proposer latencies (see RunRecord)
    proposer_s: float
    resumes: int
    #: started to ended (None while running); includes time a killed run spent dead
    wall_s: float | None = None


@dataclass(frozen=True)
class ReportData(_Record):
    """Everything one page shows. ``run_id`` None: the whole archive."""

    db: str
    generated: str
    run_id: int | None
    tasks: tuple[TaskSection, ...] = ()
    per_model: tuple[Counts, ...] = ()
    runs: tuple[RunRow, ...] = ()
    #: the baselines the archive records (Baseline.key), and those it has no column for
    baselines: tuple[Baseline, ...] = ()
    missing_baselines: tuple[Baseline, ...] = ()
    not_recorded: tuple[str, ...] = ()
    _rebuild = {
        "tasks": lambda rows: tuple(TaskSection.from_dict(r) for r in rows),
        "per_model": lambda rows: tuple(Counts.from_dict(r) for r in rows),
        "runs": lambda rows: tuple(RunRow.from_dict(r) for r in rows),
        "baselines": lambda rows: tuple(Baseline.from_dict(r) for r in rows),
        "missing_baselines": lambda rows: tuple(Baseline.from_dict(r) for r in rows),
    }

    @property
    def scope(self) -> str:
        return "the whole archive" if self.run_id is None else f"run {self.run_id}"

    @property
    def timed(self) -> bool:
        """Whether anything in scope has a GPU time (a CPU-only archive has none)."""
        return any(g.points for t in self.tasks for g in t.gpus)

    @property
    def totals(self) -> Counts:
        return _sum_counts("all tasks", [t.counts for t in self.tasks])


# ---- reading -----------------------------------------------------------------------------------
_ATTEMPT_COLUMNS = ("id", "run_id", "seq", "task_id", "parent_id", "reuse_of", "proposer", "model", "status",
                    "accepted", "threat", "score", "speedup_eager", "pct_roofline", "gpu", "tokens_in",
                    "tokens_out", "cost_usd", "created")


@guarded
def report_data(archive: Archive, run_id: int | None = None) -> ReportData:
    """The page's data for one run (``run_id``) or the whole archive (None)."""
    runs = archive.runs()
    if run_id is not None and run_id not in {r.id for r in runs}:
        known = ", ".join(str(r.id) for r in runs) or "none"
        raise ArchiveError(f"no run {run_id} in {archive.path} (runs: {known})")
    scope, params = ("WHERE run_id = ?", [run_id]) if run_id is not None else ("", [])
    rows = [dict(zip(_ATTEMPT_COLUMNS, values)) for values in archive.conn.execute(
        f"SELECT {', '.join(_ATTEMPT_COLUMNS)} FROM attempts {scope} ORDER BY id", params)]
    columns = set(archive.columns("measurements"))
    present = tuple(b for b in BASELINES if b.column in columns)
    evaluated = [r["id"] for r in rows if r["accepted"] and r["reuse_of"] is None and r["gpu"] != "cpu"]
    times = _times(archive, evaluated)
    audits = _latest_audits(archive, [i for i in evaluated if i in times])
    tasks = {t["id"]: t for t in archive.db.query("SELECT id, name, source_hash FROM tasks")}
    by_task: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(row)
    sections = [_task_section(archive, tasks[task_id], task_rows, times, audits, present)
                for task_id, task_rows in by_task.items()]
    sections.sort(key=lambda s: (s.task, s.task_id))
    models: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        models.setdefault(row["model"] or row["proposer"] or "-", []).append(row)
    return ReportData(
        db=str(archive.path), generated=datetime.now(timezone.utc).isoformat(timespec="seconds"), run_id=run_id,
        tasks=tuple(sections), per_model=tuple(_counts(key, models[key]) for key in sorted(models)),
        runs=tuple(_run_row(r) for r in runs if run_id is None or r.id == run_id),
        baselines=present, missing_baselines=tuple(b for b in BASELINES if b not in present),
        not_recorded=(GPU_BUSY_NOT_RECORDED,),
    )


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start:start + _CHUNK])


def _times(archive: Archive, ids: Sequence[int]) -> dict[int, float]:
    """Geometric-mean GPU time of record per attempt; attempts with none are left out."""
    per: dict[int, list[float]] = {}
    for chunk in _chunks(ids):
        for attempt_id, time_us in archive.conn.execute(
                f"SELECT attempt_id, time_us FROM measurements WHERE attempt_id IN ({','.join('?' * len(chunk))})"
                f" AND {_TIMED}", chunk):
            per.setdefault(attempt_id, []).append(time_us)
    return {k: t for k, t in ((k, geomean(v)) for k, v in per.items()) if t is not None}


def _latest_audits(archive: Archive, ids: Sequence[int]) -> dict[int, bool]:
    """Whether each audited attempt's latest audit by the installed judge passed (attempts it never
    audited are absent: queries.CURRENT_AUDIT)."""
    out: dict[int, bool] = {}
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        for attempt_id, passed in archive.conn.execute(
                f"SELECT attempt_id, passed FROM audits WHERE id IN (SELECT max(id) FROM audits"
                f" WHERE attempt_id IN ({marks}) AND {CURRENT_AUDIT} GROUP BY attempt_id)", chunk):
            out[attempt_id] = bool(passed)
    return out


def _task_section(archive: Archive, task: Mapping[str, Any], rows: list[dict[str, Any]], times: Mapping[int, float],
                  audits: Mapping[int, bool], baselines: Sequence[Baseline]) -> TaskSection:
    position = {row["id"]: n for n, row in enumerate(rows, start=1)}
    per_gpu: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["id"] in times:
            per_gpu.setdefault(row["gpu"], []).append(row)
    gpus = tuple(_gpu_section(archive, gpu, per_gpu[gpu], position, times, audits, baselines) for gpu in sorted(per_gpu))
    interpreter = sum(1 for r in rows if r["accepted"] and r["reuse_of"] is None and r["gpu"] == "cpu")
    return TaskSection(task=task["name"], task_id=task["id"], source_hash=task["source_hash"],
                       counts=_counts(task["name"], rows), gpus=gpus, interpreter_accepted=interpreter)


def _audit_word(attempt_id: int, audits: Mapping[int, bool]) -> str:
    if attempt_id not in audits:
        return "not audited"
    return "passed" if audits[attempt_id] else "failed"


def _gpu_section(archive: Archive, gpu: str, rows: list[dict[str, Any]], position: Mapping[int, int],
                 times: Mapping[int, float], audits: Mapping[int, bool], baselines: Sequence[Baseline]) -> GpuSection:
    points: list[Point] = []
    best_row: dict[str, Any] | None = None
    for row in rows:
        # the best so far, as `archive best` ranks: highest score, then the lower id, audited only
        if audits.get(row["id"]) and row["score"] is not None and (best_row is None or row["score"] > best_row["score"]):
            best_row = row
        points.append(Point(
            attempt_id=row["id"], n=position[row["id"]], run_id=row["run_id"], seq=row["seq"], created=row["created"],
            time_us=times[row["id"]], score=row["score"], audit=_audit_word(row["id"], audits),
            model=row["model"] or row["proposer"] or "-", best_us=times[best_row["id"]] if best_row else None,
        ))
    passed = sum(1 for r in rows if audits.get(r["id"]) is True)
    failed = sum(1 for r in rows if audits.get(r["id"]) is False)
    if best_row is None:
        return GpuSection(gpu=gpu, points=tuple(points), audits_passed=passed, audits_failed=failed)
    best = next(p for p in points if p.attempt_id == best_row["id"])
    chain = archive.lineage(best.attempt_id)
    return GpuSection(
        gpu=gpu, points=tuple(points), best=best, best_speedup_eager=best_row["speedup_eager"],
        best_pct_roofline=best_row["pct_roofline"], shapes=_shapes(archive, best.attempt_id, baselines),
        lineage=_steps(archive, chain), audits_passed=passed, audits_failed=failed,
    )


def _shapes(archive: Archive, attempt_id: int, baselines: Sequence[Baseline]) -> tuple[ShapeRow, ...]:
    out = []
    for m in archive.db.query("SELECT * FROM measurements WHERE attempt_id = ? ORDER BY idx", [attempt_id]):
        timed = m["timing"] in GPU_TIMINGS and (m["time_us"] or 0) > 0
        label = " ".join(f"{k}={v}" for k, v in json.loads(m["shape"]).items()) or "(default)"
        out.append(ShapeRow(
            label=label, hidden=bool(m["hidden"]), dtype=m["dtype"], timing=m["timing"],
            time_us=m["time_us"] if timed else None,
            baselines={b.key: m[b.column] if timed else None for b in baselines},
            pct_roofline=m["pct_roofline"] if timed else None, bounded=timed and m.get("method") == BOUNDED,
        ))
    return tuple(out)


def _steps(archive: Archive, chain: Sequence[AttemptSummary]) -> tuple[Step, ...]:
    ids = [s.reuse_of or s.id for s in chain]
    accepted = [i for s, i in zip(chain, ids) if s.status == "accepted"]
    times = _times(archive, accepted)
    runs: dict[int, int] = {}
    for chunk in _chunks([s.id for s in chain]):
        runs.update(archive.conn.execute(
            f"SELECT id, run_id FROM attempts WHERE id IN ({','.join('?' * len(chunk))})", chunk))
    return tuple(Step(attempt_id=s.id, run_id=runs[s.id], status=s.status, reason=s.reason,
                      model=s.model or s.proposer or "-", threat=s.threat, score=s.score,
                      time_us=times.get(i), parent_id=s.parent_id, reuse_of=s.reuse_of)
                 for s, i in zip(chain, ids))


def _counts(key: str, rows: Iterable[Mapping[str, Any]]) -> Counts:
    by_status: dict[str, int] = {}
    by_threat: dict[int, int] = {}
    totals = {"attempts": 0, "accepted": 0, "reused": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
    for row in rows:
        totals["attempts"] += 1
        totals["accepted"] += bool(row["accepted"])
        totals["reused"] += row["reuse_of"] is not None
        for name in ("tokens_in", "tokens_out", "cost_usd"):
            totals[name] += row[name] or 0
        by_status[row["status"]] = by_status.get(row["status"], 0) + 1
        if row["threat"]:
            by_threat[row["threat"]] = by_threat.get(row["threat"], 0) + 1
    return Counts(key=key, **totals, by_status=dict(sorted(by_status.items(), key=lambda kv: (-kv[1], kv[0]))),
                  by_threat=dict(sorted(by_threat.items())))


def _sum_counts(key: str, parts: Sequence[Counts]) -> Counts:
    by_status: dict[str, int] = {}
    by_threat: dict[int, int] = {}
    for c in parts:
        for k, v in c.by_status.items():
            by_status[k] = by_status.get(k, 0) + v
        for t, v in c.by_threat.items():
            by_threat[t] = by_threat.get(t, 0) + v
    return Counts(key=key, attempts=sum(c.attempts for c in parts), accepted=sum(c.accepted for c in parts),
                  reused=sum(c.reused for c in parts), tokens_in=sum(c.tokens_in for c in parts),
                  tokens_out=sum(c.tokens_out for c in parts), cost_usd=sum(c.cost_usd for c in parts),
                  by_status=by_status, by_threat=dict(sorted(by_threat.items())))


def _run_row(run: Any) -> RunRow:
    wall = None
    if run.ended:
        wall = (datetime.fromisoformat(run.ended) - datetime.fromisoformat(run.started)).total_seconds()
    return RunRow(id=run.id, status=run.status, started=run.started, ended=run.ended, attempts=run.attempts,
                  tokens_in=run.tokens_in, tokens_out=run.tokens_out, cost_usd=run.cost_usd, proposer_s=run.seconds,
                  resumes=run.resumes, wall_s=wall)


def threat_label(threat: int) -> str:
    return f"#{threat} {THREATS.get(threat, 'unknown class')}"
