"""Running a task's code: load its modules, set a shape, draw inputs, build the reference.

Used by the judge's reference worker and by the candidate's harness alike, so that both draw
bit-identical inputs from the same (shape, distribution, seed) on the same device. Loading is
by file path into a fresh module object; nothing is registered in ``sys.modules``, so a task
file called ``loop.py`` cannot shadow anything.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from .errors import TaskError
from .spec import Roofline, Shape, Task

_MODULES: dict[tuple[str, float], ModuleType] = {}
#: a path as given -> as resolved: a timed batch draws the inputs of hundreds of calls, each
#: loading the task's modules (the cache hit's realpath walk was a third of each draw on the H200)
_RESOLVED: dict[str, Path] = {}


def load_module(path: Path, *, fresh: bool = False) -> ModuleType:
    """Import a file as an anonymous module; cached per process (per file and modification
    time) unless ``fresh``."""
    given = str(path)
    if given in _RESOLVED:
        path = _RESOLVED[given]
    else:
        path = Path(path).resolve()
        if Path(given).is_absolute():  # a relative one resolves against whatever is the cwd then
            _RESOLVED[given] = path
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError as err:
        raise TaskError(f"{path}: cannot be read ({err})") from None
    if not fresh and key in _MODULES:
        return _MODULES[key]
    name = "kernforge_task_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        # compiled here, not by the import system's loader, which writes a file's bytecode into a
        # __pycache__ folder beside it: a metadata file's bytecode holds its hidden shapes, and the
        # sandbox hides the file from candidates, not copies of it made afterwards
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), module.__dict__)
    except Exception as err:  # a task file's own bug: report it with the file name
        raise TaskError(f"{path}: importing it failed: {type(err).__name__}: {err}") from err
    if not fresh:
        _MODULES[key] = module
    return module


def loaded_module(name: str) -> ModuleType | None:
    """The module ``load_module`` imported under ``name`` in this process (they are anonymous:
    not in ``sys.modules``), or None."""
    return next((m for m in _MODULES.values() if m.__name__ == name), None)


def reference_module(task: Task) -> ModuleType:
    return load_module(task.reference_path)


def meta_module(task: Task) -> ModuleType | None:
    return load_module(task.meta_path) if task.meta_path else None


def set_shape(module: ModuleType, shape: Shape) -> None:
    """Point the reference's size globals at ``shape`` (KernelBench reads sizes from globals)."""
    set_globals(module, dict(shape.params))


def set_globals(module: ModuleType, values: Mapping[str, int]) -> None:
    """Set a module's integer globals, then run again the top-level assignments computed from
    them (KernelBench's ``bias_shape = (out_features,)``): a hidden shape that changes
    ``out_features`` must not leave a bias of the default's size behind."""
    for key, value in values.items():
        setattr(module, key, value)
    for code in _derived(module):
        exec(code, module.__dict__)  # the task's own top-level line, in its own namespace


def _derived(module: ModuleType) -> list[Any]:
    """The module's top-level assignments of non-integer globals whose value reads an integer
    global (directly or through another such assignment), compiled, in source order; read once
    per module object."""
    cached = module.__dict__.get("__kernforge_derived__")
    if cached is not None:
        return cached
    found: list[Any] = []
    path = getattr(module, "__file__", None)
    try:
        tree = ast.parse(Path(path).read_text()) if path else None
    except (OSError, SyntaxError, ValueError):
        tree = None
    ints = {k for k, v in vars(module).items() if isinstance(v, int) and not isinstance(v, bool)}
    depends = set(ints)
    for stmt in tree.body if tree is not None else []:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if len(names) != len(targets) or names & ints:
            continue  # an integer global is the shape's own; only what is computed from them is redone
        if {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} & depends:
            found.append(compile(ast.Module(body=[stmt], type_ignores=[]), path, "exec"))
            depends |= names
    module.__dict__["__kernforge_derived__"] = found
    return found


