"""Find tasks: a built-in name, a KernelBench-form file, a task folder, or a folder of files.

Layouts understood:

* ``NAME``: a built-in task, ``tasks/builtin/NAME/`` (see below).
* ``path/to/problem.py``: a KernelBench-form module. Optional companions beside it:
  ``problem.meta.py`` (metadata, never shown to the model) and ``problem.seed.py`` (a seed
  candidate).
* ``path/to/task_dir/`` holding ``reference.py``: one task, with optional ``meta.py`` and
  ``seed.py`` beside it. The built-in tasks use this layout.
* ``path/to/level_dir/``: every ``*.py`` inside that is not a companion is a task (a KernelBench
  level). A broken file is reported and the others still load.

Metadata attributes (all optional) are listed in ``META_FIELDS``; an unknown upper-case name
is an error, so a typo cannot silently drop the hidden shapes.

Every integer global of a reference module is a size (KernelBench reads sizes from globals), so
a shape is an assignment to them; keep other constants (a rope base, an epsilon) as floats.
Without ``HIDDEN_SHAPES``, the hidden shapes vary the globals that probing the file on the meta
device shows to be sizes (``shapes.py``); the interpreter's vary only ``batch_size``. Beside
these fixed hidden shapes every verdict checks one drawn for it alone (``draws.py``): from
meta.py's ``draw_hidden_shape(rng, device)``, or a declared shape's ``batch_size``; a drawer is
tried when the task loads, so a broken one is said then.
"""

from __future__ import annotations

import ast
import glob
from pathlib import Path
from typing import Any, Iterable

from . import draws, shapes as kb_shapes
from .errors import TaskError
from .runtime import load_module
from .shapes import int_globals as _int_globals
from .spec import DISTRIBUTIONS, LibraryBaseline, Shape, Task, Tolerance

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"

META_FIELDS = {
    "DESCRIPTION": "one paragraph on what the op is and where a serving stack spends it",
    "PUBLIC_SHAPES": "list of dicts of reference globals, shown to the model",
    "HIDDEN_SHAPES": "list of dicts, never shown: tiny, odd, non-power-of-two and large",
    "CPU_PUBLIC_SHAPES": "small public shapes for the Triton interpreter",
    "CPU_HIDDEN_SHAPES": "small hidden shapes for the Triton interpreter",
    "DISTRIBUTIONS": f"input distributions, from {DISTRIBUTIONS}",
    "DTYPES": "dtype per device kind, e.g. {'cuda': 'bfloat16', 'cpu': 'float32'}",
    "TOLERANCES": "{dtype: (atol, rtol)}; see kernforge.tasks.spec.Tolerance",
    "ALLOW_TORCH_OPS": "whether a candidate may call torch compute ops (default False)",
    "MUTATED_INPUTS": "indices of inputs the op writes in place",
    "INTERPRETER_UNSUPPORTED": "why the seed cannot run under the Triton interpreter",
    "LIBRARY_BASELINE": "{'package': pip name, 'call': name of a meta.py function taking the forward's inputs}, or a "
                        "list of them in the order preferred: a production kernel library's op, timed beside eager and "
                        "torch.compile (the first installed one whose output agrees with the reference)",
}
META_FUNCTIONS = {
    "make_inputs": "make_inputs(shape, dist, dtype, device, generator) -> list",
    "roofline": "roofline(shape, dtype) -> (bytes, flops)",
    "draw_hidden_shape": "draw_hidden_shape(rng, device) -> dict: a hidden shape drawn for one verdict (tasks/draws.py)",
}


def builtin_names() -> list[str]:
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "reference.py").is_file())


def load_task(name_or_path: str | Path) -> Task:
    """Load exactly one task; a folder of several is an error here (use ``load_tasks``)."""
    tasks, errors = load_tasks(name_or_path)
    if errors:
        raise errors[0]
    if len(tasks) != 1:
        raise TaskError(f"{name_or_path}: holds {len(tasks)} tasks; name one file")
    return tasks[0]


