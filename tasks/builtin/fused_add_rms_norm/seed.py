"""Seed kernel for fused_add_rms_norm: one program per row, the row in a single block.

Clear, not fast: no persistent grid, no vectorisation hints, one pass over the row. Writes x
and residual in place; each program reads its whole row before writing it, so no other
program's input is overwritten.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

EPS = 1e-6


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, H, stride_x, stride_r, eps, BLOCK: tl.constexpr):
    # int64 row offsets: T * H can pass 2^31 elements on large prefill batches.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # The sum is rounded to the residual's dtype once, stored, and that rounded value is what
    # gets normalised (vLLM's semantics): the stored residual and the norm's input agree.
    stored = (x + r).to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + row * stride_r + cols, stored, mask=mask)
    z = stored.to(tl.float32)
    # Accumulate the mean of squares in float32: in bf16 the sum of thousands of squares
    # stops growing once it is 2^8 times larger than one term. Masked lanes hold 0.
    mean_sq = tl.sum(z * z, axis=0) / H
    y = z * (1.0 / tl.sqrt(mean_sq + eps)) * w
    tl.store(x_ptr + row * stride_x + cols, y.to(x_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> None:
    hidden = x.shape[-1]
    # In place: the op must write through these exact tensors, so it cannot make contiguous
    # copies; it needs rows addressable by one stride each.
    if x.dim() != 2 or residual.shape != x.shape or x.stride(-1) != 1 or residual.stride(-1) != 1:
        raise ValueError("x and residual must be [T, H] with unit stride along H")
    rows = x.shape[0]
    block = triton.next_power_of_2(hidden)
    _fused_add_rms_norm_kernel[(rows,)](
        x, residual, weight, hidden, x.stride(0), residual.stride(0), eps, BLOCK=block, num_warps=8
    )


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
        fused_add_rms_norm(x, residual, weight)
        return None