def torch_dtype(name: str):
    import torch

    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise TaskError(f"unknown dtype {name!r}")
    return value


def _meta_draw(task: Task, dist: str) -> ModuleType | None:
    """The task's meta.py where its ``make_inputs`` draws ``dist``; else None (the reference's
    ``get_inputs`` draws)."""
    meta = meta_module(task)
    return meta if meta is not None and hasattr(meta, "make_inputs") and dist != "default" else None


def meta_inputs(task: Task, shape: Shape) -> list[Any]:
    """One GPU call's inputs at ``shape`` on the meta device (shapes, strides and dtypes, no
    data): the task's ``make_inputs`` where its meta.py has one, else its reference's
    ``get_inputs``. Raises where a draw needs values (say, an index taken from data)."""
    import torch

    dist = task.distributions[0] if task.distributions else "default"
    with torch.device("meta"), torch.no_grad():
        meta = _meta_draw(task, dist)
        if meta is not None:
            return list(meta.make_inputs(shape.as_dict(), dist, torch_dtype(task.dtype("cuda")), "meta", None))
        module = reference_module(task)
        set_shape(module, shape)
        return list(module.get_inputs())


def make_inputs(task: Task, shape: Shape, dist: str, seed: int, device: str) -> list[Any]:
    """The inputs of one call, determined entirely by (task, shape, dist, seed, device)."""
    import torch

    device_kind = "cuda" if str(device).startswith("cuda") else "cpu"
    meta = _meta_draw(task, dist)
    if meta is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
        dtype = torch_dtype(task.dtype(device_kind))
        inputs = meta.make_inputs(shape.as_dict(), dist, dtype, device, generator)
    else:
        module = reference_module(task)
        set_shape(module, shape)
        devices = [torch.device(device).index or 0] if device_kind == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            inputs = _drawn_on(device, seed, module.get_inputs) if device_kind == "cuda" else None
            if inputs is None:
                torch.manual_seed(seed)
                inputs = module.get_inputs()
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    return list(inputs)


def make_many(task: Task, shape: Shape, dist: str, seed: int, count: int, device: str) -> list[Any] | None:
    """The tensor inputs of ``count`` calls drawn in one pass, each stacked on a new first
    dimension, in the order the task returns them (its other values left out); None where the
    task's draw cannot be batched (a ``.item()``, a host branch on a value, an op vmap lacks).

    The task's own draw runs under ``torch.func.vmap`` with different randomness per call, so each
    call's tensors come from the same distribution as ``make_inputs``' and are independent of the
    other calls', determined by (task, shape, dist, seed, count, device); the values are not
    ``make_inputs``' for any one seed. A timed batch draws hundreds of calls before every window:
    one call at a time that was hundreds of small launches and their Python."""
    import torch

    device_kind = "cuda" if str(device).startswith("cuda") else "cpu"
    meta = _meta_draw(task, dist)
    if meta is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
        dtype = torch_dtype(task.dtype(device_kind))
        args = (shape.as_dict(), dist, dtype, device, generator)

        def one(_: Any) -> tuple[Any, ...]:
            return tuple(x for x in meta.make_inputs(*args) if isinstance(x, torch.Tensor))
        rng = contextlib.nullcontext()
    else:
        module = reference_module(task)
        set_shape(module, shape)

        def one(_: Any) -> tuple[Any, ...]:
            with torch.device(device):
                return tuple(x for x in module.get_inputs() if isinstance(x, torch.Tensor))
        rng = torch.random.fork_rng(devices=[torch.device(device).index or 0] if device_kind == "cuda" else [])
    with rng, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vmap's "performance drop" notes for ops it loops over
        if meta is None:  # get_inputs draws from the global generators (forked above)
            torch.manual_seed(seed)
        try:
            drawn = torch.func.vmap(one, randomness="different")(torch.empty(count))
        except Exception:  # noqa: BLE001 - any failure of the task's code under vmap: draw per call
            return None
    return [x.to(device) for x in drawn]


