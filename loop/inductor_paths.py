"""The Inductor start's two paths: Inductor's static code at the timed shape, its dynamic code elsewhere.

Why two: the start must run on hidden shapes it never saw, so its main code is Inductor's with
every size dynamic (``inductor_code``). That code cannot choose what Inductor chooses knowing the
sizes: a reduction's strategy (persistent or looped), its block sizes, a split reduction. On the
H200, at KernelBench's sizes, the dynamic kernels ran at 0.16x of ``torch.compile`` (static,
compiled per shape) on 36_RMSNorm_, 0.68x on 39_L2Norm_, 0.75x on 23_Softmax and 0.83x on
35_GroupNorm_. A benchmark times the public shape only, so the start also carries Inductor's code
compiled with static sizes for that shape (``inductor_code.timed_shape``), and ``forward`` takes
it exactly where the call's inputs are what that code was generated for.

How:

* ``renamed``: the static capture names its kernels as the dynamic one does
  (``triton_per_fused_mean_pow_0`` in both), so its kernels get the prefix ``static_`` in its
  wrapper's text before the one translator (``inductor_start.translate``) reads it: both sets of
  kernels and launchers live in one module, apart and readable.
* ``guard``: ``_at_static_sizes(inputs)`` compares every graph input (the forward inputs, then the
  weights, whose sizes follow the task's init inputs) with literals: a tensor's sizes, strides and
  dtype (the static code has all three baked in: Inductor's ``assert_size_stride`` guards them),
  a non-tensor input's value (Dynamo made it a constant). Never a tensor's values: the path
  taken depends on sizes alone, as an honest candidate's must.
* ``model_new``: ``forward`` binds its inputs and weights, then runs ``_inductor_static`` where
  the guard holds and ``_inductor_dynamic`` otherwise; each is one translated ``call()`` body.
  Without a static path (its capture failed or is not all Triton) there is the dynamic one alone.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .inductor_init import Methods

#: the prefix of the static capture's kernels (and so of their launchers: ``_launch_static_...``)
STATIC = "static_"


class NotStatic(ValueError):
    """The static capture's inputs cannot be told apart by literal comparisons."""


@dataclass(frozen=True)
class StaticCode:
    """Inductor's wrapper compiled with static sizes, and what it was compiled for."""

    wrapper: str
    #: (wrapper argument, expression over ``inputs``), as ``inductor_code.Captured.bindings``
    bindings: tuple[tuple[str, str], ...]
    #: each graph input as ``inductor_code.Captured.signature`` gives it
    signature: tuple
    #: the timed shape, as ``{"batch_size": 2, ...}``, for the start's description
    shape: dict


def static_code(reply: dict | None) -> tuple[StaticCode | None, str]:
    """The child's static capture, or why there is none (said in the start's description)."""
    if reply is None:
        return None, "there was no static capture"
    if "error" in reply:
        return None, f"the static capture failed: {reply['error']}"
    return StaticCode(reply["wrapper"], tuple(tuple(b) for b in reply["bindings"]),
                      tuple(tuple(x) for x in reply["signature"]), reply["shape"]), ""


def description(kernels: Sequence[str], static_shape: dict | None, why_not: str = "") -> str:
    """Which kernels are Inductor's on which path (static sizes at the timed shape, dynamic ones
    elsewhere) and whether kernforge's GEMM stands in for ATen's; without a static path, why not."""
    static = [k for k in kernels if k.startswith(STATIC)]
    dynamic = [k for k in kernels if k != "_kf_gemm" and k not in static]
    ours = "kernforge's Triton GEMM for the matmuls TorchInductor hands to ATen" if "_kf_gemm" in kernels else ""
    if static_shape is not None:
        sizes = ", ".join(f"{k}={v}" for k, v in static_shape.items())
        theirs = (f"TorchInductor's Triton kernels for the reference, as torch.compile generates them: with static "
                  f"sizes for the timed shape ({sizes}: {_names(static)}) and with dynamic sizes for every other "
                  f"shape ({_names(dynamic)})")
    elif dynamic:
        theirs = (f"TorchInductor's Triton kernels for the reference ({', '.join(dynamic)}), as torch.compile "
                  "generates them with dynamic sizes")
    else:
        theirs = ""
    text = ", and ".join(t for t in (theirs, ours) if t)
    return text if static_shape is not None else f"{text}; dynamic sizes only, on every shape: {why_not.rstrip('.')}"


def _names(kernels: Sequence[str]) -> str:
    return ", ".join(kernels) if kernels else "no kernel of Inductor's, the GEMM only"


def renamed(wrapper: str, prefix: str = STATIC) -> str:
    """``wrapper`` with each of its kernels named ``prefix + name``: where it is defined (the
    ``async_compile.triton`` string, its ``def``) and where ``call()`` launches it."""
    names = []
    for node in ast.parse(wrapper).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and ast.unparse(node.value.func.value) == "async_compile"
                and isinstance(node.targets[0], ast.Name)):
            names.append(node.targets[0].id)
    if not names:
        return wrapper
    pattern = r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b"
    return re.sub(pattern, lambda m: prefix + m.group(1), wrapper)


def guard(signature: Sequence) -> str:
    """``_at_static_sizes(inputs)``: True where every graph input is what the static code was
    generated for (see the module docstring). Raises ``NotStatic`` for a non-tensor input whose
    value is no literal."""
    terms: list[str] = []
    for i, item in enumerate(signature):
        if item[0] == "tensor":
            _, size, stride, dtype = item
            terms += [f"inputs[{i}].shape == {tuple(size)!r}", f"inputs[{i}].stride() == {tuple(stride)!r}",
                      f"inputs[{i}].dtype == {dtype}"]
            continue
        terms.append(_value_term(i, item[1]))
    body = "\n            and ".join(terms) or "True"
    return ("\ndef _at_static_sizes(inputs):\n"
            '    """Whether the call\'s inputs and weights have the sizes, strides and dtypes (never the values)\n'
            '    Inductor\'s static code was generated for: the timed shape."""\n'
            f"    return ({body})\n")


