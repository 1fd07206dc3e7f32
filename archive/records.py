"""What the archive takes and gives back: frozen records with ``to_dict``/``from_dict``.

``to_dict`` output is plain JSON (it is what ``kernforge archive ... --json`` prints);
``from_dict(to_dict(r)) == r`` for every record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable, ClassVar, Mapping

from kernforge.tasks.spec import Task
from kernforge.verifier import revision
from kernforge.verifier.audit import Audit
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Verdict, verdict_from_dict

from .content import text_hash


def _plain(value: Any) -> Any:
    if isinstance(value, (Accepted, Rejected, ShapeResult, Audit, _Record)):
        return value.to_dict()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _shapes(items: Any) -> tuple[ShapeResult, ...]:
    return tuple(ShapeResult.from_dict(s) for s in items)


def _int_keys(mapping: Mapping[Any, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in mapping.items()}


class _Record:
    #: field name -> how to rebuild it from its ``to_dict`` form (nested records, int keys)
    _rebuild: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: v for k, v in data.items() if k in names}
        for name, rebuild in cls._rebuild.items():
            if kwargs.get(name) is not None:
                kwargs[name] = rebuild(kwargs[name])
        for f in fields(cls):  # type: ignore[arg-type]
            if isinstance(kwargs.get(f.name), list):
                kwargs[f.name] = tuple(kwargs[f.name])
        return cls(**kwargs)


@dataclass(frozen=True)
class TaskRecord(_Record):
    """A task as the archive knows it: a new reference or new hidden checks make a new task row."""

    name: str
    source_hash: str
    spec: Mapping[str, Any]
    id: int | None = None

    @classmethod
    def from_task(cls, task: Task) -> "TaskRecord":
        # The hash covers what decides a verdict, hidden checks included, so a verdict is only
        # reused against the exact checks that produced it. The stored spec is the public one.
        judged = task.public_spec() | {
            "hidden_shapes": [s.as_dict() for s in task.hidden_shapes],
            "cpu_shapes": [s.as_dict() for s in task.cpu_public_shapes + task.cpu_hidden_shapes],
            "distributions": list(task.distributions),
        }
        return cls(task.name, text_hash(json.dumps(judged, sort_keys=True)), task.public_spec())


@dataclass(frozen=True)
class RunRecord(_Record):
    """One invocation of the loop. Budget spent is updated in the same transaction as each attempt.

    ``seconds`` is the run's wall time so far (its sessions together, written by the process
    running it as it goes and when it stops); ``owner`` is the process running it now (None once
    it stopped) and ``heartbeat`` when that process last said it is alive.
    """

    id: int
    config: Mapping[str, Any]
    started: str
    status: str
    ended: str | None = None
    attempts: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    resumes: int = 0
    owner: str | None = None
    heartbeat: str | None = None


@dataclass(frozen=True)
class RunStatus(_Record):
    """What a run has, for resuming it: its attempts by sequence number."""

    run: RunRecord
    attempts: Mapping[int, int] = field(default_factory=dict)  # seq -> attempt id
    _rebuild = {"run": RunRecord.from_dict, "attempts": _int_keys}

    @property
    def next_seq(self) -> int:
        """The first sequence number the run has not recorded (seqs are dense from 0)."""
        return max(self.attempts, default=-1) + 1


@dataclass(frozen=True)
class NewAttempt(_Record):
    """One proposal and its verdict, as the loop hands it to ``Archive.record_attempt``.

    ``(run_id, seq)`` is the idempotency key: recording it again returns the first attempt id
    and writes nothing. ``reuse_of`` names the archived attempt whose verdict was reused (from
    ``Archive.lookup``) instead of evaluating again; ``environment`` defaults to the verdict's.
    """

    run_id: int
    seq: int
    task_id: int
    code: str
    verdict: Verdict
    environment: Mapping[str, Any] = field(default_factory=dict)
    parent_id: int | None = None
    proposer: str = ""
    model: str = ""
    prompt: str = ""
    response: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    reuse_of: int | None = None
    _rebuild = {"verdict": verdict_from_dict}


@dataclass(frozen=True)
class AttemptRecord(_Record):
    """An archived attempt with its verdict (per-shape results included)."""

    id: int
    run_id: int
    seq: int
    task_id: int
    task: str
    code: str
    code_hash: str
    verdict: Verdict
    env_key: str
    gpu: str
    created: str
    parent_id: int | None = None
    proposer: str = ""
    model: str = ""
    prompt: str = ""
    response: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    score: float | None = None
    speedup_eager: float | None = None
    pct_roofline: float | None = None
    reuse_of: int | None = None
    #: whether the latest audit of the evaluation (the original, for a reuse row) passed; None when
    #: it was never audited. Only an attempt whose latest audit passed can be a best.
    audit_passed: bool | None = None
    _rebuild = {"verdict": verdict_from_dict}


@dataclass(frozen=True)
class AuditRecord(_Record):
    """One audit of an evaluated attempt (``Archive.record_audit``): the ``Audit`` itself, and where
    it belongs. ``run_id`` is None for an audit made by ``kernforge archive audit``."""

    id: int
    attempt_id: int
    task_id: int
    gpu: str
    created: str
    audit: Audit
    run_id: int | None = None
    #: the fingerprint of the judge that made it (verifier/revision.py; None: before fingerprints)
    judge: str | None = None
    _rebuild = {"audit": Audit.from_dict}

    @property
    def passed(self) -> bool:
        return self.audit.passed

    @property
    def current(self) -> bool:
        """Made by the installed judge: only such an audit makes a best."""
        return self.judge == revision.fingerprint()


@dataclass(frozen=True)
class AwaitingAudit(_Record):
    """A task and GPU model with accepted, scored attempts of which none passed its latest audit, so
    it has no best yet (``kernforge archive audit`` audits them)."""

    task: str
    gpu: str
    #: scored evaluations (not reuse rows) of the task on this GPU model
    accepted: int
    #: of those, how many have an audit, and how many of those audits failed (demoted)
    audited: int = 0
    failed: int = 0
    #: passed an audit by an earlier judge only (verifier/revision.py): audited again before it counts
    earlier: int = 0


@dataclass(frozen=True)
class AttemptSummary(_Record):
    """One line about an attempt (lineage, search results)."""

    id: int
    task: str
    status: str
    reason: str
    created: str
    parent_id: int | None = None
    threat: int | None = None
    model: str = ""
    proposer: str = ""
    score: float | None = None
    gpu: str = ""
    reuse_of: int | None = None


@dataclass(frozen=True)
class BestEntry(_Record):
    """The best attempt for one task (one task version) on one GPU model, by score, among the
    attempts whose latest audit passed; ``audit`` is that audit."""

    task: str
    task_id: int
    source_hash: str
    gpu: str
    attempt_id: int
    score: float
    speedup_eager: float | None
    pct_roofline: float | None
    model: str
    created: str
    shapes: tuple[ShapeResult, ...] = ()
    audit: AuditRecord | None = None
    _rebuild = {"shapes": _shapes, "audit": AuditRecord.from_dict}


@dataclass(frozen=True)
class TaskBaselines(_Record):
    """The baselines of one task version on one GPU model, as its newest GPU-timed accepted
    attempt measured them beside it (eager, torch.compile, a library), with each shape's floor."""

    task: str
    gpu: str
    attempt_id: int
    shapes: tuple[ShapeResult, ...] = ()
    _rebuild = {"shapes": _shapes}


