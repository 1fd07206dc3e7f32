"""KernelBench level 1, 26_GELU_: exact GELU, y = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))).

Memory-bound. torch's default GELU is the erf form (approximate="none"), so this uses tl.erf in
float32, not the tanh approximation (which differs by up to ~3e-4, beyond float32 tolerance).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 2048
INV_SQRT2 = tl.constexpr(0.7071067811865476)


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # int64 offsets: the default shape holds 1.6e9 elements, near int32's limit.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.erf(x * INV_SQRT2))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _gelu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x)
