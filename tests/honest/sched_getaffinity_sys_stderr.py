import os
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, H, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * stride_y + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
if sys.version_info < (3, 9):
    sys.stderr.write("python too old\n")


class ModelNew(nn.Module):
    def forward(self, x, weight):
        x = x.contiguous()
        y = torch.empty_like(x)
        _rms_kernel[(x.shape[0],)](x, weight, y, x.shape[1], x.stride(0), y.stride(0), 1e-6,
                                   BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=4 if _CPUS else 4)
        return y
# task: rms_norm
