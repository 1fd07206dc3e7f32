"""TorchInductor's code for a task's reference: what ``torch.compile`` itself would run.

``capture(task, device_kind)`` compiles the reference ``Model`` with Inductor on example inputs of
one of the task's shapes and returns the wrapper module Inductor writes (``call(args)`` plus each
``@triton.jit`` kernel as a string), and how each of the wrapper's arguments is found from the
forward inputs and the reference's weights. It runs in the process that calls it and takes seconds
(a Dynamo trace, a lowering, a code generation); ``inductor_start`` runs it in a child process,
twice there: with dynamic sizes, then with static ones (``static=True``), one after the other.

How, and why so:

* The reference's parameters and buffers are graph inputs after the forward inputs: the function
  compiled is ``(model, *inputs, *weights) -> functional_call(model, weights, inputs)``, so each
  weight is a wrapper argument bound to ``inputs[n_inputs + j]`` (``Captured.state`` names them),
  which the start's ``ModelNew`` fills from the weights its own ``__init__`` drew. Inlined into
  the graph instead, a weight would be a constant of the code, drawn once on the example shape.
* The reference runs as the judge runs it: in training mode (``tasks/runtime.build_model`` never
  calls ``eval()``) and under ``no_grad`` (an inference graph: nothing kept for a backward pass).

* Every dimension of every tensor input and weight is dynamic (``maybe_mark_dynamic``) and duck
  sizing is off, so the kernels take each size as an argument (``ks0``, ``xnumel``) instead of
  baking the example's sizes in: the candidate must run on hidden shapes it never saw. A dimension
  of size 1 is still specialised by Dynamo, so the example shape is the task's shape with the
  fewest 1s. A module's int attributes are constants to Dynamo; those that differ between the
  task's shapes (``LayerNorm.normalized_shape``; found by building the model for each shape on
  the meta device) are traced as symbols too (``dynamic_sources``), and the others (a pooling's
  kernel size) stay the constants they are. Floats stay constants (a scaling factor).
* The dynamic code indexes in 64 bits (``_no_32bit_indexing``): Inductor's 32-bit indices hold
  only under a guard on the sizes, which the start does not have.
* ``static=True`` is the other code: compiled with ``dynamic=False`` on the timed shape
  (``timed_shape``: the first public shape of the device kind, the one a benchmark times), every
  size a literal, as ``torch.compile`` compiles per shape. Why a second capture: Inductor chooses a
  reduction's strategy, its block sizes and split reductions knowing the sizes, and the dynamic
  code cannot (on the H200 it ran at 0.16x of ``torch.compile`` on 36_RMSNorm_, 0.75x on
  23_Softmax; element-wise ops about 0.97x). The start takes it at exactly the sizes it was
  compiled for (``Captured.signature``: each input's sizes, strides and dtype), the dynamic code
  everywhere else (``inductor_paths``).
* Only code generation runs: ``GraphLowering.compile_to_module`` is replaced by one that keeps the
  wrapper's text and stops, so nothing is compiled or launched here. On a CPU machine Inductor's
  Triton backend (``cpu_backend="triton"``) is asked for; upstream Triton has no CPU driver, and
  code generation only reads the driver for a cache key (``triton_hash_with_backend``), so that
  key is given a fixed value for the capture. The kernels' text does not depend on it.
* Caches are off: a cached graph skips code generation, and there would be nothing to capture.
* Two captures share one process: the task's module is put in ``sys.modules`` and taken out again,
  alone (``_importable``), so the modules the first compile imported stay imported for the second.
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from unittest import mock

from kernforge.tasks.runtime import make_init_inputs, make_inputs, reference_module, torch_dtype
from kernforge.tasks.spec import Shape, Task


class NoInductorCode(Exception):
    """Inductor produced nothing usable for this reference; the message says why."""


@dataclass(frozen=True)
class Captured:
    """Inductor's wrapper module for one reference and how to bind its arguments."""

    wrapper: str
    #: (wrapper argument name, Python expression over ``inputs`` that gives it), in argument order
    bindings: tuple[tuple[str, str], ...]
    #: the example shape the code was generated on (its sizes are symbolic in the code)
    shape: Shape
    #: forward inputs; ``inputs[n_inputs:]`` are the reference's ``state`` tensors
    n_inputs: int
    #: the reference's parameters then buffers, as ("parameter" or "buffer", name) in the order of
    #: ``named_parameters()`` then ``named_buffers()``: the wrapper takes them as arguments after
    #: the forward inputs, bound as ``inputs[n_inputs + j]``
    state: tuple[tuple[str, str], ...] = ()
    #: each graph input (the forward inputs, then the state) as ``_signature`` gives it
    signature: tuple = ()
    #: (input, dimension, size) of every tensor size that is a literal in dynamic code: Dynamo
    #: specialised it (a size of 1, or one a guard fixed), so the code holds only where it is so
    fixed: tuple[tuple[int, int, int], ...] = ()
    #: the guards Dynamo put on the symbolic sizes (sympy's text, say ``Eq(s18 - 1, 1)``): the
    #: code was generated for sizes where they hold
    guards: tuple[str, ...] = ()