def load_tasks(name_or_path: str | Path) -> tuple[list[Task], list[TaskError]]:
    """Load every task behind a name or path. Broken files come back as errors, not raised."""
    text = str(name_or_path)
    if text.startswith("builtin:"):
        text = text.split(":", 1)[1]
    if text in builtin_names():
        return [_load_task_dir(BUILTIN_DIR / text, ref=f"builtin:{text}")], []
    path = Path(text).expanduser()
    if not path.exists():
        known = ", ".join(builtin_names())
        raise TaskError(f"{text}: no such built-in task or path (built-in tasks: {known})")
    path = path.resolve()
    if path.is_file():
        return [_load_task_file(path)], []
    if (path / "reference.py").is_file():
        return [_load_task_dir(path, ref=str(path))], []
    tasks: list[Task] = []
    errors: list[TaskError] = []
    files = sorted(p for p in path.glob("*.py") if not _is_companion(p) and p.name != "__init__.py")
    subdirs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "reference.py").is_file())
    if not files and not subdirs:
        raise TaskError(f"{path}: no task files (*.py with Model, get_inputs, get_init_inputs) in this folder")
    for item in [*files, *subdirs]:
        try:
            tasks.append(_load_task_file(item) if item.is_file() else _load_task_dir(item, ref=str(item)))
        except TaskError as err:
            errors.append(err)
    return tasks, errors


def candidate_bundle(task: Task) -> dict[str, str | None]:
    """What a candidate's worker is given to rebuild the task: the reference (``ModelNew`` is
    built from its ``get_init_inputs``, and its globals are watched) and the in-place inputs.
    Never the metadata: the hidden shapes, input distributions and tolerances must not exist in
    the candidate's process before it is called with them (THREATS #14: a kernel that could
    read every shape it will be checked on could be fitted to exactly those)."""
    mutated = f"MUTATED_INPUTS = {tuple(task.mutated_inputs)!r}\n" if task.mutated_inputs else None
    return {"name": task.name, "reference": task.reference_source, "meta": mutated}


def secret_paths(tasks: Iterable[Task]) -> tuple[str, ...]:
    """Files a candidate's worker must not read: the built-in tasks and every task's metadata
    (hidden shapes), with any bytecode of it. The sandbox makes them look empty to it."""
    paths = [str(BUILTIN_DIR)]
    for meta in (t.meta_path for t in tasks if t.meta_path is not None):
        paths += [str(meta)] + bytecode_of(Path(meta))
    return tuple(dict.fromkeys(paths))


def bytecode_of(path: Path) -> list[str]:
    """The bytecode Python has written for the source file ``path`` (``__pycache__/<stem>.*.pyc``,
    by whichever process imported it): everything the source holds, hidden shapes included."""
    return [str(p) for p in sorted((path.parent / "__pycache__").glob(f"{glob.escape(path.stem)}.*.pyc"))]


def unbundle(data: dict[str, str | None], folder: Path, *, derive_hidden: bool = True) -> Task:
    """Write a bundle into ``folder`` as a task folder and load it (same name as the original).
    ``derive_hidden=False`` (a candidate's worker, which needs the reference and the names of
    the sizes): no hidden shapes at all, neither the metadata's (the bundle has none) nor those
    the judge derives by probing a bare KernelBench file; that process learns each shape only
    when a call is made at it, and its start stays fast."""
    target = Path(folder) / str(data["name"])
    target.mkdir(parents=True, exist_ok=True)
    (target / "reference.py").write_text(str(data["reference"]))
    if data.get("meta"):
        (target / "meta.py").write_text(str(data["meta"]))
    return _load_task_dir(target, ref=str(target), derive_hidden=derive_hidden)


def _is_companion(path: Path) -> bool:
    return path.name.endswith((".meta.py", ".seed.py"))


def _load_task_file(path: Path) -> Task:
    stem = path.name[: -len(".py")]
    meta = path.with_name(f"{stem}.meta.py")
    seed = path.with_name(f"{stem}.seed.py")
    return _build(
        name=stem,
        ref=str(path),
        reference_path=path,
        meta_path=meta if meta.is_file() else None,
        seed_path=seed if seed.is_file() else None,
    )


