"""Fused mixture-of-experts MLP over a given routing (SwiGLU experts, top-k weighted sum).

    hidden        [T, H]
    w1            [E, 2*I, H]   rows 0..I-1: expert e's gate projection, rows I..2I-1: its up projection
    w2            [E, H, I]     expert e's down projection
    topk_weights  [T, TOPK] float32   routing weights of each token's chosen experts
    topk_ids      [T, TOPK] int32     the chosen experts, distinct within a row

    out[t] = sum_k topk_weights[t, k] * down_e( silu(gate_e(h[t])) * up_e(h[t]) ),  e = topk_ids[t, k]

with gate_e(h) = h @ w1[e, :I].T, up_e(h) = h @ w1[e, I:].T, down_e(a) = a @ w2[e].T. Only the
chosen experts' weights are needed. Weights are inputs (vLLM's w13/w2 layout). The reference
computes in float32 (matmuls with TF32 off) and returns the hidden states' dtype.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

T = 16  # tokens
H = 1024  # hidden size
I = 512  # each expert's intermediate size
E = 8  # experts
TOPK = 2  # experts per token


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        hidden: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        tokens, top_k = topk_ids.shape
        inter = w2.shape[-1]
        x = hidden.float()
        out = torch.zeros((tokens, hidden.shape[1]), dtype=torch.float32, device=hidden.device)
        flat_ids = topk_ids.reshape(-1).long()
        flat_weights = topk_weights.reshape(-1).float()
        flat_tokens = torch.arange(tokens, device=hidden.device).repeat_interleave(top_k)
        for e in flat_ids.unique().tolist():
            chosen = (flat_ids == e).nonzero().squeeze(1)
            rows = flat_tokens[chosen]
            w1e = w1[e].float()
            gate = x[rows] @ w1e[:inter].T
            up = x[rows] @ w1e[inter:].T
            y = (F.silu(gate) * up) @ w2[e].float().T
            out.index_add_(0, rows, y * flat_weights[chosen, None])
        return out.to(hidden.dtype)


def get_inputs():
    hidden = torch.randn(T, H)
    w1 = torch.randn(E, 2 * I, H) / H**0.5
    w2 = torch.randn(E, H, I) / I**0.5
    topk_ids = torch.rand(T, E).argsort(dim=-1)[:, :TOPK].to(torch.int32)
    topk_weights = torch.randn(T, TOPK).softmax(dim=-1)
    return [hidden, w1, w2, topk_weights, topk_ids]


def get_init_inputs():
    return []