def example_shape(task: Task, device_kind: str, *, public_only: bool = False) -> Shape:
    """The shape with the fewest sizes of 1 (Dynamo specialises those), then the smallest.

    ``public_only``: from the public shapes alone. The code shown in a prompt is captured so: a
    size Dynamo specialised is a literal in the kernels, and a hidden size must never be one."""
    return example_shapes(task, device_kind, public_only=public_only)[0]


def example_shapes(task: Task, device_kind: str, *, public_only: bool = False) -> list[Shape]:
    """Every shape ``example_shape`` chooses from, best first."""
    shapes = task.shapes(device_kind, hidden=False)
    if not public_only:
        shapes += task.shapes(device_kind, hidden=True)
    shapes = shapes or task.public_shapes
    if not shapes:
        raise NoInductorCode(f"{task.name} has no shapes to compile the reference on")
    return sorted(shapes, key=lambda s: (sum(v == 1 for _, v in s.params), sum(v for _, v in s.params)))


def timed_shape(task: Task, device_kind: str) -> Shape:
    """The shape a benchmark times: the first public shape for the device kind (on the H200 a
    KernelBench benchmark times its public shape only). The static capture is made on it."""
    shapes = task.shapes(device_kind, hidden=False) or task.public_shapes
    if not shapes:
        raise NoInductorCode(f"{task.name} has no public shape to compile the reference on")
    return shapes[0]


