"""``kernforge export``: the archive's best verified kernels as a pip-installable package.

What is chosen (``plan_export``), for each task the archive holds (or each ``--tasks`` names):

* Only accepted evaluations of the task *as it is now*: the archive row whose source hash is the
  hash of the task loaded today. Verdicts judged against another version of the reference or of
  the hidden checks are left out, with a note.
* Only audited kernels: an attempt whose latest audit passed (judged again in a fresh worker on
  fresh inputs, its time confirmed; the rule ``Archive.best`` follows). Attempts never audited, or
  demoted by a failed audit, are left out with a note naming ``kernforge archive audit``; the
  manifest records each kernel's audit.
* Environments: every GPU by default, or those whose name contains a ``--gpu`` pattern. Kernels
  verified under the Triton interpreter (a CPU) are never exported: an interpreter verdict checks
  correctness only, and its times (the judge's wall clock on a CPU) are never ranked, so nothing
  there says which kernel is best. A task whose accepted kernels are all interpreter-verified
  gets a note saying it has no GPU-verified kernel; ``--gpu cpu`` is refused with the same reason.
* Groups: entries are keyed by (architecture, dtype), e.g. (sm_90, bfloat16). Times are compared
  within one GPU model only; where several models share an architecture the one with the most
  measurements is used and the others are noted.
* Buckets: every shape measured in a group is a bucket, and its kernel is the fastest accepted
  one there. A bucket keeps the PyTorch reference when that kernel's speedup over ``--baseline``
  (``eager`` by default: the reference is what the op runs otherwise) is below
  ``--min-speedup``.
* Every shape the group's kernels were verified on, timed or not, decides which axes of the
  dispatch vector are *fixed* (one value everywhere): the package falls back to the reference
  for any other value there, since no kernel was ever checked at it.

An op none of whose buckets holds a kernel is left out; when nothing is left ``NothingToExport``
says why for each task. Writing the package is export_write.py; the package's own runtime and
tests are the files in export_template/.
"""

from __future__ import annotations

import keyword
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape, Task

from . import export_inspect
from .errors import ArchiveError
from .export_inspect import Signature, UnsupportedTask
from .export_queries import (
    Measured,
    TaskVersion,
    accepted_count,
    accepted_shapes,
    task_versions,
)
from .records import AttemptRecord, AuditRecord, TaskRecord
from .score import roofline_pct, speedup_vs_compile, speedup_vs_eager, speedup_vs_library
from .store import Archive

BASELINES = ("eager", "compile")
#: ``--gpu`` values that would select kernels verified under the Triton interpreter (refused)
CPU_PATTERNS = ("cpu", "interpreter")
INTERPRETER_ONLY = ("kernels verified under the Triton interpreter are checked for correctness only (their times "
                    "are never ranked), so none is exported")
DEFAULT_NAME = "kernforge_kernels"
#: names the exported package itself defines; an op of that name is prefixed with ``op_``
PACKAGE_NAMES = {"ops", "tasks", "testing", "counters", "reset_counters", "explain", "manifest", "arch_of",
                 "interpreting", "torch", "annotations"}
#: package names that would shadow or clash with what the package imports or registers into
RESERVED_NAMES = {"torch", "triton", "aten", "prim", "prims", "kernforge", "numpy", "test", "tests"}


class ExportError(ArchiveError):
    """The export was asked for something it cannot do (bad name, occupied folder, unknown task)."""


class NothingToExport(ExportError):
    """The archive holds no kernel that meets the request; the message says why, task by task."""


@dataclass(frozen=True)
class ExportOptions:
    name: str = DEFAULT_NAME
    tasks: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    min_speedup: float = 1.0
    baseline: str = "eager"
    force: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or keyword.iskeyword(self.name) or self.name.startswith("_"):
            raise ExportError(f"--name {self.name!r} must be a Python identifier such as {DEFAULT_NAME}")
        if self.name.lower() in RESERVED_NAMES:
            raise ExportError(f"--name {self.name!r} would clash with a package it imports; choose another")
        if self.baseline not in BASELINES:
            raise ExportError(f"--baseline must be one of {', '.join(BASELINES)}, not {self.baseline!r}")
        if not self.min_speedup >= 0:
            raise ExportError(f"--min-speedup must be a number >= 0, not {self.min_speedup!r}")
        for pattern in self.gpus:
            if pattern.lower() in CPU_PATTERNS:
                raise ExportError(f"--gpu {pattern}: {INTERPRETER_ONLY}; export from an archive with GPU-verified kernels")


