"""Seed kernel for fp8_quant_per_group: one program per (token, group of 128 channels).

Clear, not fast: a program handles a single group (128 elements), so the grid is huge and each
program does little; no several groups or tokens per program.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
AMAX_FLOOR = tl.constexpr(1e-10)  # an all-zero group still gets a finite scale


@triton.jit
def _quant_per_group_kernel(
    x_ptr, q_ptr, scales_ptr, GROUP, stride_x, stride_q, stride_s, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    cols = group * GROUP + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < GROUP
    # Masked lanes load 0, which never raises a max of absolute values.
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    # div_rn is IEEE division, as torch's: scale and x / scale come out bit-identical to the
    # reference's, so the only rounding left is the one to fp8 (Triton's `/` is an approximate
    # division on NVIDIA GPUs, up to 2 float32 ulps off).
    scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), AMAX_FLOOR), FP8_MAX)
    tl.store(scales_ptr + row.to(tl.int64) * stride_s + group, scale)
    # x / scale may land a float32 step above 448 on the group's maximum: clamp first.
    q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -FP8_MAX), FP8_MAX)
    # float8e4nv is float8_e4m3fn (Hopper's e4m3); the conversion rounds to nearest even.
    tl.store(q_ptr + row.to(tl.int64) * stride_q + cols, q.to(tl.float8e4nv), mask=mask)


def fp8_quant_per_group(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens, hidden = x.shape
    if hidden % group_size:
        raise ValueError(f"hidden size {hidden} is not a multiple of the group size {group_size}")
    groups = hidden // group_size
    q = torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((tokens, groups), dtype=torch.float32, device=x.device)
    if tokens == 0 or groups == 0:
        return q, scales
    _quant_per_group_kernel[(tokens, groups)](
        x, q, scales, group_size, x.stride(0), q.stride(0), scales.stride(0),
        BLOCK=triton.next_power_of_2(group_size), num_warps=1,
    )
    return q, scales


class ModelNew(nn.Module):
    def __init__(self, group_size: int):
        super().__init__()
        self.group_size = group_size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fp8_quant_per_group(x, self.group_size)
