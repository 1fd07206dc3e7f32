"""Small-M GEMM: y = x @ w.T with x [M, K] (the tokens in flight) and w [N, K] (a linear layer).

Every linear layer of a decoding model runs this: M is the number of tokens being decoded
(1-64), N and K are the projection's output and input sizes. At such M the weight dominates:
the op is bound by reading w once. Weights are inputs. The reference computes in float32
(TF32 off) and returns the input's dtype.
"""

import torch
import torch.nn as nn

M = 16  # tokens
N = 4096  # output features (rows of w)
K = 4096  # input features (the reduction)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.float() @ w.float().T
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(M, K)
    w = torch.randn(N, K) / K**0.5
    return [x, w]


def get_init_inputs():
    return []
