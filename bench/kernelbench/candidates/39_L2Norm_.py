"""KernelBench level 1, 39_L2Norm_: y = x / ||x||_2 along dim 1, x of shape (B, D).

Viewed as (outer, R, inner) around dim 1, so trailing dims (inner > 1) work as well as the 2-D
default (inner = 1, rows of 65535). Each program owns BLOCK_I inner positions of one outer index
and walks the R axis twice in BLOCK_R x BLOCK_I tiles: once for the sum of squares, once to
write (the row, 256 KB by default, is mostly still in cache).

Numerics: squares summed in float32 in a tile-shaped accumulator (BLOCK_R partial sums per
output, folded at the end); the output divides by the norm, as the reference does.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

TILE = 4096  # elements per tile: BLOCK_R * BLOCK_I
MAX_BLOCK_I = 128


@triton.jit
def _l2_norm_kernel(x_ptr, y_ptr, R, inner, inner_blocks, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
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
        x = tl.load(x_ptr + base + r.to(tl.int64)[:, None] * inner + i[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        acc += x * x
    norm = tl.sqrt(tl.sum(acc, axis=0))
    for start in range(0, R, BLOCK_R):
        r = start + lanes
        mask = (r < R)[:, None] & i_mask[None, :]
        offs = base + r.to(tl.int64)[:, None] * inner + i[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, (x / norm[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def l2_normalize(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    R = x.shape[dim]
    outer = math.prod(x.shape[:dim])
    inner = math.prod(x.shape[dim + 1:])
    if x.numel():
        block_i = min(MAX_BLOCK_I, triton.next_power_of_2(inner))
        block_r = min(TILE // block_i, triton.next_power_of_2(R))
        inner_blocks = triton.cdiv(inner, block_i)
        _l2_norm_kernel[(outer * inner_blocks,)](x, y, R, inner, inner_blocks, BLOCK_R=block_r,
                                                 BLOCK_I=block_i, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_normalize(x, 1)
