"""A matrix-vector product with a long reduction (KernelBench level 1, problem 4, shrunk in M):
the task where a float32 sum of a million terms drifts by more than float32's tolerance."""

import torch
import torch.nn as nn

M = 16
K = 1 << 20


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
