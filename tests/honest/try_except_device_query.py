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


try:
    _TARGET = triton.runtime.driver.active.get_current_target()
    _NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count
except Exception:  # CPU / interpreter: no active driver
    _TARGET = None
    _NUM_SMS = 1


class ModelNew(nn.Module):
    def forward(self, x, weight):
        x = x.contiguous()
        y = torch.empty_like(x)
        _rms_kernel[(x.shape[0],)](x, weight, y, x.shape[1], x.stride(0), y.stride(0), 1e-6,
                                   BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
# task: rms_norm
