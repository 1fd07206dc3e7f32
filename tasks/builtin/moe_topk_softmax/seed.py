"""Seed kernel for moe_topk_softmax: one program per token, all experts in one block.

Softmax over the row, then k rounds of "take the largest, knock it out", then renormalise.
Clear, not fast: one token per program and k full passes over the row.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _topk_softmax_kernel(
    g_ptr, w_ptr, id_ptr, E, K, stride_g, stride_w, stride_id,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    mask = cols < E
    # Float32 throughout: the probabilities are compared to pick experts, and renormalising
    # over k of them must not add more error than the float32 tolerance allows.
    x = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=-float("inf")).to(tl.float32)
    # Subtract the row maximum: logits near 1000 would overflow exp(). Masked lanes give 0.
    e = tl.exp(x - tl.max(x, axis=0))
    p = e / tl.sum(e, axis=0)

    # Probabilities are >= 0, so -1 marks lanes that are padding or already chosen.
    remaining = tl.where(mask, p, -1.0)
    ks = tl.arange(0, BLOCK_K)
    top_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in range(K):
        best = tl.max(remaining, axis=0)
        # On an exact tie take the lowest expert index, so the choice is deterministic.
        idx = tl.min(tl.where(remaining == best, cols, BLOCK_E), axis=0)
        top_w = tl.where(ks == j, best, top_w)
        top_i = tl.where(ks == j, idx, top_i)
        remaining = tl.where(cols == idx, -1.0, remaining)
    # Lanes past K hold 0 and add nothing to the sum.
    top_w = top_w / tl.sum(top_w, axis=0)
    out_mask = ks < K
    tl.store(w_ptr + row * stride_w + ks, top_w, mask=out_mask)
    tl.store(id_ptr + row * stride_id + ks, top_i, mask=out_mask)


def topk_softmax(gating_output: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gating_output
    if g.stride(-1) != 1:
        g = g.contiguous()
    tokens, experts = g.shape
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=g.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=g.device)
    _topk_softmax_kernel[(tokens,)](
        g, weights, ids, experts, top_k, g.stride(0), weights.stride(0), ids.stride(0),
        BLOCK_E=triton.next_power_of_2(experts), BLOCK_K=triton.next_power_of_2(top_k), num_warps=1,
    )
    return weights, ids


class ModelNew(nn.Module):
    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, gating_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return topk_softmax(gating_output, self.top_k)