def capture(task: Task, device_kind: str = "cpu", *, public_only: bool = False, static: bool = False,
            shape: Shape | None = None) -> Captured:
    """Inductor's wrapper code for ``task``'s reference on ``device_kind`` ("cpu" or "cuda"),
    generated on ``shape`` (by default ``example_shape``, ``public_only`` as there) with every size dynamic; or, with
    ``static``, on ``timed_shape`` with every size a literal of the code (``Captured.signature``
    says which sizes those are)."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor.graph import GraphLowering

    device = "cuda" if device_kind == "cuda" else "cpu"
    if static:
        shape = timed_shape(task, device_kind)
    elif shape is None:
        shape = example_shape(task, device_kind, public_only=public_only)
    module = reference_module(task)
    varying = [] if static else _varying_sizes(task, device_kind, module)
    inputs = make_inputs(task, shape, "default", 0, device)
    dtype = torch_dtype(task.dtype(device_kind))
    inputs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    model = module.Model(*make_init_inputs(task, shape))
    _as_lists(model, varying)
    held, state = _state_of(model, device)
    names = [name for _, name in held]
    args = inputs + state
    tensors = [i for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
    if not any(i < len(inputs) for i in tensors):
        raise NoInductorCode("the reference takes no tensor input")
    for i in tensors if not static else ():
        for d in range(args[i].dim()):
            torch._dynamo.maybe_mark_dynamic(args[i], d)

    captured: list[tuple[str, list[tuple[str, Any]], tuple, tuple[str, ...]]] = []

    class _Stop(Exception):
        pass

    def keep_code(graph: GraphLowering) -> Any:
        wrapper, _ = graph.codegen()
        taken = [(name, graph.graph_inputs.get(name)) for name in graph.graph_input_names]
        bindings = _bindings(taken, args, tensors, graph.sizevars)
        guards = tuple(str(g.expr) for g in graph.sizevars.shape_env.guards)
        captured.append((wrapper.value, bindings, () if static else _fixed(taken, bindings), guards))
        raise _Stop

    def forward(reference: Any, *xs: Any) -> Any:
        # The model is an argument, not a global: Dynamo specialises every int of a non-local
        # object, and an nn.Module's ints only where allow_unspec_int_on_nn_module is off.
        if not names:
            return reference(*xs)
        weights = dict(zip(names, xs[len(inputs):]))
        return torch.func.functional_call(reference, weights, tuple(xs[:len(inputs)]), strict=True)

    patches = [
        inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False, freezing=False,
                              **({"cpu_backend": "triton"} if device == "cpu" else {})),
        mock.patch.object(GraphLowering, "compile_to_module", keep_code),
        torch.fx.experimental._config.patch(use_duck_shape=False),
        # a module's sizes that follow the shape are symbols; its other ints and its floats (a
        # kernel size, a scaling factor) stay constants, as they were in the reference's code
        torch.compiler.config.patch(dynamic_sources=",".join(_source_pattern(p, a) for p, a in varying)),
        torch._dynamo.config.patch(specialize_float=True),
    ]
    if device == "cpu":
        patches.append(mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "KERNFORGE-CAPTURE"))
    if not static:
        # 64-bit indices at every size: the code runs at shapes it never saw, without the guard
        # Inductor's own 32-bit code installs (SIMDScheduling.can_use_32bit_indexing)
        from torch._inductor.codegen.simd import SIMDScheduling

        patches.append(mock.patch.object(SIMDScheduling, "can_use_32bit_indexing", staticmethod(_no_32bit_indexing)))
        # the same pooling, traced as the 2-d one over a row: Dynamo keeps its length a symbol
        patches.append(mock.patch.object(torch, "max_pool1d", _max_pool1d_as_2d))
        patches.append(mock.patch.object(torch, "max_pool1d_with_indices", _max_pool1d_with_indices_as_2d))
    patches.append(_importable(module))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        torch._dynamo.reset()
        try:
            with torch.no_grad():  # as the judge calls it: an inference graph, nothing saved for backward
                torch.compile(forward, fullgraph=True, dynamic=False if static else None)(model, *args)
        except NoInductorCode:
            raise
        except Exception as error:  # Dynamo wraps our stop; anything else is Inductor's own reason
            ours = _ours(error)
            if ours is not None:
                raise ours from None
            if not captured:
                raise NoInductorCode(f"torch.compile failed on the reference: {_first_line(error)}") from None
        finally:
            torch._dynamo.reset()
    if len(captured) != 1:
        raise NoInductorCode(f"Inductor compiled {len(captured)} graphs for the reference, not one")
    wrapper, bindings, fixed, guards = captured[0]
    return Captured(wrapper, bindings, shape, len(inputs), held, _signature(args), fixed, guards)


def _max_pool1d_as_2d(input: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                      ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """``torch.max_pool1d`` (and, with ``return_indices``, ``torch.max_pool1d_with_indices``) for
    the dynamic capture, as ``F.max_pool2d`` over one row: the same values and indices. Traced as
    itself, with a dilation, Dynamo fixed the length (41_Max_Pooling_1D: ``Eq(L, 64)`` from inside
    ``max_pool1d``), so the start could serve one length only; the 2-d pooling keeps it a symbol."""
    import torch.nn.functional as F

    def one(value: Any, default: int = 0) -> int:
        if isinstance(value, (tuple, list)):
            value = value[0] if value else None
        return default if value is None else int(value)

    k = one(kernel_size)
    out = F.max_pool2d(input.unsqueeze(-2), (1, k), (1, one(stride, k)), (0, one(padding)), (1, one(dilation, 1)),
                       ceil_mode=ceil_mode, return_indices=return_indices)
    return tuple(t.squeeze(-2) for t in out) if return_indices else out.squeeze(-2)


def _max_pool1d_with_indices_as_2d(*args: Any, **kwargs: Any) -> Any:
    return _max_pool1d_as_2d(*args, **kwargs, return_indices=True)


def _no_32bit_indexing(numel: Any, buffers: Any) -> bool:
    """Inductor's test for 32-bit indices, answered no for the dynamic capture. Inductor picks
    32-bit indices where the example's sizes fit and guards its compiled graph with the sizes'
    bound (a larger call recompiles); the start has no guard and runs at every hidden shape, so
    with 32-bit indices 45_Average_Pooling_2D's dynamic kernels overflowed at its hidden shapes of
    3.5e9 elements (13 x 64 x 2048 x 2048), a CUDA error on the H200. The static code keeps
    Inductor's choice: it is taken at exactly the sizes it was compiled for."""
    return False


