"""Small-M GEMM: y = x @ w.T with x [M, K] (the tokens in flight) and w [N, K] (a linear layer).

Every linear layer of a decoding model runs this: M is the number of tokens being decoded
(1-64), N and K are the projection's output and input sizes. At such M the weight dominates:
the op is bound by reading w once. Weights are inputs. The reference is what a serving stack
runs, ``F.linear`` in the inputs' dtype (cuBLAS, float32 accumulation), so the eager and
torch.compile baselines are the GEMM people ship; the judge's high-precision answer runs it on
float32 inputs with TF32 off.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

M = 16  # tokens
N = 4096  # output features (rows of w)
K = 4096  # input features (the reduction)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)


def get_inputs():
    x = torch.randn(M, K)
    w = torch.randn(N, K) / K**0.5
    return [x, w]


def get_init_inputs():
    return []
