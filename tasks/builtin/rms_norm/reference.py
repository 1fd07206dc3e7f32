"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, over the last dimension.

Runs before every attention and MLP block of Llama-style models. Weights are inputs.
The reference computes in float32 and returns the input's dtype.
"""

import torch
import torch.nn as nn

T = 16  # tokens
H = 4096  # hidden size
EPS = 1e-6


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        variance = xf.pow(2).mean(dim=-1, keepdim=True)
        y = xf * torch.rsqrt(variance + EPS) * weight.float()
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(T, H)
    weight = 1.0 + 0.1 * torch.randn(H)
    return [x, weight]


def get_init_inputs():
    return []