@dataclass(frozen=True)
class ShapeBest(_Record):
    """The fastest accepted GPU time for one shape of one task on one GPU model."""

    task: str
    gpu: str
    label: str
    attempt_id: int
    time_us: float
    hidden: bool
    dtype: str
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    pct_roofline: float | None = None
    #: its time of record is a bound (ShapeResult.bounded)
    bounded: bool = False


@dataclass(frozen=True)
class StatRow(_Record):
    """Counts for one task or one model. Reused proposals count as attempts (they cost tokens)."""

    key: str
    attempts: int = 0
    accepted: int = 0
    reused: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    by_status: Mapping[str, int] = field(default_factory=dict)
    cheats: Mapping[int, int] = field(default_factory=dict)  # THREATS class -> attempts caught
    _rebuild = {"cheats": _int_keys}

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.attempts if self.attempts else 0.0

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"acceptance_rate": self.acceptance_rate}


@dataclass(frozen=True)
class Stats(_Record):
    per_task: tuple[StatRow, ...] = ()
    per_model: tuple[StatRow, ...] = ()
    _rebuild = {
        "per_task": lambda rows: tuple(StatRow.from_dict(r) for r in rows),
        "per_model": lambda rows: tuple(StatRow.from_dict(r) for r in rows),
    }


def _attempts(items: Any) -> tuple[AttemptRecord, ...]:
    return tuple(AttemptRecord.from_dict(a) for a in items)


@dataclass(frozen=True)
class Population(_Record):
    """Candidates for parents and inspirations. No attempt (and no code) appears twice.

    ``top``: the best accepted by score (audited or not: each record says); ``audited``: the best by
    score whose latest audit passed (the task's best on this GPU) when ``top`` does not hold it;
    ``diverse``: accepted attempts spread evenly over the ranks below the top (a range of ideas,
    not the k best again); ``recent``: the newest accepted
    ones not chosen yet (what the run just found, scored or not); ``failures``: the newest
    rejections worth repairing (compile, runtime, correctness, timeout, crash, static screen;
    never cheats or sandbox violations, which must not be evolved from).
    """

    top: tuple[AttemptRecord, ...] = ()
    diverse: tuple[AttemptRecord, ...] = ()
    recent: tuple[AttemptRecord, ...] = ()
    failures: tuple[AttemptRecord, ...] = ()
    audited: tuple[AttemptRecord, ...] = ()
    _rebuild = {"top": _attempts, "diverse": _attempts, "recent": _attempts, "failures": _attempts,
                "audited": _attempts}

    @property
    def members(self) -> tuple[AttemptRecord, ...]:
        return self.top + self.audited + self.diverse + self.recent + self.failures
