"""KernelBench level 1, 24_LogSoftmax: y = log_softmax(x, dim) = x - M - log(sum(exp(x - M))).

The input is viewed as (outer, R, inner) around ``dim`` (from ``get_init_inputs``, 1 by default),
so any rank and any size works; KernelBench's 2-D input gives inner = 1 and contiguous rows. One
program per row, two passes over it (rows of 393216 do not fit in registers):

1. an online pass keeps, per lane, the running maximum m and the running sum s of exp(x - m),
   rescaling s whenever m grows (float32); the lanes then merge into the row's maximum M and
   S = sum(s * exp(m - M));
2. a second pass writes x - M - log(S), computed from x directly (never log of a rounded exp,
   which would lose the tail's precision).
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _log_softmax_kernel(x_ptr, y_ptr, R, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = (row // inner) * R * inner + row % inner
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, R, BLOCK):
        r = start + lanes
        mask = r < R
        x = tl.load(x_ptr + base + r.to(tl.int64) * inner, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # a lane that has seen only -inf (a masked tail) shifts by 0: exp(-inf) = 0, never
        # exp(-inf - -inf) = NaN
        shift = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)
    shift = row_max + tl.log(row_sum)
    for start in range(0, R, BLOCK):
        r = start + lanes
        mask = r < R
        offs = base + r.to(tl.int64) * inner
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, (x - shift).to(y_ptr.dtype.element_ty), mask=mask)


def log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    dim = dim % x.dim()
    R = x.shape[dim]
    inner = math.prod(x.shape[dim + 1:])
    rows = x.numel() // R if R else 0
    if rows:
        _log_softmax_kernel[(rows,)](x, y, R, inner, BLOCK=min(BLOCK, triton.next_power_of_2(R)), num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, self.dim)