def _fixed(taken: Sequence[tuple[str, Any]], bindings: Sequence[tuple[str, str]]) -> tuple[tuple[int, int, int], ...]:
    """The literal sizes of the graph's tensor inputs, as (input, dimension, size): those Dynamo
    specialised although every size was marked dynamic (41_Max_Pooling_1D's length was one, and
    its start gave a wrong output length at every other length)."""
    import sympy

    where = dict(bindings)
    out = []
    for name, node in taken:
        found = re.fullmatch(r"inputs\[(\d+)\]", where.get(name, ""))
        if found is None or node is None or isinstance(node, sympy.Expr):
            continue
        for d, size in enumerate(node.get_size()):
            if isinstance(size, (int, sympy.Integer)):
                out.append((int(found.group(1)), d, int(size)))
    return tuple(out)


def _signature(args: Sequence[Any]) -> tuple:
    """What each graph input was on the capture's shape: ("tensor", sizes, strides, dtype) for a
    tensor (``"torch.float32"``), ("value", its repr) for anything else. Static code holds these
    as literals, so it may run only on inputs that match them all."""
    import torch

    return tuple(("tensor", tuple(x.shape), tuple(x.stride()), str(x.dtype)) if isinstance(x, torch.Tensor)
                 else ("value", repr(x)) for x in args)


@contextlib.contextmanager
def _importable(module: Any) -> Iterator[None]:
    """The task's module in ``sys.modules`` while Dynamo traces (it imports the module a traced
    function lives in; the task's is loaded anonymously), and only it: restoring all of
    ``sys.modules`` (``mock.patch.dict``) would drop the modules the compile imported, and a
    second capture in the same process would import them again (``duplicate name:
    dynamo_minifier_backend``, a backend registered at import)."""
    sys.modules[module.__name__] = module
    try:
        yield
    finally:
        sys.modules.pop(module.__name__, None)


