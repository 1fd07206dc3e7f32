"""The Triton interpreter made usable for CPU verdicts (``TRITON_INTERPRET=1``; trusted start-up).

The harness calls ``install`` in its warm-up, before any candidate code. The interpreter's
reductions and autotuning are made cheaper without changing what a kernel computes, and libdevice's
functions, which the interpreter cannot call at all, get NumPy's (``_libdevice``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])

#: libdevice's functions by their name in its symbols (``__nv_tanhf``: ``tanh``), as NumPy computes
#: them: those whose C meaning NumPy's function has (not ``round``: C rounds half away from zero)
NUMPY: dict[str, Callable[..., Any]] = {
    "tanh": np.tanh, "expm1": np.expm1, "log1p": np.log1p, "exp": np.exp, "exp2": np.exp2,
    "exp10": lambda x: np.power(np.asarray(10, x.dtype), x), "log": np.log, "log2": np.log2, "log10": np.log10,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint, "fabs": np.abs, "pow": np.power,
    "atan2": np.arctan2, "fmod": np.fmod, "hypot": np.hypot,
    "copysign": np.copysign, "erf": _erf, "erfc": _erfc,
    "isinf": np.isinf, "isnan": np.isnan, "signbit": np.signbit,
}


def install() -> None:
    _alike_autotune()
    _sliced_reduce()
    _libdevice()


def _alike_autotune() -> None:
    """Under the Triton interpreter there is no device to time an autotuner's configs on (Triton
    asks for a GPU driver and fails): every config times alike and the first one is used. The
    interpreter's times mean nothing anyway; a GPU worker times the configs for real."""
    from triton.runtime import autotuner

    def alike(kernel_call: Any, quantiles: Any = None, **_: Any) -> list[float]:
        return [0.0] * len(quantiles or (0.5,))

    autotuner.Autotuner.do_bench = property(lambda self: alike)


def _sliced_reduce() -> None:
    """A reduction whose combine function is the kernel's own (Inductor's ``max2``, its Welford
    steps, any ``tl.reduce``): the interpreter calls that function once per element, from Python
    (a softmax start's call at 4 x 300 took 5.5 s, almost all of it in one ``max2``). ``folded``
    makes the same left fold along the axis one slice at a time: each output element sees the same
    pairs, in the same order, as before; the combine function, elementwise like every Triton
    combine function, gets a block of elements instead of one. Left as it is if this Triton's
    interpreter is not laid out as expected (slow then, never wrong)."""
    from triton.runtime import interpreter

    ops = getattr(interpreter, "ReduceOps", None)
    if ops is None or not all(hasattr(ops, name) for name in ("generic_reduce", "unravel", "to_tensor")):
        return
    ops.generic_reduce = folded


def folded(self: Any, input: tuple[Any, ...]) -> list[Any]:
    """``ReduceOps.generic_reduce`` by slices (``_sliced_reduce``); ``self`` is the reduction."""
    import numpy as np
    import triton.language as tl

    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    data = [arg.handle.data for arg in input]
    shape = data[0].shape
    out_shape = shape[:axis] + shape[axis + 1:]
    if shape[axis] == 0:
        acc = [np.zeros(out_shape, dtype=d.dtype) for d in data]
    else:
        acc = [np.array(np.take(d, 0, axis=axis), dtype=d.dtype) for d in data]
    for k in range(1, shape[axis]):
        got = self.combine_fn.fn(*(self.to_tensor(a, arg.dtype) for a, arg in zip(acc, input)),
                                 *(self.to_tensor(np.take(d, k, axis=axis), arg.dtype) for d, arg in zip(data, input)))
        got = got if isinstance(got, tuple) else (got,)
        for j, value in enumerate(got):
            value = np.asarray(value.handle.data if isinstance(value, tl.core.tensor) else value)
            # a scalar's handle holds one element in a 1-d array: spread it over the output
            value = value.reshape(()) if value.size == 1 else value
            acc[j] = np.broadcast_to(value, out_shape).astype(data[j].dtype)
    ret = []
    for j, out in enumerate(acc):
        if self.keep_dims:
            if original_axis is not None:
                out = np.expand_dims(out, axis)
            else:
                for _ in range(len(shape)):
                    out = np.expand_dims(out, 0)
        elif original_axis is None:
            out = out.item()
        ret.append(self.to_tensor(out, input[j].dtype))
    return ret


def _libdevice(patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """libdevice's functions under the interpreter. Inductor's kernels call them
    (``libdevice.tanh``, ``expm1``, ``log1p``: 22_Tanh, 27_SELU_, 29_Softplus, 31_ELU and
    88_MinGPTNewGelu's starts), and so may a candidate's; the interpreter left
    ``triton.language.extra.libdevice``'s functions the stubs they are before a GPU compile
    resolves them (each returned None: "cannot convert None to tensor"), and refuses the CUDA
    ones' external calls. Both now take the CUDA functions (their types, their broadcasting), whose
    external call the interpreter makes with NumPy's function of the symbol's name (``NUMPY``); a
    symbol NumPy lacks is refused, naming it. The figures may differ from CUDA's libdevice in the
    last bits, as the interpreter's ``tl.exp`` may from the GPU's."""
    from triton.language import core
    from triton.language.extra import libdevice as stub
    from triton.runtime import interpreter

    try:
        from triton.language.extra.cuda import libdevice as cuda
    except ImportError:  # a Triton without CUDA's libdevice: its stubs stay
        return
    semantic = interpreter.interpreter_semantic
    for name in dir(cuda):
        fn = getattr(cuda, name)
        if not core.is_builtin(fn):
            continue

        def call(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            kwargs["_semantic"] = semantic  # what a GPU compile passes a builtin
            return _fn(*args, **kwargs)

        patch(cuda, name, call)
        if hasattr(stub, name):
            patch(stub, name, call)
    patch(interpreter.InterpreterBuilder, "create_extern_elementwise", _extern_elementwise)


def _extern_elementwise(self: Any, lib_name: str, lib_path: str, symbol: str, args: list, ret_type: Any,
                        is_pure: bool) -> Any:
    """The interpreter's external elementwise call (``_libdevice``): NumPy's function of the symbol's
    name (``__nv_expm1f`` and ``__nv_expm1``: ``expm1``; ``__nv_isinfd``: ``isinf``)."""
    from triton.runtime import interpreter

    base = symbol.removeprefix("__nv_")
    fn = NUMPY.get(base)
    if fn is None and base[-1:] in ("f", "d"):
        fn = NUMPY.get(base[:-1])
    if fn is None:
        raise NotImplementedError(f"libdevice's {symbol} has no implementation in the Triton interpreter")
    scalar = ret_type.scalar
    with np.errstate(all="ignore"):  # C's functions give inf and nan without a word
        out = fn(*(a.data for a in args))
    return interpreter.TensorHandle(np.asarray(out).astype(interpreter._get_np_dtype(scalar)), scalar)