@dataclass(frozen=True)
class Bucket:
    """One verified shape of a group, and what runs there."""

    shape: Mapping[str, int]
    vector: tuple[int | float, ...]
    #: kernel id ("a17"), or None where the reference stays
    kernel: str | None
    #: the fastest accepted measurement at this shape (also kept when the reference stays)
    evidence: Mapping[str, Any]
    reason: str = ""


@dataclass(frozen=True)
class Group:
    arch: str
    gpu: str
    dtype: str
    #: dtype and rank of each argument as verified (None for scalars)
    inputs: tuple[Mapping[str, Any] | None, ...]
    #: dispatch-vector index -> the one value every verified shape had there
    fixed: Mapping[int, int | float]
    buckets: tuple[Bucket, ...]


@dataclass(frozen=True)
class OpPlan:
    op: str
    task: Task
    version: TaskVersion
    signature: Signature
    axes: tuple[str, ...]
    groups: tuple[Group, ...]
    kernels: Mapping[str, AttemptRecord]
    #: kernel id -> the passing audit it was chosen on
    audits: Mapping[str, AuditRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportPlan:
    name: str
    archive: Path
    options: ExportOptions
    ops: tuple[OpPlan, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExportResult:
    out: Path
    plan: ExportPlan
    files: tuple[Path, ...] = field(default=())


def op_name(task_name: str) -> str:
    """The Python and torch.library name of a task's op: ``1_Square_matmul`` -> ``op_1_square_matmul``."""
    name = re.sub(r"\W+", "_", task_name).strip("_").lower() or "op"
    if name[0].isdigit() or keyword.iskeyword(name) or name in PACKAGE_NAMES:
        name = f"op_{name}"
    return name


def export(db: str | Path, out: str | Path, options: ExportOptions = ExportOptions()) -> ExportResult:
    """Plan from the archive at ``db`` and write the package into ``out``."""
    from .export_write import write_package

    with Archive.open(db, readonly=True) as archive:
        plan = plan_export(archive, options)
    files = write_package(plan, Path(out))
    return ExportResult(out=Path(out), plan=plan, files=tuple(files))


def plan_export(archive: Archive, options: ExportOptions) -> ExportPlan:
    versions = task_versions(archive)
    if not versions:
        raise NothingToExport(f"nothing to export: {archive.path} holds no tasks and no attempts yet")
    by_name: dict[str, list[TaskVersion]] = defaultdict(list)
    for v in versions:
        by_name[v.name].append(v)
    notes: list[str] = []
    ops: list[OpPlan] = []
    for ref in options.tasks or sorted(by_name):
        task = _resolve(ref, by_name, explicit=bool(options.tasks), notes=notes)
        if task is None:
            continue
        try:
            op = _plan_task(archive, task, by_name[task.name], options, notes)
        except UnsupportedTask as why:
            notes.append(str(why))
            continue
        if op is not None:
            ops.append(op)
    names = Counter(op.op for op in ops)
    clashes = sorted(n for n, c in names.items() if c > 1)
    if clashes:
        raise ExportError(f"several tasks map to the op name(s) {', '.join(clashes)}; export them separately")
    if not ops:
        hint = ""
        if any(INTERPRETER_ONLY in n for n in notes):
            hint = ("\nTo have kernels to export, run `kernforge run` on a machine with a GPU (its kernels are timed and "
                    "audited there); `kernforge export --check` on its archive then works on this machine too (without "
                    "a GPU the package's tests run on the CPU)")
        raise NothingToExport("nothing to export from " + str(archive.path) + ":\n  " + "\n  ".join(notes) + hint)
    return ExportPlan(options.name, Path(archive.path), options, tuple(ops), tuple(notes))


def _resolve(ref: str, by_name: Mapping[str, list[TaskVersion]], *, explicit: bool, notes: list[str]) -> Task | None:
    try:
        task = load_task(ref)
    except TaskError as error:
        if explicit:
            raise ExportError(f"--tasks {ref}: {error}") from None
        notes.append(f"{ref}: not a built-in task here, so its reference cannot be read; "
                     "name its file or folder with --tasks")
        return None
    if task.name not in by_name:
        known = ", ".join(sorted(by_name))
        raise ExportError(f"--tasks {ref}: the archive has no task named {task.name!r} (it has: {known})")
    return task


def _plan_task(archive: Archive, task: Task, versions: Sequence[TaskVersion], options: ExportOptions,
               notes: list[str]) -> OpPlan | None:
    digest = TaskRecord.from_task(task).source_hash
    current = [v for v in versions if v.source_hash == digest]
    older = [v for v in versions if v.source_hash != digest and accepted_count(archive, v.id)]
    if older:
        notes.append(f"{task.name}: accepted attempts judged against {len(older)} other version(s) of the task "
                     "(reference or checks changed since) are not exported")
    if not current:
        notes.append(f"{task.name}: no attempt was judged against the task as it is now")
        return None
    measured = accepted_shapes(archive, current[0].id)
    if not measured:
        notes.append(f"{task.name}: no accepted attempt")
        return None
    if all(_interpreted(m.environment) for m in measured):
        kernels = len({m.attempt_id for m in measured})
        notes.append(f"{task.name}: no GPU-verified kernel; its {kernels} accepted kernel(s) were verified under the "
                     f"Triton interpreter only, and {INTERPRETER_ONLY}")
        return None
    gpu_rows = [m for m in measured if not _interpreted(m.environment)]
    latest = archive.latest_audits([m.attempt_id for m in gpu_rows])
    audited = [m for m in gpu_rows if m.attempt_id in latest and latest[m.attempt_id].passed]
    kernels_on_gpu = {m.attempt_id for m in gpu_rows}
    left = len(kernels_on_gpu) - len({m.attempt_id for m in audited})
    if left:
        failed = sum(1 for i in kernels_on_gpu if i in latest and not latest[i].passed)
        unaudited = [i for i in kernels_on_gpu if i not in latest]
        before = archive.latest_audits(unaudited, any_judge=True)
        earlier = sum(1 for a in before.values() if a.passed)
        never = len(unaudited) - len(before)
        why = ", ".join(part for part in (f"{failed} failed their audit" if failed else "",
                                          f"{len(before)} audited by an earlier version of the judge only ({earlier} "
                                          "passed), which counts no more" if before else "",
                                          f"{never} never audited" if never else "")
                       if part)
        notes.append(f"{task.name}: {left} of {len(kernels_on_gpu)} accepted GPU kernel(s) have no passing audit "
                     f"({why}); not exported (`kernforge archive audit --task {task.name}` audits the best)")
    if not audited:
        return None
    chosen = [m for m in audited if _selected(m.environment, options.gpus)]
    if not chosen:
        notes.append(f"{task.name}: no audited attempt in the selected environments ({_describe_envs(audited)})")
        return None
    signature = export_inspect.signature(task)
    groups: list[Group] = []
    for (arch, dtype), rows in sorted(_grouped(chosen, notes, task.name).items()):
        group = _plan_group(task, arch, dtype, rows, options, notes)
        if group is not None:
            groups.append(group)
    if not groups:
        return None
    ids = sorted({b.evidence["attempt_id"] for g in groups for b in g.buckets if b.kernel})
    kernels = {f"a{i}": archive.get_attempt(i) for i in ids}
    axes = tuple(export_inspect.axis_names(task, signature))
    return OpPlan(op_name(task.name), task, current[0], signature, axes, tuple(groups), kernels,
                  {f"a{i}": latest[i] for i in ids})


def _interpreted(env: Mapping[str, Any]) -> bool:
    return env.get("device") == "cpu" or not env.get("gpu")


def _selected(env: Mapping[str, Any], patterns: Sequence[str]) -> bool:
    """A GPU environment that ``--gpu`` selects (every GPU without patterns); never the interpreter."""
    if _interpreted(env):
        return False
    return not patterns or any(p.lower() in str(env["gpu"]).lower() for p in patterns)


def _describe_envs(measured: Sequence[Measured]) -> str:
    names = sorted({str(m.environment["gpu"]) for m in measured if not _interpreted(m.environment)})
    return "it has kernels verified on " + ", ".join(names)


def _grouped(rows: Sequence[Measured], notes: list[str], task: str) -> dict[tuple[str, str], list[Measured]]:
    """Rows by (architecture, dtype), one GPU model per architecture (GPU rows only: see _selected)."""
    by_key: dict[tuple[str, str], list[Measured]] = defaultdict(list)
    for m in rows:
        arch = m.environment.get("arch")
        if not arch:
            notes.append(f"{task}: attempt {m.attempt_id} has no GPU architecture in its environment; left out")
            continue
        by_key[(str(arch), m.shape.dtype)].append(m)
    out = {}
    for key, items in by_key.items():
        models = Counter(str(m.environment["gpu"]) for m in items)
        keep = sorted(models, key=lambda g: (-models[g], g))[0]
        if len(models) > 1:
            others = ", ".join(sorted(g for g in models if g != keep))
            notes.append(f"{task} {key[0]}/{key[1]}: times of {keep} used; those of {others} left out "
                         "(times are compared within one GPU model)")
        out[key] = [m for m in items if str(m.environment["gpu"]) == keep]
    return out


def _plan_group(task: Task, arch: str, dtype: str, rows: Sequence[Measured], options: ExportOptions,
                notes: list[str]) -> Group | None:
    shapes = {_key(m.shape.shape): m.shape.shape for m in rows}
    vectors = {k: export_inspect.dispatch_vector(task, Shape.of(s)) for k, s in shapes.items()}
    lengths = {len(v) for v in vectors.values()}
    if len(lengths) != 1:
        notes.append(f"{task.name} {arch}/{dtype}: verified shapes give arguments of different ranks; left out")
        return None
    first = next(iter(vectors.values()))
    fixed = {i: first[i] for i in range(len(first)) if len({v[i] for v in vectors.values()}) == 1}

    best: dict[tuple, Measured] = {}
    for m in rows:
        t = m.shape.time_us
        if t is None or t <= 0:
            continue
        k = _key(m.shape.shape)
        if k not in best or (t, m.attempt_id) < (best[k].shape.time_us, best[k].attempt_id):
            best[k] = m
    if not best:
        notes.append(f"{task.name} {arch}/{dtype}: accepted, but no shape was timed; left out")
        return None
    buckets = []
    for k in sorted(best, key=lambda k: vectors[k]):
        m = best[k]
        evidence = _evidence(m)
        kernel, reason = f"a{m.attempt_id}", ""
        speedup = evidence["speedup_" + options.baseline]
        if speedup is None or speedup < options.min_speedup:
            shown = "no" if speedup is None else f"{speedup:.2f}x"
            kernel = None
            reason = f"the fastest kernel measured {shown} speedup vs {options.baseline} (< {options.min_speedup:g}x)"
        buckets.append(Bucket(shape=dict(shapes[k]), vector=vectors[k], kernel=kernel, evidence=evidence, reason=reason))
    if not any(b.kernel for b in buckets):
        top = max((b.evidence["speedup_" + options.baseline] or 0.0 for b in buckets), default=0.0)
        notes.append(f"{task.name} {arch}/{dtype}: no kernel reaches {options.min_speedup:g}x vs {options.baseline} "
                     f"on any shape (best {top:.2f}x)")
        return None
    gpu = str(rows[0].environment["gpu"])
    return Group(arch, gpu, dtype, tuple(export_inspect.input_layout(task, dtype)), fixed, tuple(buckets))


def _key(shape: Mapping[str, int]) -> tuple:
    return tuple(sorted(shape.items()))


def _evidence(m: Measured) -> dict[str, Any]:
    s = m.shape
    return s.to_dict() | {
        "attempt_id": m.attempt_id,
        "speedup_eager": speedup_vs_eager(s),
        "speedup_compile": speedup_vs_compile(s),
        "speedup_library": speedup_vs_library(s),
        "pct_roofline": roofline_pct(s),
        "environment": dict(m.environment),
    }


def summary(result: ExportResult) -> str:
    """What the command prints: the ops written, what was left out, and how to build and test."""
    plan = result.plan
    lines = [f"wrote {plan.name} to {result.out} ({len(result.files)} files):"]
    for op in plan.ops:
        for g in op.groups:
            kernels = sorted({b.kernel for b in g.buckets if b.kernel}, key=lambda k: int(k[1:]))
            fallback = sum(1 for b in g.buckets if not b.kernel)
            lines.append(f"  {op.op:24} {g.arch}/{g.dtype} on {g.gpu}: {len(g.buckets)} bucket(s), kernels "
                         f"{', '.join(kernels)}" + (f", reference kept in {fallback}" if fallback else ""))
    if plan.notes:
        lines.append("left out:")
        lines += [f"  {n}" for n in plan.notes]
    lines += ["next:", f"  pip wheel --no-deps --no-build-isolation -w {result.out}/dist {result.out}",
              f"  pip install {result.out}/dist/*.whl && python -m pytest {result.out}/tests"]
    return "\n".join(lines)
