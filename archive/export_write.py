"""Writing an ``ExportPlan`` (export.py) as a package folder.

    OUT/
      pyproject.toml, README.md
      src/PKG/__init__.py        the ops, counters(), reset_counters(), explain(), manifest()
      src/PKG/ops.py             one torch.library custom op per task (generated)
      src/PKG/_dispatch.py       (architecture, dtype, shape bucket) -> kernel or reference
      src/PKG/testing.py         input drawing and the verifier's comparison, for the tests
      src/PKG/manifest.json      every entry with its evidence
      src/PKG/tasks/OP/reference.py   the task's reference, verbatim
      src/PKG/tasks/OP/inputs.py      the task's input generator (its metadata file), verbatim
      src/PKG/tasks/OP/kernels/aN.py  attempt N's code, verbatim (defines ModelNew)
      tests/conftest.py, tests/test_ops.py

The folder is written beside ``out`` and renamed into place, so a failed export leaves nothing
half-written; an existing folder is replaced only with ``--force`` and only if it is an export.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from string import Template
from typing import Any

from kernforge.tasks import runtime
from kernforge.tasks.spec import Shape

from .export import ExportError, ExportPlan, OpPlan
from .export_readme import readme

TEMPLATE = Path(__file__).with_name("export_template")
FORMAT = 1
_TYPES = {"tensor": "torch.Tensor", "int": "int", "float": "float", "bool": "bool"}


def write_package(plan: ExportPlan, out: Path) -> list[Path]:
    out = Path(out)
    _check_target(out, plan.options.force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = [out / p.relative_to(staging) for p in _write(plan, staging)]
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files


def _is_export(folder: Path) -> bool:
    return (folder / "pyproject.toml").is_file() and any(folder.glob("src/*/manifest.json"))


def _check_target(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(f"--out {out} exists and is not empty; pass --force to replace an earlier export there")
        if not _is_export(out):
            raise ExportError(f"--out {out} is not an earlier export (no pyproject.toml and src/*/manifest.json); "
                              "--force replaces only those")


def _write(plan: ExportPlan, root: Path) -> list[Path]:
    name = plan.name
    pkg = root / "src" / name
    written: list[Path] = []

    def put(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)

    ops = {op.op: op for op in plan.ops}
    for op in plan.ops:
        where = pkg / "tasks" / op.op
        put(where / "__init__.py", f'"""{op.task.name}: the task\'s reference, input generator and kernels."""\n')
        put(where / "reference.py", op.task.reference_path.read_text())
        if op.task.meta_path is not None:
            put(where / "inputs.py", op.task.meta_path.read_text())
        put(where / "kernels" / "__init__.py", f'"""Kernels of {op.op}, verbatim from the archive (aN.py: attempt N)."""\n')
        for kernel, attempt in op.kernels.items():
            put(where / "kernels" / f"{kernel}.py", attempt.code)
    put(pkg / "tasks" / "__init__.py", '"""One folder per op: reference, input generator, kernels."""\n')

    manifest = build_manifest(plan, {p.relative_to(pkg).as_posix(): p for p in written})
    put(pkg / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
    fields = _fields(plan, manifest)
    put(pkg / "ops.py", _render("ops.py.tmpl", fields) + "".join(_render("op.py.tmpl", _op_fields(plan, op))
                                                                for op in ops.values()))
    put(pkg / "__init__.py", _render("package/__init__.py.tmpl", fields))
    for static in ("_dispatch.py", "testing.py"):
        put(pkg / static, (TEMPLATE / "package" / static).read_text())
    put(root / "pyproject.toml", _render("pyproject.toml.tmpl", fields))
    put(root / "tests" / "conftest.py", _render("tests/conftest.py.tmpl", fields))
    put(root / "tests" / "test_ops.py", _render("tests/test_ops.py.tmpl", fields))
    put(root / "README.md", readme(plan, manifest))
    return written


def _render(template: str, fields: dict[str, str]) -> str:
    return Template((TEMPLATE / template).read_text()).substitute(fields)


def _fields(plan: ExportPlan, manifest: dict[str, Any]) -> dict[str, str]:
    first = plan.ops[0]
    call = ", ".join(a.name for a in first.signature.args if not a.init)
    return {
        "package": plan.name,
        "dist": plan.name.replace("_", "-"),
        "version": manifest["version"],
        "description": f"Verified kernels exported by kernforge: {', '.join(op.op for op in plan.ops)}",
        "all": ", ".join(f'"{op.op}"' for op in plan.ops),
        "op_list": ", ".join(op.op for op in plan.ops),
        "first_op": first.op,
        "first_call": f"{first.op}({call})",
    }


def _defaults(op: OpPlan) -> dict[str, Any]:
    """Init arguments that had one value in every verified shape get it as their default
    (``group_size=128``), as long as every later argument has one too."""
    values: dict[str, set] = {a.name: set() for a in op.signature.args if a.init}
    for group in op.groups:
        for bucket in group.buckets:
            init = runtime.make_init_inputs(op.task, Shape.of(bucket.shape))
            for arg, value in zip([a for a in op.signature.args if a.init], init):
                values[arg.name].add(value)
    out: dict[str, Any] = {}
    for arg in reversed(op.signature.args):
        if not arg.init or len(values[arg.name]) != 1:
            break
        out[arg.name] = next(iter(values[arg.name]))
    return out


def _op_fields(plan: ExportPlan, op: OpPlan) -> dict[str, str]:
    defaults = _defaults(op)
    sig = op.signature
    params, fake = [], []
    for a in sig.args:
        tail = f" = {defaults[a.name]!r}" if a.name in defaults else ""
        params.append(f"{a.name}: {_TYPES[a.kind]}{tail}")
        fake.append(f"{a.name}{'=' + repr(defaults[a.name]) if a.name in defaults else ''}")
    if sig.n_outputs == 0:
        returns = "None"
    elif sig.returns_tuple:
        returns = f"tuple[{', '.join(['torch.Tensor'] * sig.n_outputs)}]"
    else:
        returns = "torch.Tensor"
    summary = (op.task.description.split("\n\n")[0].replace('"""', "'''").replace("\n", " ").strip()
               or f"The {op.task.name} task.")
    return {
        "package": plan.name,
        "op": op.op,
        "mutates": repr(tuple(sig.mutated)),
        "params": ", ".join(params),
        "fake_params": ", ".join(fake),
        "returns": returns,
        "names": ", ".join(a.name for a in sig.args) + ("," if len(sig.args) == 1 else ""),
        "summary": _wrap(summary, 92),
        "kernels": _wrap("Kernels: " + ", ".join(f"{k} (attempt {a.id})" for k, a in op.kernels.items())
                         + ". Elsewhere the PyTorch reference runs (see README.md).", 92),
    }


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n    ".join(lines)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_manifest(plan: ExportPlan, files: dict[str, Path]) -> dict[str, Any]:
    """The manifest: ``ops`` is the dispatch table the package reads; ``entries`` lists, per
    (op, architecture, dtype, kernel), the shapes it runs and the evidence for each."""
    ops: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    for op in plan.ops:
        defaults = _defaults(op)
        kernels = {}
        for kernel, a in op.kernels.items():
            kernels[kernel] = {
                "attempt_id": a.id, "run_id": a.run_id, "code_hash": a.code_hash,
                "file_sha256": _sha256(files[f"tasks/{op.op}/kernels/{kernel}.py"]),
                "module": f"{plan.name}.tasks.{op.op}.kernels.{kernel}",
                "model": a.model, "proposer": a.proposer, "created": a.created, "score": a.score,
                "flags": list(getattr(a.verdict, "flags", ())),
                "verified_shapes": [s.shape for s in a.verdict.shapes],
                "audit": _audit(op.audits.get(kernel)),
            }
        groups = []
        for g in op.groups:
            floating = [i["dtype"] for i in g.inputs if i and i["dtype"].startswith(("float", "bfloat"))]
            key_dtype = (floating or [i["dtype"] for i in g.inputs if i] or [g.dtype])[0]
            groups.append({
                "arch": g.arch, "gpu": g.gpu, "dtype": g.dtype, "key_dtype": key_dtype, "inputs": list(g.inputs),
                "fixed": {str(i): v for i, v in sorted(g.fixed.items())},
                "buckets": [{"shape": dict(b.shape), "vector": list(b.vector), "kernel": b.kernel,
                             **({"reason": b.reason} if b.reason else {})} for b in g.buckets],
            })
            entries.extend(_entries(plan, op, g, kernels))
        sig = op.signature.to_dict()
        for arg in sig["args"]:
            if arg["name"] in defaults:
                arg["default"] = defaults[arg["name"]]
        ops[op.op] = {
            "qualname": f"{plan.name}::{op.op}",
            "task": {"name": op.task.name, "source_hash": op.version.source_hash, "description": op.task.description},
            "signature": sig,
            "axes": list(op.axes),
            "shape_params": [k for k, _ in (op.task.cpu_public_shapes or op.task.public_shapes)[0].params],
            "distributions": list(op.task.distributions),
            "tolerances": op.task.tolerance_table(),
            "has_inputs_module": op.task.meta_path is not None,
            "groups": groups,
            "kernels": kernels,
        }
    body = {
        "format": FORMAT,
        "package": plan.name,
        "namespace": plan.name,
        "source": {"archive": str(plan.archive.resolve())},
        "selection": {
            "tasks": list(plan.options.tasks) or "every task in the archive",
            "gpus": list(plan.options.gpus) or "every GPU (no interpreter)",
            "min_speedup": plan.options.min_speedup,
            "baseline": plan.options.baseline,
        },
        "notes": list(plan.notes),
        "ops": ops,
        "entries": entries,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {"version": f"1.0.0+{digest}"} | body


def _entries(plan: ExportPlan, op: OpPlan, g, kernels: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for kernel in sorted({b.kernel for b in g.buckets if b.kernel}, key=lambda k: int(k[1:])):
        mine = [b for b in g.buckets if b.kernel == kernel]
        params = sorted({k for b in mine for k in b.shape})
        out.append({
            "op": op.op, "arch": g.arch, "gpu": g.gpu, "dtype": g.dtype, "kernel": kernel,
            "attempt_id": kernels[kernel]["attempt_id"], "code_hash": kernels[kernel]["code_hash"],
            "file_sha256": kernels[kernel]["file_sha256"], "audit": kernels[kernel]["audit"],
            "shape_range": {p: [min(b.shape[p] for b in mine), max(b.shape[p] for b in mine)] for p in params},
            "buckets": [{"shape": dict(b.shape), "evidence": _bare(b.evidence)} for b in mine],
            "environment": mine[0].evidence["environment"],
        })
    for b in g.buckets:
        if not b.kernel:
            out.append({
                "op": op.op, "arch": g.arch, "gpu": g.gpu, "dtype": g.dtype, "kernel": None, "reason": b.reason,
                "shape_range": {p: [v, v] for p, v in b.shape.items()},
                "buckets": [{"shape": dict(b.shape), "evidence": _bare(b.evidence)}],
                "environment": b.evidence["environment"],
            })
    return out


def _audit(record: Any) -> dict[str, Any] | None:
    """A kernel's audit, as the manifest records it: the evidence that its verdict and time held."""
    if record is None:
        return None
    a = record.audit
    return {"id": record.id, "passed": a.passed, "reason": a.reason, "recorded_us": a.recorded_us,
            "measured_us": a.measured_us, "gpu": record.gpu, "run_id": record.run_id, "created": record.created}


def _bare(evidence: dict[str, Any]) -> dict[str, Any]:
    """A bucket's evidence without what the entry already says (shape, environment)."""
    return {k: v for k, v in evidence.items() if k not in ("shape", "environment")}