def _load_task_dir(path: Path, *, ref: str, derive_hidden: bool = True) -> Task:
    meta = path / "meta.py"
    seed = path / "seed.py"
    return _build(
        name=path.name,
        ref=ref,
        reference_path=path / "reference.py",
        meta_path=meta if meta.is_file() else None,
        seed_path=seed if seed.is_file() else None,
        derive_hidden=derive_hidden,
    )


def _build(*, name: str, ref: str, reference_path: Path, meta_path: Path | None, seed_path: Path | None,
           derive_hidden: bool = True) -> Task:
    source = _read(reference_path)
    _check_syntax(reference_path, source)
    module = load_module(reference_path)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise TaskError(f"{reference_path}: KernelBench form needs `{attr}`, which is missing")
    if not callable(module.get_inputs) or not callable(module.get_init_inputs):
        raise TaskError(f"{reference_path}: `get_inputs` and `get_init_inputs` must be functions")
    globals_ = _int_globals(module)
    default_shape = Shape.of(globals_)

    meta: dict[str, Any] = {}
    if meta_path is not None:
        _check_syntax(meta_path, _read(meta_path))
        meta_module = load_module(meta_path)
        meta = {k: getattr(meta_module, k) for k in dir(meta_module) if not k.startswith("_")}
        unknown = sorted(k for k in meta if k.isupper() and k not in META_FIELDS)
        if unknown:
            fields = ", ".join(sorted(META_FIELDS))
            raise TaskError(f"{meta_path}: unknown metadata {', '.join(unknown)} (known: {fields})")
        for fn in META_FUNCTIONS:
            if fn in meta and not callable(meta[fn]):
                raise TaskError(f"{meta_path}: `{fn}` must be a function: {META_FUNCTIONS[fn]}")

    def shapes(key: str, fallback: tuple[Shape, ...]) -> tuple[Shape, ...]:
        where = meta_path or reference_path
        if key not in meta:
            return fallback
        return tuple(_shape(where, key, i, item, globals_) for i, item in enumerate(_as_list(where, key, meta[key])))

    public = shapes("PUBLIC_SHAPES", (default_shape,))
    cpu_call_bytes = None
    if "HIDDEN_SHAPES" in meta:
        hidden = shapes("HIDDEN_SHAPES", ())
        cpu_hidden = shapes("CPU_HIDDEN_SHAPES", hidden)
    elif not derive_hidden:
        hidden = cpu_hidden = ()
    else:
        # A plain KernelBench file: every size varied, found by probing the file on meta (see
        # shapes.py). The interpreter keeps the batch-only shapes: it is too slow for more.
        found = kb_shapes.plan(reference_path, public)
        hidden = found.shapes
        if "CPU_PUBLIC_SHAPES" not in meta and "PUBLIC_SHAPES" not in meta and found.default_bytes:
            cpu_call_bytes = found.default_bytes
        cpu_hidden = shapes("CPU_HIDDEN_SHAPES", kb_shapes.batch_only(globals_))
    cpu_public = shapes("CPU_PUBLIC_SHAPES", public)

    where = meta_path or reference_path
    distributions = tuple(meta.get("DISTRIBUTIONS", ("default",)))
    bad = [d for d in distributions if d not in DISTRIBUTIONS]
    if bad or not distributions:
        raise TaskError(f"{where}: DISTRIBUTIONS has {bad or 'nothing'}; choose from {DISTRIBUTIONS}")
    if any(d != "default" for d in distributions) and "make_inputs" not in meta:
        raise TaskError(f"{where}: DISTRIBUTIONS other than 'default' need a make_inputs function")

    dtypes = meta.get("DTYPES", {"cuda": "float32", "cpu": "float32"})
    if not isinstance(dtypes, dict) or not all(isinstance(v, str) for v in dtypes.values()):
        raise TaskError(f"{where}: DTYPES must map 'cuda'/'cpu' to a dtype name such as 'bfloat16'")
    tolerances = {}
    for dtype, pair in dict(meta.get("TOLERANCES", {})).items():
        try:
            atol, rtol = (float(x) for x in pair)
        except (TypeError, ValueError):
            raise TaskError(f"{where}: TOLERANCES[{dtype!r}] must be (atol, rtol), got {pair!r}") from None
        tolerances[str(dtype)] = Tolerance(atol=atol, rtol=rtol)
    mutated = tuple(int(i) for i in meta.get("MUTATED_INPUTS", ()))
    unsupported = meta.get("INTERPRETER_UNSUPPORTED")
    libraries = _library(where, meta)

    task = Task(
        name=name,
        ref=ref,
        reference_path=reference_path,
        reference_source=source,
        meta_path=meta_path,
        description=str(meta.get("DESCRIPTION", "") or (module.__doc__ or "")).strip(),
        public_shapes=public,
        hidden_shapes=hidden,
        cpu_public_shapes=cpu_public,
        cpu_hidden_shapes=cpu_hidden,
        distributions=distributions,
        dtypes=dict(dtypes),
        tolerances=tolerances,
        allow_torch_ops=bool(meta.get("ALLOW_TORCH_OPS", False)),
        mutated_inputs=mutated,
        seed_path=seed_path,
        interpreter_unsupported=str(unsupported) if unsupported else None,
        libraries=libraries,
        cpu_call_bytes=cpu_call_bytes,
    )
    draws.check(task)
    return task


