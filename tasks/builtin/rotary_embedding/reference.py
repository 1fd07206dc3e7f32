"""Rotary position embedding, NeoX style (vLLM's rotary_embedding with is_neox_style=True).

positions [T] int64; query [T, NQ*D] and key [T, NK*D], heads of D contiguous in each row;
cos_sin_cache [MAX_POS, D]: row p holds cos(p * f) in its first D/2 columns and sin(p * f) in
its last D/2 (the whole head is rotated: rot_dim = D). Each head's first half x1 and second
half x2 (not interleaved pairs: that is the GPT-J style) become

    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin

with cos, sin taken from the cache row of the token's position. Returns new tensors
(query_out, key_out) shaped like query and key. Runs on q and k in every attention layer.
Computes in float32.
"""

import torch
import torch.nn as nn

T = 16  # tokens
NQ = 32  # query heads
NK = 8  # key heads
D = 128  # head dim (rotary dim)
MAX_POS = 8192  # rows of the cos/sin cache


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = cos_sin_cache.shape[-1]
        half = head_dim // 2
        rows = cos_sin_cache.float()[positions]  # [T, D]
        cos = rows[:, None, :half]
        sin = rows[:, None, half:]

        def rotate(x: torch.Tensor) -> torch.Tensor:
            xf = x.float().view(x.shape[0], -1, head_dim)
            x1, x2 = xf[..., :half], xf[..., half:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            return out.view(x.shape).to(x.dtype)

        return rotate(query), rotate(key)


def get_inputs():
    positions = torch.randperm(MAX_POS)[:T]
    query = torch.randn(T, NQ * D)
    key = torch.randn(T, NK * D)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    angles = torch.arange(MAX_POS).float()[:, None] * inv_freq[None, :]
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return [positions, query, key, cos_sin_cache]


def get_init_inputs():
    return []
