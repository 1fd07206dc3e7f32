"""A KernelBench-form ReLU large enough that a hidden shape's output has >= 1M elements."""
import torch
import torch.nn as nn

batch_size = 64
dim = 32768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
