"""The interpreter's reduction by slices (verifier/interpreter.py) computes what the interpreter's
own element-by-element reduction computes, bit for bit: the same left fold per output element,
over combine functions of the kind candidates use (Inductor's NaN-propagating max and min, its
Welford steps, an argmax over (value, index) pairs, a float sum whose rounding depends on order),
over odd shapes, every axis, kept dims, NaNs and ties."""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter's reduction: CPU only", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch._inductor.runtime import triton_helpers  # noqa: E402
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
