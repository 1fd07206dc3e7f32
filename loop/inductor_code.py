"""TorchInductor's code for a task's reference: what ``torch.compile`` itself would run.

``capture(task, device_kind)`` compiles the reference ``Model`` with Inductor on example inputs of
one of the task's shapes and returns the wrapper module Inductor writes (``call(args)`` plus each
``@triton.jit`` kernel as a string), and how each of the wrapper's arguments is found from the
forward inputs. It runs in the process that calls it and takes seconds (a Dynamo trace, a
lowering, a code generation); ``inductor_start`` runs it in a child process.

How, and why so:

* Every dimension of every tensor input is dynamic (``maybe_mark_dynamic``) and duck sizing is off,
  so the kernels take each size as an argument (``ks0``, ``xnumel``) instead of baking the example's
  sizes in: the candidate must run on hidden shapes it never saw. A dimension of size 1 is still
  specialised by Dynamo, so the example shape is the task's shape with the fewest 1s.
* Only code generation runs: ``GraphLowering.compile_to_module`` is replaced by one that keeps the
  wrapper's text and stops, so nothing is compiled or launched here. On a CPU machine Inductor's
  Triton backend (``cpu_backend="triton"``) is asked for; upstream Triton has no CPU driver, and
  code generation only reads the driver for a cache key (``triton_hash_with_backend``), so that
  key is given a fixed value for the capture. The kernels' text does not depend on it.
* Caches are off: a cached graph skips code generation, and there would be nothing to capture.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Sequence
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
    n_inputs: int


def example_shape(task: Task, device_kind: str, *, public_only: bool = False) -> Shape:
    """The shape with the fewest sizes of 1 (Dynamo specialises those), then the smallest.

    ``public_only``: from the public shapes alone. The code shown in a prompt is captured so: a
    size Dynamo specialised is a literal in the kernels, and a hidden size must never be one."""
    shapes = task.shapes(device_kind, hidden=False)
    if not public_only:
        shapes += task.shapes(device_kind, hidden=True)
    shapes = shapes or task.public_shapes
    if not shapes:
        raise NoInductorCode(f"{task.name} has no shapes to compile the reference on")
    return min(shapes, key=lambda s: (sum(v == 1 for _, v in s.params), sum(v for _, v in s.params)))


def capture(task: Task, device_kind: str = "cpu", *, public_only: bool = False) -> Captured:
    """Inductor's wrapper code for ``task``'s reference on ``device_kind`` ("cpu" or "cuda"),
    generated on ``example_shape`` (``public_only`` as there)."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor.graph import GraphLowering

    device = "cuda" if device_kind == "cuda" else "cpu"
    shape = example_shape(task, device_kind, public_only=public_only)
    inputs = make_inputs(task, shape, "default", 0, device)
    dtype = torch_dtype(task.dtype(device_kind))
    inputs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    module = reference_module(task)
    model = module.Model(*make_init_inputs(task, shape))
    if isinstance(model, torch.nn.Module):
        model = model.to(device).eval()
        held = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
        if held:
            # ModelNew would have to draw the same weights as Model in its own __init__: the
            # generated wrapper only sees them as extra arguments.
            raise NoInductorCode(f"the reference holds parameters or buffers ({', '.join(held[:4])}"
                                 f"{', ...' if len(held) > 4 else ''}); the Inductor start covers references "
                                 "whose forward reads only its inputs")
    tensors = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if not tensors:
        raise NoInductorCode("the reference takes no tensor input")
    for i in tensors:
        for d in range(inputs[i].dim()):
            torch._dynamo.maybe_mark_dynamic(inputs[i], d)

    captured: list[tuple[str, list[tuple[str, Any]]]] = []

    class _Stop(Exception):
        pass

    def keep_code(graph: GraphLowering) -> Any:
        wrapper, _ = graph.codegen()
        args = [(name, graph.graph_inputs.get(name)) for name in graph.graph_input_names]
        captured.append((wrapper.value, _bindings(args, inputs, tensors, graph.sizevars.optimization_hint)))
        raise _Stop

    def forward(*xs: Any) -> Any:
        return model(*xs)

    patches = [
        inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False, freezing=False,
                              **({"cpu_backend": "triton"} if device == "cpu" else {})),
        mock.patch.object(GraphLowering, "compile_to_module", keep_code),
        torch.fx.experimental._config.patch(use_duck_shape=False),
    ]
    if device == "cpu":
        patches.append(mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "KERNFORGE-CAPTURE"))
    # Dynamo imports the module a traced function lives in; the task's is loaded anonymously.
    patches.append(mock.patch.dict(sys.modules, {module.__name__: module}))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        torch._dynamo.reset()
        try:
            torch.compile(forward, fullgraph=True)(*inputs)
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
    wrapper, bindings = captured[0]
    return Captured(wrapper, bindings, shape, len(inputs))


def _bindings(args: Sequence[tuple[str, Any]], inputs: Sequence[Any], tensors: Sequence[int], hint: Any) -> tuple:
    """Each wrapper argument as an expression over ``inputs``: tensors in order, sizes as a
    dimension (or stride) of the first tensor that has them."""
    import sympy

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
                if s == node:
                    found = f"inputs[{i}].shape[{d}]"
                    break
            if found is None:
                with contextlib.suppress(Exception):
                    for d, s in enumerate(tnode.get_stride()):
                        if s == node:
                            found = f"inputs[{i}].stride({d})"
                            break
            if found:
                break
        if found is None:
            raise NoInductorCode(f"the compiled graph's size {node} is no dimension of an input")
        out.append((name, found))
    return tuple(out)


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
