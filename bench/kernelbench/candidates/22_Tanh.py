"""KernelBench level 1, 22_Tanh: y = tanh(x), elementwise.

Memory-bound. Triton has no tanh outside libdevice (which the interpreter cannot run), so it is
built from exp in float32: tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1], which
never overflows. Below |x| = 1/16 the difference 1 - e cancels, so there the odd Taylor series
x - x^3/3 + 2x^5/15 is used (truncation error < 17|x|^7/315, about 5e-9 relative at the switch).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _tanh(x):
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    a2 = a * a
    near = a * (1.0 + a2 * (-0.3333333333333333 + a2 * 0.13333333333333333))
    t = tl.where(a < 0.0625, near, far)
    return tl.where(x < 0, -t, t)


@triton.jit
def _tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # int64 offsets: the default shape holds 1.6e9 elements, near int32's limit.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, _tanh(x).to(y_ptr.dtype.element_ty), mask=mask)


def tanh(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _tanh_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh(x)
