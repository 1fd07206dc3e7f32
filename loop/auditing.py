"""``kernforge archive audit``: the archive's would-be bests audited on a GPU, the best first.

A run audits each new best as it finds it (runner.py). This audits what a run could not: attempts
recorded by a run stopped before their audit, archives written before audits existed, or a best
that failed its audit and left the next one unaudited. For each task version and the GPU model of
the chosen device, the scored attempts are taken best first, skipping the demoted ones (latest
audit failed) and the near-ties of the audited best (less than ``score.MIN_GAIN`` above it, which
no run audits either: ``Archive.audit_candidates``): each without an audit is audited (verifier/audit.py:
judged again in a fresh worker on fresh inputs, its time compared with the one recorded) and its
audit recorded, until one passes or one that already passed is reached. That one is the task's
best on that GPU model. At most ``limit`` audits are made per task.

Times are only comparable on the GPU model they were measured on, so only that model's attempts
are audited, and never on the CPU. A task is judged as it is loaded today (the reference a run
named, else the built-in of that name); attempts judged against another version of it are left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernforge.archive.export_queries import TaskVersion, task_versions
from kernforge.archive.records import AttemptRecord, AuditRecord, TaskRecord
from kernforge.archive.store import Archive, gpu_label, private_files
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Task
from kernforge.verifier import audit as auditing
from kernforge.verifier.judge import JudgeOptions

from .errors import LoopError
from .evaluate import open_judge, resolve_device

#: audits made per task and GPU model at most, unless asked otherwise
DEFAULT_LIMIT = 5


@dataclass(frozen=True)
class AuditOutcome:
    """One attempt looked at: audited now (``audit``), or found already passed (``audit`` None)."""

    task: str
    gpu: str
    attempt_id: int
    score: float | None
    audit: AuditRecord | None = None

    def line(self) -> str:
        head = f"{self.task} on {self.gpu}: attempt {self.attempt_id} (score {_x(self.score)})"
        if self.audit is None:
            return f"{head} already passed its audit: the best"
        if self.audit.passed:
            return f"{head} passed: {self.audit.audit.reason}; the best"
        return f"{head} FAILED: {self.audit.audit.reason}; demoted"

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "gpu": self.gpu, "attempt_id": self.attempt_id, "score": self.score,
                "audit": self.audit.to_dict() if self.audit else None}


@dataclass(frozen=True)
class AuditReport:
    db: Path
    device: str | None = None
    gpu: str | None = None
    outcomes: tuple[AuditOutcome, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def audited(self) -> int:
        return sum(1 for o in self.outcomes if o.audit is not None)

    def lines(self) -> list[str]:
        out = [o.line() for o in self.outcomes]
        out += self.notes
        if self.device is not None:
            failed = sum(1 for o in self.outcomes if o.audit is not None and not o.audit.passed)
            out.append(f"{self.audited} audit(s) on {self.device} ({self.gpu}): {self.audited - failed} passed, "
                       f"{failed} failed; see `kernforge archive best --db {self.db}`")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"db": str(self.db), "device": self.device, "gpu": self.gpu,
                "outcomes": [o.to_dict() for o in self.outcomes], "notes": list(self.notes)}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def audit_archive(db: str | Path, *, task: str | None = None, gpu: int | None = None, sandbox: str = "process",
                  limit: int = DEFAULT_LIMIT) -> AuditReport:
    """Audit, on GPU ``gpu``, each task's best attempts that have no passing audit (see the module
    docstring); every audit is recorded as it is made."""
    if limit < 1:
        raise LoopError(f"--limit must be at least 1, not {limit}")
    db = Path(db)
    with Archive.open(db) as archive:
        versions = [v for v in task_versions(archive) if task is None or v.name == task]
        if task is not None and not versions:
            known = ", ".join(sorted({v.name for v in task_versions(archive)})) or "none"
            raise LoopError(f"--task {task}: no task of that name in {db} (tasks: {known})")
        models = archive.gpu_models()
        work = {(v, m) for v in versions for m in models if _open(archive.audit_candidates(v.id, m, 1))}
        if not work:
            return AuditReport(db, notes=("nothing to audit: on each task and GPU model the top-scored accepted attempt "
                                          "(demoted ones aside) has passed its audit" if models else
                                          "nothing to audit: the archive holds no attempt verified on a GPU",))
        pending = sorted({m for _, m in work})
        device = resolve_device(gpu)
        if device == "cpu":
            raise LoopError(f"auditing needs the GPU the times were measured on ({', '.join(pending)}); "
                            "no GPU is visible here")
        notes: list[str] = []
        # each task as it loads today (its metadata then stays out of the candidates' sight)
        loaded = {v: _load(archive, v, notes) for v in versions if any(v is w for w, _ in work)}
        tasks = [t for t in loaded.values() if t is not None]
        with open_judge(device, sandbox=sandbox, pool_size=1, tasks=tasks,
                        options=JudgeOptions(private_paths=private_files(db))) as judge:
            model = gpu_label(judge.environment())
            if model not in pending:
                raise LoopError(f"auditing needs the GPU the times were measured on: the attempts to audit were timed "
                                f"on {', '.join(pending)}, and {device} is {'a CPU' if model == 'cpu' else model}")
            outcomes: list[AuditOutcome] = []
            for version in versions:
                if (version, model) in work and loaded.get(version) is not None:
                    _audit_task(archive, judge, version, loaded[version], model, limit, outcomes, notes)
    return AuditReport(db, device, model, tuple(outcomes), tuple(notes))


def _open(candidates: list[AttemptRecord]) -> bool:
    """The best candidate has no audit yet (a passed one means the task's best stands)."""
    return bool(candidates) and candidates[0].audit_passed is None


def _audit_task(archive: Archive, judge: Any, version: TaskVersion, task: Task, model: str, limit: int,
                outcomes: list[AuditOutcome], notes: list[str]) -> None:
    made = 0
    for record in archive.audit_candidates(version.id, model, limit + 1):
        if record.audit_passed:
            outcomes.append(AuditOutcome(version.name, model, record.id, record.score))
            return
        if made == limit:
            notes.append(f"{version.name} on {model}: stopped after {limit} audit(s) without a pass (--limit)")
            return
        result = auditing.audit(judge, record.code, task, record.verdict)
        stored = archive.record_audit(record.id, result)
        made += 1
        outcomes.append(AuditOutcome(version.name, model, record.id, record.score, stored))
        if result.passed:
            return


def _load(archive: Archive, version: TaskVersion, notes: list[str]) -> Task | None:
    """The task as it is today, if it is the version the attempts were judged against."""
    ref = archive.task_refs().get(version.name, version.name)
    try:
        task = load_task(ref)
    except TaskError as error:
        notes.append(f"{version.name}: not audited: its reference cannot be loaded from {ref!r} ({error})")
        return None
    if TaskRecord.from_task(task).source_hash != version.source_hash:
        notes.append(f"{version.name}: not audited: its attempts (task version {version.id}) were judged against "
                     f"another version of the task than {ref!r} holds today (reference or checks changed)")
        return None
    return task
