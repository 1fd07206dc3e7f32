"""What an exported op looks like, read off a task's reference: arguments, outputs, sizes.

The op takes the reference's ``forward`` arguments followed by its ``__init__`` arguments (so
``moe_topk_softmax(gating_output, top_k)``); it returns what ``forward`` returns, or nothing when
the task writes its inputs in place. Sizes are read on the ``meta`` device, so a 16384 x 8192
shape costs nothing to inspect;
the output's structure comes from one real call at the task's smallest shape.

The dispatch vector of a call is the sizes of its tensor arguments, dimension by dimension, then
its scalar arguments: what the exported package can see at run time without knowing what the
task's size globals (T, H, ...) mean.
"""

from __future__ import annotations

import inspect
import keyword
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from kernforge.tasks import runtime
from kernforge.tasks.spec import Shape, Task

from .errors import ArchiveError

#: Python types a custom op argument may have here, by the kind the manifest names.
SCALAR_KINDS = {bool: "bool", int: "int", float: "float"}


class UnsupportedTask(ArchiveError):
    """The task's op cannot be exported as a torch.library custom op (the reason says why)."""


@dataclass(frozen=True)
class Arg:
    name: str
    #: "tensor", "int", "float" or "bool"
    kind: str
    #: True for an argument of the reference's ``__init__`` (after the forward arguments)
    init: bool = False


@dataclass(frozen=True)
class Signature:
    args: tuple[Arg, ...]
    #: number of tensors returned; 0 when the op only writes its inputs
    n_outputs: int
    #: a tuple is returned (even of one tensor)
    returns_tuple: bool
    mutated: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "args": [{"name": a.name, "kind": a.kind, "init": a.init} for a in self.args],
            "n_outputs": self.n_outputs,
            "returns_tuple": self.returns_tuple,
            "mutated": list(self.mutated),
        }


def _names(fn: Any, count: int, prefix: str) -> list[str]:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if plain and len(params) == count:
        return [p.name for p in params]
    return [f"{prefix}{i}" for i in range(count)]


def _kind(value: Any, where: str) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if type(value) in SCALAR_KINDS:
        return SCALAR_KINDS[type(value)]
    raise UnsupportedTask(f"{where} is a {type(value).__name__}; a custom op takes tensors, ints, floats and bools")


def meta_inputs(task: Task, shape: Shape) -> tuple[list[Any], list[Any]]:
    """(inputs, init inputs) of the reference at ``shape``, tensors on the meta device."""
    module = runtime.reference_module(task)
    runtime.set_shape(module, shape)
    init = list(module.get_init_inputs())
    try:
        with torch.device("meta"):
            inputs = list(module.get_inputs())
    except Exception as error:  # the task's own code: say which task and why
        raise UnsupportedTask(
            f"{task.name}: its get_inputs() cannot run on the meta device at {shape.label} "
            f"({type(error).__name__}: {error}), so the export cannot read its sizes"
        ) from None
    return inputs, init


def sample_call(task: Task) -> tuple[list[Any], list[Any], Any]:
    """(inputs, init inputs, output) of one real call of the reference at its smallest shape, on
    the CPU; then the same call on the meta device, which stands in for the fake tensors the
    exported op's fake implementation (torch.compile's view of it) will run the reference on."""
    shape = runtime.smallest_shape(task)
    module = runtime.reference_module(task)
    inputs = runtime.make_inputs(task, shape, "default", 0, "cpu")
    init = runtime.make_init_inputs(task, shape)
    model = module.Model(*init)
    if isinstance(model, torch.nn.Module) and any(True for _ in (*model.parameters(), *model.buffers())):
        raise UnsupportedTask(f"{task.name}: its reference owns weights; the export handles tasks whose weights are inputs")
    try:
        output = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    except Exception as error:
        raise UnsupportedTask(
            f"{task.name}: its reference failed on the CPU at {shape.label}: {type(error).__name__}: {error}"
        ) from None
    if output is not None:
        try:
            model(*[x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs])
        except Exception as error:
            raise UnsupportedTask(
                f"{task.name}: its reference cannot run without tensor data ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:160]}), so the op would have no fake implementation for "
                "torch.compile; a reference whose outputs depend on tensor values through Python is not exported"
            ) from None
    return inputs, init, output


def signature(task: Task) -> Signature:
    inputs, init, output = sample_call(task)
    module = runtime.reference_module(task)
    names = _names(module.Model.forward, len(inputs), "arg") + _names(module.Model.__init__, len(init), "init")
    if len(set(names)) != len(names) or any(keyword.iskeyword(n) or n.startswith("_") for n in names):
        names = [f"arg{i}" for i in range(len(inputs))] + [f"init{i}" for i in range(len(init))]
    values = inputs + init
    args = tuple(
        Arg(name, _kind(value, f"{task.name}: argument {name!r}"), init=i >= len(inputs))
        for i, (name, value) in enumerate(zip(names, values))
    )
    if not any(a.kind == "tensor" for a in args):
        raise UnsupportedTask(f"{task.name}: the reference takes no tensor, so there is nothing to dispatch on")
    mutated = tuple(names[i] for i in task.mutated_inputs)
    if any(args[i].kind != "tensor" for i in task.mutated_inputs):
        raise UnsupportedTask(f"{task.name}: MUTATED_INPUTS names an argument that is not a tensor")
    if output is None:
        if not mutated:
            raise UnsupportedTask(f"{task.name}: the reference returns nothing and writes no input")
        return Signature(args, 0, False, mutated)
    outs = list(output) if isinstance(output, (tuple, list)) else [output]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise UnsupportedTask(f"{task.name}: the reference must return a tensor, a tuple of tensors or None")
    if mutated:
        raise UnsupportedTask(f"{task.name}: writes inputs in place and also returns tensors; export one or the other")
    return Signature(args, len(outs), isinstance(output, (tuple, list)), mutated)


def dispatch_vector(task: Task, shape: Shape) -> tuple[int | float, ...]:
    """The sizes of every tensor argument, dimension by dimension, then the scalar arguments."""
    inputs, init = meta_inputs(task, shape)
    return vector_of(inputs + init)


def vector_of(values: Sequence[Any]) -> tuple[int | float, ...]:
    out: list[int | float] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.extend(int(d) for d in v.shape)
        else:
            out.append(v if isinstance(v, float) else int(v))
    return tuple(out)


def axis_names(task: Task, sig: Signature) -> list[str]:
    """Labels for the dispatch vector's components: ``x.0``, ``x.1``, ``weight.0``, ``top_k``."""
    inputs, init = meta_inputs(task, runtime.smallest_shape(task))
    names = []
    for arg, value in zip(sig.args, inputs + init):
        if isinstance(value, torch.Tensor):
            names.extend(f"{arg.name}.{d}" for d in range(value.dim()))
        else:
            names.append(arg.name)
    return names


def input_layout(task: Task, dtype: str) -> list[dict[str, Any]]:
    """Dtype and rank of each tensor argument as the verifier drew them for ``dtype``.

    Drawn for real on the CPU at the task's smallest interpreter shape: the meta device would
    skip the casts a task's ``make_inputs`` does.
    """
    inputs = runtime.sample_inputs(task, runtime.smallest_shape(task), dtype)
    return [
        {"dtype": str(v.dtype).removeprefix("torch."), "ndim": v.dim()} if isinstance(v, torch.Tensor) else None
        for v in inputs
    ]