def _value_term(i: int, text: str) -> str:
    """A non-tensor input equal to the literal ``text`` and of its type (``True`` is no ``1``)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise NotStatic(f"input {i} is {text[:80]}, no literal to compare with") from None
    if value is None:
        return f"inputs[{i}] is None"
    if type(value) not in (int, float, bool, str, tuple):
        raise NotStatic(f"input {i} is a {type(value).__name__}, compared with no literal here")
    return f"type(inputs[{i}]) is {type(value).__name__} and inputs[{i}] == {text}"


def fixed_check(fixed: Sequence[tuple[int, int, int]]) -> str:
    """``_dynamic_code_holds(inputs)``: raises where a size the dynamic code holds as a literal
    (Dynamo specialised it) differs, so such a call fails with the reason, never gives an output
    of the wrong size or from the wrong elements."""
    return ("\n#: (input, dimension, size) that Inductor's dynamic code holds as literals: Dynamo specialised them\n"
            f"_FIXED_SIZES = {tuple(tuple(f) for f in fixed)!r}\n\n\n"
            "def _dynamic_code_holds(inputs):\n"
            "    for i, d, size in _FIXED_SIZES:\n"
            "        if inputs[i].shape[d] != size:\n"
            "            raise ValueError(f\"this start's dynamic code is Inductor's with dimension {d} of input {i} \"\n"
            "                             f\"fixed at {size} (Dynamo specialised it); this call has {inputs[i].shape[d]}\")\n")


def varied_fixed_size(task: Any, device_kind: str, fixed: Sequence[tuple[int, int, int]],
                      static_shape: Mapping[str, Any] | None) -> str | None:
    """Why a start whose dynamic code holds ``fixed`` sizes (``fixed_check``) would fail one of
    the task's shapes, or None: at a shape other than the static path's (``static_shape``) an
    input has another size there. Its verdict would be a rejection, so the start is not made.
    Sizes come from the reference's ``get_inputs`` on the meta device (no memory at any size); a
    task whose inputs cannot be drawn there (its meta.py draws them) is not judged here. A hidden
    shape is said as such, never by its sizes."""
    import torch

    from kernforge.tasks import runtime

    if not fixed or hasattr(runtime.meta_module(task), "make_inputs"):
        return None
    module = runtime.load_module(task.reference_path, fresh=True)  # its size globals are set below: a copy of its own
    for hidden in (False, True):
        for shape in task.shapes(device_kind, hidden=hidden):
            if static_shape is not None and shape.as_dict() == dict(static_shape):
                continue
            runtime.set_shape(module, shape)
            try:
                with torch.device("meta"):
                    sizes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in module.get_inputs()]
            except Exception:  # noqa: BLE001 - an input the meta device cannot draw: not judged here
                return None
            for i, d, size in fixed:
                if i < len(sizes) and sizes[i] is not None and d < len(sizes[i]) and sizes[i][d] != size:
                    where = "a hidden shape" if hidden else f"public shape {shape.label}"
                    return (f"Inductor's dynamic code holds dimension {d} of input {i} at {size} (Dynamo specialised "
                            f"it), and {where} has {sizes[i][d]} there: a start from it would be rejected")
    return None


def model_new(dynamic: Sequence[str], static: Sequence[str] | None, n_inputs: int,
              state: Sequence[tuple[str, str]], methods: Methods | None, *, fixed: bool = False) -> str:
    """``ModelNew``: the reference's own ``__init__`` where it holds weights (so it draws the same
    ones); a ``forward`` that binds its inputs, then those weights in the wrapper's order, and
    takes the static path (``static``: its translated body) at the static sizes, else the
    dynamic one."""
    args = ", ".join(f"x{i}" for i in range(n_inputs))
    held = [f'self.get_{kind}("{name}")' for kind, name in state]
    items = [f"x{i}" for i in range(n_inputs)] + held
    init = (textwrap.indent(methods.source, "    ") if methods is not None else
            "    def __init__(self, *args, **kwargs):\n        super().__init__()")
    forward = [f"    def forward(self, {args}):",
               *(["        # the reference's parameters and buffers follow the inputs, as Inductor's call() takes them"]
                 if held else []),
               f"        inputs = ({', '.join(items)}{',' if len(items) == 1 else ''})",
               "        device = next(x.device for x in inputs if isinstance(x, torch.Tensor))",
               *(["        if _at_static_sizes(inputs):",
                  "            return self._inductor_static(inputs, device)"] if static is not None else []),
               *(["        _dynamic_code_holds(inputs)"] if fixed else []),
               "        return self._inductor_dynamic(inputs, device)"]
    paths = [_path("_inductor_dynamic", "Inductor's code with dynamic sizes: any shape", dynamic)]
    if static is not None:
        paths.insert(0, _path("_inductor_static", "Inductor's code with static sizes: the timed shape only", static))
    return "\nclass ModelNew(nn.Module):\n" + init + "\n\n" + "\n".join(forward) + "\n" + "".join(paths)


def _path(name: str, what: str, body: Sequence[str]) -> str:
    """One path: a translated ``call()`` body as a static method of ``ModelNew``."""
    return (f"\n    @staticmethod\n    def {name}(inputs, device):\n        # {what}\n"
            + "".join(f"        {line}\n" for line in body))