def _state_of(model: Any, device: str) -> tuple[tuple[tuple[str, str], ...], list[Any]]:
    """The reference's parameters, then its buffers, by name, as plain tensors on ``device``.

    They are compiled as graph inputs after the forward inputs (``functional_call``): the
    wrapper then takes each as an argument, which ``ModelNew`` passes from its own weights (drawn
    as the reference draws them). Plain tensors, not ``nn.Parameter``: Dynamo keeps a parameter's
    sizes static, and a hidden shape's weights have other sizes. The model stays in training mode,
    as the judge builds and calls it (``tasks/runtime.build_model``)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return (), []
    model.to(device)
    held = [("parameter", n, t) for n, t in model.named_parameters()]
    held += [("buffer", n, t) for n, t in model.named_buffers()]
    return tuple((kind, n) for kind, n, _ in held), [t.detach() for _, _, t in held]


def _varying_sizes(task: Task, device_kind: str, module: Any) -> list[tuple[str, str]]:
    """(submodule path, attribute) of each int, or tuple of ints, that the reference's modules hold
    with other values on other shapes of the task (``LayerNorm.normalized_shape`` follows
    ``features``; a pooling's kernel size does not).

    Dynamo specialises a module's ints: Inductor's code would have the example's sizes as
    literals (``288`` for a row of 4 x 8 x 9) and be wrong on a shape with other sizes. These,
    and only these, are traced as symbols: the others stay the constants the kernels are best
    with. Each shape's model is built on the meta device (no memory, no time: KernelBench's
    weights are GBs); a reference that cannot be built so gives none."""
    import torch

    seen: dict[tuple[str, str], set] = {}
    shapes = task.shapes(device_kind, hidden=False) + task.shapes(device_kind, hidden=True)
    try:
        for shape in shapes:
            with torch.device("meta"):
                model = module.Model(*make_init_inputs(task, shape))
            for path, sub in model.named_modules() if isinstance(model, torch.nn.Module) else ():
                for key, value in vars(sub).items():
                    if type(value) is int or (isinstance(value, tuple) and value and all(type(v) is int for v in value)):
                        seen.setdefault((path, key), set()).add(value)
    except Exception:  # the reference's own __init__ on the meta device: nothing is known to vary
        return []
    return [key for key, values in seen.items() if len(values) > 1]


def _as_lists(model: Any, varying: Sequence[tuple[str, str]]) -> None:
    """Each varying tuple of ints of ``model`` as a list: Dynamo takes a tuple of ints as one
    constant, a list's items one by one, each a symbol (bound to the weight dimension it equals).
    A list reads the same wherever a size sequence is expected."""
    for path, key in varying:
        sub = model.get_submodule(path)
        if isinstance(getattr(sub, key), tuple):
            setattr(sub, key, list(getattr(sub, key)))


def _source_pattern(path: str, key: str) -> str:
    """A ``dynamic_sources`` regex for attribute ``key`` of submodule ``path`` of the model passed
    as ``reference`` (Dynamo names it ``L['reference']._modules['ln'].normalized_shape[0]``)."""
    parts = "".join(rf".*\['{re.escape(p)}'\]" for p in path.split(".") if p)
    return rf"L\['reference'\]{parts}\.{re.escape(key)}(\[\d+\])?$"


def _bindings(args: Sequence[tuple[str, Any]], inputs: Sequence[Any], tensors: Sequence[int], sizevars: Any) -> tuple:
    """Each wrapper argument as an expression over ``inputs``: tensors in order, sizes as a
    dimension (or stride) of the first tensor that has them. A size is compared after Inductor's
    replacements: where a guard made two sizes one (a weight's in_features and the input's), the
    wrapper still takes both symbols, and the tensors' sizes name only the one kept."""
    import sympy

    hint, same = sizevars.optimization_hint, (lambda a, b: sizevars.simplify(a) == sizevars.simplify(b))

    out: list[tuple[str, str]] = []
    remaining = list(tensors)
    tensor_args: list[tuple[str, Any, int]] = []
    for name, node in args:
        if node is None or isinstance(node, sympy.Expr):
            continue
        size = [int(hint(s)) for s in node.get_size()]
        match = next((i for i in remaining if list(inputs[i].shape) == size and inputs[i].dtype == node.get_dtype()), None)
        if match is None:
            raise NoInductorCode(f"cannot tell which input the compiled graph's {name} is")
        remaining.remove(match)
        tensor_args.append((name, node, match))
    by_name = {name: f"inputs[{i}]" for name, _, i in tensor_args}
    for name, node in args:
        if name in by_name:
            out.append((name, by_name[name]))
            continue
        if not isinstance(node, sympy.Symbol):
            raise NoInductorCode(f"the compiled graph takes {name} = {node!r}, not a tensor or a size")
        found = None
        for tname, tnode, i in tensor_args:
            for d, s in enumerate(tnode.get_size()):
                if same(s, node):
                    found = f"inputs[{i}].shape[{d}]"
                    break
            if found is None:
                with contextlib.suppress(Exception):
                    for d, s in enumerate(tnode.get_stride()):
                        if same(s, node):
                            found = f"inputs[{i}].stride({d})"
                            break
            if found:
                break
        if found is None:
            raise NoInductorCode(_unbound(node, sizevars))
        out.append((name, found))
    return tuple(out)


def _unbound(symbol: Any, sizevars: Any) -> str:
    """Why a size argument of the compiled graph cannot be bound: where it is a module attribute
    that differs between the task's shapes (a reduction's ``dim``), one compiled code cannot
    serve them all, and the reason names it."""
    sources = [s.name for s in sizevars.shape_env.var_to_sources.get(symbol, [])]
    attribute = next((m for m in map(_ATTRIBUTE.match, sources) if m), None)
    if attribute is None:
        return f"the compiled graph's size {symbol} is no dimension of an input"
    where = ".".join([*re.findall(r"\['(\w+)'\]", attribute.group(1)), attribute.group(2)])
    return (f"the reference's Model.{where} differs between the task's shapes and is no size of a tensor: "
            "one compiled code cannot serve them all")


#: a module attribute's Dynamo source: L['reference']._modules['ln'].normalized_shape[0]
_ATTRIBUTE = re.compile(r"^L\['reference'\]((?:\._modules\['\w+'\])*)\.(\w+)")


def _ours(error: BaseException | None) -> NoInductorCode | None:
    """Our own reason, raised inside Inductor's code generation and wrapped by Dynamo."""
    seen = 0
    while error is not None and seen < 20:
        if isinstance(error, NoInductorCode):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
