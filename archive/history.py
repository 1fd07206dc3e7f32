"""What the loop learns from at start: a task's past attempts as light rows, and a run's own.

The loop carries its learning across runs through the archive alone: lessons are distilled from
the rejections here, the strategy bandit's arms are re-scored from ``proposer``/``model`` and the
parent links, budgets of a resumed run are counted from its rows, and the offline tuner is told
which configurations were tried. ``HistoryRow`` holds no code or prompt (cheap for thousands of
rows); ``judged_code`` fetches only the code and verdict of the attempts the offline tuner is told
of (no prompt or response).

``time_us`` is the geometric mean of an accepted attempt's GPU-timed per-shape times (graph or
eager; a reuse row shows its original's): it ranks GPU kernels whose ``torch.compile`` baseline
was unavailable (no score) against each other, within one task and environment. Interpreter
(CPU) times are correctness-only figures and never rank anything, so a CPU row has none. A
run's rows (``run_history``, read to count a resumed run's budget) go without it.

``evidence`` is the part of a verdict's evidence that lessons read (the same keys as
``Rejected.evidence``, so an archived row and a live verdict are classified alike): the error
text of a compile or runtime failure (its last 2,000 characters), the extraction ``kind``, the
first static-screen finding, the input distribution. The check itself is ``check``. A rejection
made after the candidate was called at a hidden shape keeps only that mark (``SAW_HIDDEN``): what
it said from then on could spell the shape (prompts/feedback.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from kernforge.verifier.verdict import NOT_TIMED, SAW_HIDDEN, Verdict, saw_hidden

from .queries import guarded
from .score import GPU_TIMINGS, geomean
from .store import Archive

_COLUMNS = (
    "id", "run_id", "seq", "task_id", "parent_id", "reuse_of", "proposer", "model", "status", "accepted",
    "threat", "reason", "evidence", "score", "gpu", "env_key", "created", "code_hash", "tokens_in",
    "tokens_out", "cost_usd", "latency_s",
)
#: evidence keys a row keeps (see the module docstring); anything else stays in the archive
_EVIDENCE_KEPT = ("error", "kind", "findings", "dist")


@dataclass(frozen=True)
class HistoryRow:
    id: int
    run_id: int
    seq: int
    task_id: int
    parent_id: int | None
    reuse_of: int | None
    proposer: str
    model: str
    status: str
    accepted: bool
    threat: int | None
    reason: str
    #: the evidence's ``check`` (which defence decided; ``Check.parse`` reads it), "" when absent
    check: str
    #: what lessons read of the rest of the evidence (see the module docstring)
    evidence: Mapping[str, Any]
    score: float | None
    time_us: float | None
    gpu: str
    env_key: str
    created: str
    code_hash: str
    tokens_in: int
    tokens_out: int
    cost_usd: float
    latency_s: float


@guarded
def _rows(archive: Archive, where: str, params: list[Any], limit: int | None, *,
          with_times: bool = True) -> list[HistoryRow]:
    # newest `limit` rows, returned oldest first
    tail = f" ORDER BY id DESC LIMIT {int(limit)}" if limit else " ORDER BY id DESC"
    raw = archive.conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM attempts WHERE {where}{tail}", params).fetchall()
    raw.reverse()
    sources = {r[_COLUMNS.index("reuse_of")] or r[0] for r in raw if r[_COLUMNS.index("accepted")]}
    times = _geomean_times(archive, sources) if with_times else {}
    out = []
    for values in raw:
        row = dict(zip(_COLUMNS, values))
        try:
            evidence = json.loads(row.pop("evidence") or "{}")
        except ValueError:
            evidence = {}
        evidence = evidence if isinstance(evidence, dict) else {}
        out.append(HistoryRow(
            **{k: row[k] for k in _COLUMNS if k not in ("evidence", "accepted", "proposer", "model")},
            proposer=row["proposer"] or "", model=row["model"] or "", accepted=bool(row["accepted"]),
            check=str(evidence.get("check") or ""), evidence=_kept(evidence),
            time_us=times.get(row["reuse_of"] or row["id"]),
        ))
    return out


def _kept(evidence: Mapping[str, Any]) -> dict[str, Any]:
    if saw_hidden(evidence):
        # made after a hidden shape: the mark alone, never the candidate's text (a lesson replayed
        # from it is the one "failed at a hidden shape", as it was when the run made it)
        return {SAW_HIDDEN: True}
    out = {k: evidence[k] for k in _EVIDENCE_KEPT if evidence.get(k) is not None}
    if isinstance(out.get("error"), str):
        out["error"] = out["error"][-2000:]
    if isinstance(out.get("findings"), list):
        out["findings"] = out["findings"][:1]  # the first finding is the one the reason names
    return out


def _geomean_times(archive: Archive, ids: Iterable[int]) -> dict[int, float]:
    """GPU-timed geometric means by attempt over its public shapes, as the score's (score.ranked;
    interpreter times are never ranked: none here)."""
    ids = list(ids)
    times: dict[int, list[float]] = {}
    timings = ", ".join(f"'{t}'" for t in GPU_TIMINGS)
    for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
        chunk = ids[start:start + 500]
        cur = archive.conn.execute(
            f"SELECT attempt_id, time_us FROM measurements WHERE attempt_id IN ({','.join('?' * len(chunk))})"
            f" AND time_us > 0 AND timing IN ({timings}) AND hidden = 0", chunk)
        for attempt_id, time_us in cur:
            times.setdefault(attempt_id, []).append(time_us)
        # a verdict with shapes not timed (verifier/contender.py) has no ranked time
        for (attempt_id,) in archive.conn.execute(
                f"SELECT DISTINCT attempt_id FROM measurements WHERE attempt_id IN ({','.join('?' * len(chunk))})"
                " AND timing = ?", [*chunk, NOT_TIMED]):
            times.pop(attempt_id, None)
    return {k: geomean(v) for k, v in times.items()}


def task_history(archive: Archive, task_id: int, *, limit: int | None = 5000) -> list[HistoryRow]:
    """The newest ``limit`` attempts of one task (every environment), oldest first."""
    return _rows(archive, "task_id = ?", [task_id], limit)


def run_history(archive: Archive, run_id: int) -> list[HistoryRow]:
    """Every attempt of one run, oldest first, without ``time_us`` (a resumed run counts its
    budget from these)."""
    return _rows(archive, "run_id = ?", [run_id], None, with_times=False)


@guarded
def judged_code(archive: Archive, ids: Sequence[int]) -> list[tuple[str, Verdict]]:
    """(code, verdict) of these attempts, in id order: no prompt, response or other columns."""
    out: list[tuple[str, Verdict]] = []
    ids = sorted(set(ids))
    for start in range(0, len(ids), 500):  # stay under SQLite's bound-parameter limit
        chunk = ids[start:start + 500]
        rows = list(archive.db.query(
            "SELECT id, reuse_of, code, status, reason, threat, evidence, env_key FROM attempts"
            f" WHERE id IN ({','.join('?' * len(chunk))}) ORDER BY id", chunk))
        out += [(row["code"], verdict) for row, verdict in zip(rows, archive._verdicts(rows))]
    return out
