"""KernelBench level 1, 20_LeakyReLU: y = x if x > 0 else negative_slope * x, elementwise.

Memory-bound: one read and one write per element. The slope is a Python float from
``get_init_inputs`` (0.01 by default) and reaches the kernel as a float32 scalar, as torch uses it.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _leaky_relu_kernel(x_ptr, y_ptr, n, negative_slope, BLOCK: tl.constexpr):
    # int64 offsets: the default shape holds 1.6e9 elements, near int32's limit.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # `x < 0` is false for NaN, which then passes through unchanged, as in torch.
    y = tl.where(x < 0, x * negative_slope, x)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def leaky_relu(x: torch.Tensor, negative_slope: float) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _leaky_relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, negative_slope, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_relu(x, self.negative_slope)
