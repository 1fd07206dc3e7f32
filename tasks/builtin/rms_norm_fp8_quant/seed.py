"""Seed kernel for rms_norm_fp8_quant: one program per token, three passes over its row.

Clear, not fast: pass 1 sums squares, pass 2 finds max |y| of the normalised row, pass 3
recomputes y and rounds it to fp8; the row is re-read from L2 each time instead of being kept
in registers, and a program handles a single row.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

EPS = 1e-6
FP8_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))  # an all-zero row still gets a finite scale


@triton.jit
def _rms_norm_fp8_kernel(
    x_ptr, w_ptr, q_ptr, scale_ptr, H, stride_x, stride_q, eps, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    q_row = q_ptr + row.to(tl.int64) * stride_q
    # Pass 1: mean of squares, accumulated in float32 whatever the storage dtype: a bf16 running
    # sum of 8192 squares keeps about 3 significant digits. Masked lanes add 0.
    sum_sq = tl.zeros((BLOCK,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)
        sum_sq += x * x
    inv_rms = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / H + eps)
    # Pass 2: max |y| with y = x * inv_rms * w kept in float32 (the fused op never rounds y).
    # Masked lanes give y = 0, which never raises a max of absolute values.
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x * inv_rms * w))
    # div_rn is IEEE division, as torch's (Triton's `/` is approximate on NVIDIA GPUs). y itself
    # differs from the reference's by a few float32 ulps (summation order, square root), which
    # moves q by at most one fp8 step, and only for values right at a rounding boundary.
    scale = tl.maximum(tl.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
    tl.store(scale_ptr + row, scale)
    # Pass 3: the same y, divided in float32, so the only real rounding is the one to fp8.
    for h0 in range(0, H, BLOCK):
        cols = h0 + tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        # y / scale may land a float32 step above 448 on the row's maximum: clamp first.
        q = tl.minimum(tl.maximum(tl.div_rn(x * inv_rms * w, scale), -FP8_MAX), FP8_MAX)
        # float8e4nv is float8_e4m3fn (Hopper's e4m3); the conversion rounds to nearest even.
        tl.store(q_row + cols, q.to(tl.float8e4nv), mask=mask)


def rms_norm_fp8_quant(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    if x.stride(-1) != 1:
        x = x.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    tokens, hidden = x.shape
    q = torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((tokens, 1), dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(hidden), 1024)
    _rms_norm_fp8_kernel[(tokens,)](
        x, weight, q, scale, hidden, x.stride(0), q.stride(0), eps, BLOCK=block, num_warps=4,
    )
    return q, scale


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rms_norm_fp8_quant(x, weight)
