"""The Triton interpreter made usable for CPU verdicts (``TRITON_INTERPRET=1``; trusted start-up).

The harness calls ``install`` in its warm-up, before any candidate code. Nothing here changes what
a kernel computes; each change only removes work the interpreter does one element or one config
at a time from Python.
"""

from __future__ import annotations

from typing import Any


def install() -> None:
    _alike_autotune()
    _sliced_reduce()


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
