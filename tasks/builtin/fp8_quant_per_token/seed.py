"""Seed kernel for fp8_quant_per_token: one program per token, two passes over its row.

Clear, not fast: the first pass finds max |x|, the second re-reads the row (from L2) to scale
and round it; no row kept in registers, no several rows per program.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))  # an all-zero row still gets a finite scale


@triton.jit
def _quant_per_token_kernel(x_ptr, q_ptr, scale_ptr, H, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    q_row = q_ptr + row.to(tl.int64) * stride_q
    # Pass 1: max |x|. Masked lanes load 0, which never raises a max of absolute values.
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    # div_rn is IEEE division, as torch's: scale and x / scale come out bit-identical to the
    # reference's, so the only rounding left is the one to fp8 (Triton's `/` is an approximate
    # division on NVIDIA GPUs, up to 2 float32 ulps off).
    scale = tl.maximum(tl.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
    tl.store(scale_ptr + row, scale)
    # Pass 2: scale, clamp and round.
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        # x / scale may land a float32 step above 448 on the row's maximum: clamp first.
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        # float8e4nv is float8_e4m3fn (Hopper's e4m3); the conversion rounds to nearest even.
        tl.store(q_row + cols, q.to(tl.float8e4nv), mask=mask)


def fp8_quant_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens, hidden = x.shape
    q = torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((tokens, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(hidden), 1024)
    _quant_per_token_kernel[(tokens,)](x, q, scale, hidden, x.stride(0), q.stride(0), BLOCK=block, num_warps=4)
    return q, scale


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fp8_quant_per_token(x)
