"""SiLU-and-multiply, the gated activation of SwiGLU MLPs (vLLM's silu_and_mul).

x is [T, 2*I], the gate projection's output in the first I columns and the up projection's
in the last I: out = silu(x[:, :I]) * x[:, I:], [T, I], with silu(g) = g / (1 + exp(-g)).
Runs between the two matmuls of every MLP block of Llama-style models. Computes in float32.
"""

import torch
import torch.nn as nn

T = 16  # tokens
I = 14336  # intermediate size; x has 2*I columns


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        d = x.shape[-1] // 2
        gate, up = xf[:, :d], xf[:, d:]
        y = gate * torch.sigmoid(gate) * up
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(T, 2 * I)
    return [x]


def get_init_inputs():
    return []
