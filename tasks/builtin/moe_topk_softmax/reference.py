"""MoE routing: softmax over the experts, top-k, renormalise (vLLM's topk_softmax + renormalize).

gating_output [T, E] float32 router logits -> (topk_weights [T, K] float32, topk_ids [T, K]
int32): the K most probable experts of each token, sorted by weight descending, with their
softmax probabilities renormalised to sum to 1 over the K. Runs once per MoE layer per step
(Mixtral, Qwen-MoE, DeepSeek-style shapes). Computes in float32.
"""

import torch
import torch.nn as nn

T = 16  # tokens
E = 64  # experts
K = 8  # experts chosen per token


class Model(nn.Module):
    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, gating_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(gating_output.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1, largest=True, sorted=True)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids.to(torch.int32)


def get_inputs():
    # Distinct logits per row (a shuffled ramp), so the top-k is unambiguous.
    levels = torch.linspace(-4.0, 4.0, E)
    order = torch.rand(T, E).argsort(dim=-1)
    gating_output = levels[order]
    return [gating_output]


def get_init_inputs():
    return [K]
