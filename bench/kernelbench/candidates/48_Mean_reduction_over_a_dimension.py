"""KernelBench level 1, 48_Mean_reduction_over_a_dimension: y = x.mean(dim) (dim removed).

The input is viewed as (outer, R, inner) around ``dim`` (any dim, any rank, any size). Each
program owns BLOCK_I neighbouring positions of the inner axis for one outer index and walks R in
tiles of BLOCK_R x BLOCK_I, so loads are contiguous along inner (coalesced for dim=1,
inner=4095) and still correct when inner = 1 (BLOCK_I = 1, BLOCK_R = 4096).

Numerics: a float32 tile-shaped accumulator (BLOCK_R partial sums per output) folded once at the
end, then one division by R, as torch.mean divides the sum.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

TILE = 4096  # elements per tile: BLOCK_R * BLOCK_I
MAX_BLOCK_I = 128


@triton.jit
def _mean_kernel(x_ptr, y_ptr, R, inner, inner_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(0)
    outer = (pid // inner_blocks).to(tl.int64)
    i = (pid % inner_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < inner
    base = outer * R * inner
    lanes = tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_I], tl.float32)
    for start in range(0, R, BLOCK_R):
        r = start + lanes
        mask = (r < R)[:, None] & i_mask[None, :]
        offs = base + r.to(tl.int64)[:, None] * inner + i[None, :]
        acc += tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / R
    tl.store(y_ptr + outer * inner + i, mean.to(y_ptr.dtype.element_ty), mask=i_mask)


def mean_dim(x: torch.Tensor, dim: int) -> torch.Tensor:
    x = x.contiguous()
    dim = dim % x.dim()
    R = x.shape[dim]
    outer = math.prod(x.shape[:dim])
    inner = math.prod(x.shape[dim + 1:])
    y = torch.empty(*x.shape[:dim], *x.shape[dim + 1:], device=x.device, dtype=x.dtype)
    if outer * inner:
        block_i = min(MAX_BLOCK_I, triton.next_power_of_2(inner))
        block_r = min(TILE // block_i, triton.next_power_of_2(max(R, 1)))
        inner_blocks = triton.cdiv(inner, block_i)
        _mean_kernel[(outer * inner_blocks,)](x, y, R, inner, inner_blocks, BLOCK_R=block_r, BLOCK_I=block_i,
                                              num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mean_dim(x, self.dim)
