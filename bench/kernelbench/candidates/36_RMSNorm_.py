"""KernelBench level 1, 36_RMSNorm_: y = x / sqrt(mean(x^2, dim=1) + eps), x of shape (B, F, ...).

The statistic runs over dim 1 (the features), so the input is viewed as (B, F, inner) with inner
the product of the trailing dims (512 * 512 by default). Each program owns BLOCK_I neighbouring
inner positions of one batch row, so loads are contiguous along inner, and reads its F x BLOCK_I
slab twice: once for the sum of squares, once to write the output (the second read mostly hits
the cache). Works for any F, any trailing sizes (inner = 1 included).

Numerics: squares summed in float32 in a tile-shaped accumulator (BLOCK_R partial sums per
output, folded at the end); the output divides by the root, as the reference does, instead of
multiplying by a rounded reciprocal.
"""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

TILE = 4096  # elements per tile: BLOCK_R * BLOCK_I
MAX_BLOCK_I = 128


@triton.jit
def _rms_norm_kernel(x_ptr, y_ptr, R, inner, inner_blocks, eps, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
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
    rms = tl.sqrt(tl.sum(acc, axis=0) / R + eps)
    for start in range(0, R, BLOCK_R):
        r = start + lanes
        mask = (r < R)[:, None] & i_mask[None, :]
        offs = base + r.to(tl.int64)[:, None] * inner + i[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, (x / rms[None, :]).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    R = x.shape[1]
    outer = x.shape[0]
    inner = math.prod(x.shape[2:])
    if x.numel():
        block_i = min(MAX_BLOCK_I, triton.next_power_of_2(inner))
        block_r = min(TILE // block_i, triton.next_power_of_2(R))
        inner_blocks = triton.cdiv(inner, block_i)
        _rms_norm_kernel[(outer * inner_blocks,)](x, y, R, inner, inner_blocks, eps, BLOCK_R=block_r,
                                                  BLOCK_I=block_i, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps)
