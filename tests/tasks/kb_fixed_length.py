"""A KernelBench-style problem whose forward branches on a size, written for kernforge's tests:
Dynamo fixes that size although every size is marked dynamic (as it fixed 41_Max_Pooling_1D's
length inside ``F.max_pool1d`` with a dilation, before the capture traced it as the 2-d pooling)."""

import torch
import torch.nn as nn

batch_size = 2
features = 3
sequence_length = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == 64:
            return torch.relu(x)
        return torch.relu(x) + 1.0


def get_inputs():
    return [torch.randn(batch_size, features, sequence_length)]


def get_init_inputs():
    return []
