"""Softmax over a large vocabulary: logits [B, V] -> probabilities [B, V] in float32.

What a sampler does to every sequence's next-token logits each decode step (and to every
prompt token when prompt log-probs are asked for). Probabilities are float32 whatever the
logits' dtype, as samplers keep them. Computes in float32.
"""

import torch
import torch.nn as nn

B = 8  # rows (sequences being sampled)
V = 128256  # vocabulary size


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float(), dim=-1)


def get_inputs():
    logits = 3.0 * torch.randn(B, V)
    return [logits]


def get_init_inputs():
    return []
