"""A small RMSNorm task for the verifier's tests: quick under the Triton interpreter."""

import torch
import torch.nn as nn

T = 4
H = 64
EPS = 1e-6


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS) * weight.float()
        return y.to(x.dtype)


def get_inputs():
    return [torch.randn(T, H), 1.0 + 0.1 * torch.randn(H)]


def get_init_inputs():
    return []
