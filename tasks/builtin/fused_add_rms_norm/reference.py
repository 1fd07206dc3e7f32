"""Fused residual add + RMSNorm, in place (vLLM's fused_add_rms_norm).

    residual <- x + residual                          (stored in the residual's dtype)
    x        <- residual / sqrt(mean(residual^2) + eps) * weight

Both tensors are written in place and forward returns None. The norm is taken of the rounded,
stored residual (what vLLM's CUDA kernel normalises), so the next layer's residual stream and
this layer's normalised input agree bit for bit. Runs before every attention and MLP block
after the first in Llama-style models. Weights are inputs. Computes in float32.
"""

import torch
import torch.nn as nn

T = 16  # tokens
H = 4096  # hidden size
EPS = 1e-6


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
        total = x.float() + residual.float()
        residual.copy_(total.to(residual.dtype))
        # Normalise the residual as stored (rounded to its dtype), not the float32 sum.
        z = residual.float()
        variance = z.pow(2).mean(dim=-1, keepdim=True)
        y = z * torch.rsqrt(variance + EPS) * weight.float()
        x.copy_(y.to(x.dtype))
        return None


def get_inputs():
    x = torch.randn(T, H)
    residual = torch.randn(T, H)
    weight = 1.0 + 0.1 * torch.randn(H)
    return [x, residual, weight]


def get_init_inputs():
    return []