def _drawn_on(device: str, seed: int, get_inputs: Any) -> list[Any] | None:
    """``get_inputs()`` with the GPU as the default device, so that its ``torch.rand(...)`` draws
    there (a KernelBench call of several GB drawn on the CPU and copied over took seconds, and a
    verdict draws dozens); None when it cannot run that way (it is then drawn on the CPU)."""
    import torch

    torch.manual_seed(seed)
    try:
        with torch.device(device):
            return list(get_inputs())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def collect_outputs(result: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> list[Any]:
    """The tensors a call produced: its return value (a tensor or a tuple/list of them),
    then the inputs the op writes in place, in the task's order."""
    if isinstance(result, (tuple, list)):
        outs = list(result)
    elif result is None:
        outs = []
    else:
        outs = [result]
    return outs + [inputs[i] for i in mutated]


def smallest_shape(task: Task) -> Shape:
    """The task's smallest interpreter shape, public or hidden (one cheap real call on the CPU)."""
    shapes = task.cpu_public_shapes + task.cpu_hidden_shapes or task.public_shapes
    return min(shapes, key=lambda s: sum(v for _, v in s.params))


def sample_inputs(task: Task, shape: Shape, dtype: str) -> list[Any]:
    """Inputs of one call on the CPU as the verifier draws them for ``dtype`` (a GPU dtype
    included): the task's first input distribution, or its ``get_inputs`` without one."""
    import torch

    meta = meta_module(task)
    dists = [d for d in task.distributions if d != "default"]
    if meta is not None and hasattr(meta, "make_inputs") and dists:
        generator = torch.Generator(device="cpu").manual_seed(0)
        return list(meta.make_inputs(shape.as_dict(), dists[0], torch_dtype(dtype), "cpu", generator))
    return make_inputs(task, shape, "default", 0, "cpu")


def make_init_inputs(task: Task, shape: Shape) -> list[Any]:
    module = reference_module(task)
    set_shape(module, shape)
    return list(module.get_init_inputs())


def build_model(model_cls: type, init_inputs: Sequence[Any], init_seed: int, device: str):
    """Construct a model under a fixed seed, so Model and ModelNew draw the same parameters."""
    import torch

    device_kind = "cuda" if str(device).startswith("cuda") else "cpu"
    devices = [torch.device(device).index or 0] if device_kind == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model = _built_on(device, init_seed, model_cls, init_inputs) if device_kind == "cuda" else None
        if model is None:
            torch.manual_seed(init_seed)
            model = model_cls(*init_inputs)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


def _built_on(device: str, init_seed: int, model_cls: type, init_inputs: Sequence[Any]) -> Any:
    """``model_cls(*init_inputs)`` with the GPU as the default device, so its weights are drawn
    there (a KernelBench linear of 32768x32768 took ~10 s to draw on the CPU, per shape, on both
    sides of every verdict); None when its ``__init__`` cannot run that way. The reference and
    the candidate's ModelNew are both built here, so both draw on the same device from the same
    seed."""
    import torch

    torch.manual_seed(init_seed)
    try:
        with torch.device(device):
            return model_cls(*init_inputs)
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def roofline(task: Task, shape: Shape, dtype: str) -> Roofline | None:
    """Bytes and FLOPs the shape needs, from the task's model; None when the task has none."""
    meta = meta_module(task)
    if meta is None or not hasattr(meta, "roofline"):
        return None
    nbytes, flops = meta.roofline(shape.as_dict(), dtype)
    return Roofline(bytes=float(nbytes), flops=float(flops))


def largest_shape(task: Task, device_kind: str) -> Shape:
    """The public shape that moves the most bytes (benchmarks time only this one)."""
    dtype = task.dtype(device_kind)
    return max(task.shapes(device_kind, hidden=False), key=lambda s: getattr(roofline(task, s, dtype), "bytes", 0.0))
