"""KernelBench level 1, 27_SELU_: y = scale * (x if x > 0 else alpha * (exp(x) - 1)), elementwise.

Memory-bound. alpha and scale are torch's constants. exp(x) - 1 cancels for small |x|, so below
|x| = 1/2 expm1 is its Taylor series to x^8 (truncation error < |x|^9/9! ~ 6e-9 relative at the
switch); beyond it exp(x) - 1 loses at most one float32 ulp of 1 against a result >= 0.39.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 2048
ALPHA = tl.constexpr(1.6732632423543772848170429916717)
SCALE = tl.constexpr(1.0507009873554804934193349852946)


@triton.jit
def _expm1(x):
    # Horner form of x + x^2/2! + ... + x^8/8!
    p = 2.48015873015873e-05
    p = p * x + 1.984126984126984e-04
    p = p * x + 1.388888888888889e-03
    p = p * x + 8.333333333333333e-03
    p = p * x + 4.166666666666666e-02
    p = p * x + 1.666666666666667e-01
    p = p * x + 0.5
    p = p * x + 1.0
    near = p * x
    return tl.where(tl.abs(x) < 0.5, near, tl.exp(x) - 1.0)


@triton.jit
def _selu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # int64 offsets: the default shape holds 1.6e9 elements, near int32's limit.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # the negative branch is evaluated at min(x, 0) so that exp never overflows on positive lanes
    neg = ALPHA * _expm1(tl.minimum(x, 0.0))
    y = SCALE * tl.where(x > 0, x, neg)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def selu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _selu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return selu(x)
