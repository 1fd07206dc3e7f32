# -*- mode: python; coding: utf-8-unix -*-
"""RMSNorm kernel (ASCII only)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

EPS: float = 1e-6

@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, H, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * stride_y + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    """rms norm"""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(x2)
        _rms_kernel[(x2.shape[0],)](x2, weight, y, x2.shape[1], x2.stride(0), y.stride(0), EPS,
                                    BLOCK=triton.next_power_of_2(x2.shape[1]))
        return y.view(x.shape)
# task: rms_norm