def _library(where: Path, meta: dict[str, Any]) -> tuple[LibraryBaseline, ...]:
    """LIBRARY_BASELINE: one entry, or a list of them in the order they are preferred."""
    entry = meta.get("LIBRARY_BASELINE")
    if entry is None:
        return ()
    entries = entry if isinstance(entry, (list, tuple)) and entry else [entry]
    out = []
    for one in entries:
        if not isinstance(one, dict) or not all(isinstance(one.get(k), str) and one[k] for k in ("package", "call")):
            raise TaskError(f"{where}: LIBRARY_BASELINE must be {{'package': 'liger-kernel', 'call': 'a_function_in_meta'}} "
                            f"or a list of them, got {one!r}")
        if not callable(meta.get(one["call"])):
            raise TaskError(f"{where}: LIBRARY_BASELINE names {one['call']!r}, which is not a function of this meta.py")
        out.append(LibraryBaseline(package=one["package"], call=one["call"]))
    if len({lib.package for lib in out}) < len(out):
        raise TaskError(f"{where}: LIBRARY_BASELINE names a package twice ({[lib.package for lib in out]})")
    return tuple(out)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"{path}: cannot be read ({err})") from None


def _check_syntax(path: Path, source: str) -> None:
    try:
        ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise TaskError(f"{path}:{err.lineno}: syntax error: {err.msg}") from None


def _as_list(where: Path, key: str, value: Any) -> Iterable[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TaskError(f"{where}: {key} must be a non-empty list of shape dicts")
    return value


def _shape(where: Path, key: str, index: int, item: Any, globals_: dict[str, int]) -> Shape:
    if not isinstance(item, dict) or not item:
        raise TaskError(f"{where}: {key}[{index}] must be a dict such as {{'T': 16, 'H': 4096}}")
    unknown = [k for k in item if k not in globals_]
    if unknown:
        raise TaskError(
            f"{where}: {key}[{index}] sets {unknown}, which are not integer globals of the reference "
            f"(those are: {sorted(globals_)})"
        )
    # a negative value is a setting's where the file's own is negative (53_Gemm_Scaling_Hardtanh_GELU's
    # hardtanh_min = -2), never a size's
    bad = [k for k, v in item.items() if not isinstance(v, int) or isinstance(v, bool) or (v < 0 <= globals_[k])]
    if bad:
        raise TaskError(f"{where}: {key}[{index}] has non-integer or negative sizes for {bad}")
    # Globals a shape leaves out keep the reference's default value.
    return Shape.of({**globals_, **item})
