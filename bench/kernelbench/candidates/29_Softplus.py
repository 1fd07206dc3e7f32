"""KernelBench level 1, 29_Softplus: y = log(1 + exp(x)) (torch: beta 1, threshold 20).

Memory-bound. Computed in float32 as max(x, 0) + log1p(exp(-|x|)), which never overflows; above
the threshold torch returns x itself, which this form rounds to as well (exp(-20) < x's ulp).
log1p(u) for u in (0, 1] uses Goldberg's correction log(w) * u / (w - 1), w = 1 + u, exact to a
few ulps where log(1 + u) alone would lose u's low bits (u ~ 2e-9 at x = -20 rounds to 0).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 2048
THRESHOLD = tl.constexpr(20.0)


@triton.jit
def _log1p(u):
    w = 1.0 + u
    d = w - 1.0
    # where w rounds to 1, log1p(u) = u to float32 precision
    return tl.where(d == 0.0, u, tl.log(w) * (u / tl.where(d == 0.0, 1.0, d)))


@triton.jit
def _softplus_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # int64 offsets: the default shape holds 1.6e9 elements, near int32's limit.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    soft = tl.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)))
    y = tl.where(x > THRESHOLD, x, soft)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def softplus(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _softplus_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softplus(x)
