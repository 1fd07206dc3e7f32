"""The interpreter made usable for CPU verdicts (verifier/interpreter.py).

Its reduction by slices computes what the interpreter's own element-by-element reduction
computes, bit for bit: the same left fold per output element, over combine functions of the kind
candidates use (Inductor's NaN-propagating max and min, its Welford steps, an argmax over (value,
index) pairs, a float sum whose rounding depends on order), over odd shapes, every axis, kept
dims, NaNs and ties. libdevice's functions, which the interpreter cannot call, compute what
torch computes."""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter's reduction: CPU only", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch._inductor.runtime import triton_helpers  # noqa: E402
from torch._inductor.runtime.triton_helpers import libdevice  # noqa: E402
from triton.language.extra.cuda import libdevice as cuda_libdevice  # noqa: E402
from triton.runtime import interpreter as triton_interpreter  # noqa: E402

from kernforge.verifier import interpreter  # noqa: E402

#: the interpreter's own reduction (a sandbox worker replaces it in its warm-up; pytest never does)
_ORIGINAL = triton_interpreter.ReduceOps.__dict__["generic_reduce"]


@triton.jit
def _ordered_add(a, b):
    return a + b  # float addition: a different order gives other bits


@triton.jit
def _argmax_pair(v1, i1, v2, i2):
    take = (v1 > v2) | ((v1 == v2) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)


@triton.jit
def _reduce_rows(x_ptr, out_ptr, idx_ptr, M: tl.constexpr, N: tl.constexpr, HOW: tl.constexpr):
    rows = tl.arange(0, M)[:, None]
    cols = tl.arange(0, N)[None, :]
    x = tl.load(x_ptr + rows * N + cols)
    if HOW == 0:
        tl.store(out_ptr + tl.arange(0, M), triton_helpers.max2(x, 1))
    elif HOW == 1:
        tl.store(out_ptr + tl.arange(0, N), triton_helpers.min2(x, 0))
    elif HOW == 2:
        tl.store(out_ptr + tl.arange(0, M), tl.reduce(x, 1, _ordered_add))
    elif HOW == 3:
        i = tl.broadcast_to(cols, [M, N])
        v, j = tl.reduce((x, i), 1, _argmax_pair)
        tl.store(out_ptr + tl.arange(0, M), v)
        tl.store(idx_ptr + tl.arange(0, M), j)
    elif HOW == 4:
        mean, m2, weight = triton_helpers.welford(x, tl.zeros([M, N], tl.float32), tl.full([M, N], 1.0, tl.float32), 1)
        tl.store(out_ptr + tl.arange(0, M), mean)
        tl.store(idx_ptr + tl.arange(0, M), m2.to(tl.int32))
    elif HOW == 5:
        kept = tl.reduce(x, 1, _ordered_add, keep_dims=True)  # (M, 1)
        tl.store(out_ptr + rows, kept)
    elif HOW == 6:
        tl.store(out_ptr, tl.reduce(x, None, _ordered_add))  # every element, to a scalar


def _run(how: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = x.shape
    out = torch.full((max(m, n),), -7.0)
    idx = torch.full((max(m, n),), -7, dtype=torch.int32)
    _reduce_rows[(1,)](x, out, idx, M=m, N=n, HOW=how)
    return out, idx


def _inputs(m: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * torch.exp(4 * torch.randn(m, n, generator=g))  # wide range: order matters
    x[0, n // 2] = float("nan")
    if m > 2:
        x[2] = x[2, 0]  # a row of ties
    return x


@pytest.mark.parametrize("how", range(7))
@pytest.mark.parametrize("m, n", [(4, 8), (8, 32), (2, 64)])
def test_the_reduction_by_slices_gives_the_interpreters_own_bits(how, m, n, monkeypatch):
    x = _inputs(m, n, seed=how * 100 + m)
    monkeypatch.setattr(triton_interpreter.ReduceOps, "generic_reduce", _ORIGINAL)
    want = _run(how, x)
    monkeypatch.setattr(triton_interpreter.ReduceOps, "generic_reduce", interpreter.folded)
    got = _run(how, x)
    for w, g in zip(want, got):
        assert torch.equal(w.view(torch.int32), g.view(torch.int32)), f"HOW={how}: {w} != {g}"


@triton.jit
def _libdevice_calls(x_ptr, y_ptr, out_ptr, flags_ptr, n, B: tl.constexpr):
    i = tl.arange(0, B)
    m = i < n
    x = tl.load(x_ptr + i, m)
    y = tl.load(y_ptr + i, m)
    tl.store(out_ptr + 0 * n + i, libdevice.tanh(x), m)  # the stub module Inductor's kernels name
    tl.store(out_ptr + 1 * n + i, libdevice.expm1(x), m)
    tl.store(out_ptr + 2 * n + i, libdevice.log1p(tl.abs(x)), m)
    tl.store(out_ptr + 3 * n + i, cuda_libdevice.erf(x), m)  # CUDA's module, as a candidate may name it
    tl.store(out_ptr + 4 * n + i, libdevice.pow(tl.abs(x), y), m)
    tl.store(out_ptr + 5 * n + i, libdevice.atan2(x, y), m)
    tl.store(out_ptr + 6 * n + i, libdevice.rsqrt(tl.abs(x)), m)
    tl.store(flags_ptr + i, libdevice.isinf(x / y).to(tl.int32), m)


def test_libdevice_functions_compute_what_torch_computes_under_the_interpreter(monkeypatch):
    """Inductor's kernels call libdevice (22_Tanh, 27_SELU_, 29_Softplus, 31_ELU, 88_MinGPTNewGelu):
    on the interpreter each call returned None and the start was rejected as a runtime error."""
    interpreter._libdevice(monkeypatch.setattr)
    g = torch.Generator().manual_seed(0)
    n = 37
    x, y = torch.randn(n, generator=g) * 3, torch.randn(n, generator=g)
    x[0], y[1] = 0.0, 0.0  # x / y: a nan, then an inf
    out, flags = torch.full((7, n), -7.0), torch.full((n,), -7, dtype=torch.int32)
    _libdevice_calls[(1,)](x, y, out, flags, n, B=64)
    want = [torch.tanh(x), torch.expm1(x), torch.log1p(x.abs()), torch.erf(x), x.abs().pow(y), torch.atan2(x, y),
            torch.rsqrt(x.abs())]
    for k, w in enumerate(want):
        torch.testing.assert_close(out[k], w, rtol=2e-6, atol=1e-6, equal_nan=True, msg=f"function {k}")
    assert torch.equal(flags, torch.isinf(x / y).to(torch.int32))


def test_a_libdevice_function_numpy_lacks_is_refused_by_name(monkeypatch):
    interpreter._libdevice(monkeypatch.setattr)

    @triton.jit
    def _rounded(x_ptr, out_ptr):
        tl.store(out_ptr, cuda_libdevice.round(tl.load(x_ptr)))

    with pytest.raises(Exception, match="__nv_roundf has no implementation in the Triton interpreter"):
        _rounded[(1,)](torch.ones(1), torch.empty(1))


def test_every_function_numpy_stands_in_for_is_one_of_libdevices():
    import inspect
    import re

    symbols = set(re.findall(r'"__nv_(\w+)"', inspect.getsource(cuda_libdevice)))
    assert [name for name in interpreter.NUMPY if name not in symbols and f"{name}f" not in symbols] == []
