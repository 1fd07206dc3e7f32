"""Seed kernel for rotary_embedding (NeoX style): one program per token, all heads in one tile.

Clear, not fast: query and key are rotated by two launches of the same kernel, each program
loads its token's cos/sin row once and rotates a [heads, D/2] tile of first and second halves.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rope_neox_kernel(
    pos_ptr, x_ptr, out_ptr, cache_ptr,
    NUM_HEADS, HALF, stride_x, stride_out, stride_cache,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    # int64 offsets: T * heads * D and MAX_POS * D can pass 2^31 elements.
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    j_mask = j < HALF
    # The cache row: cos in the first HALF columns, sin in the last HALF.
    cos = tl.load(cache_ptr + pos * stride_cache + j, mask=j_mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + j, mask=j_mask, other=0.0).to(tl.float32)

    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < NUM_HEADS) & j_mask[None, :]
    # Heads of 2*HALF contiguous elements; the first half of each head, then the second.
    in_offs = tok * stride_x + h[:, None] * (2 * HALF) + j[None, :]
    out_offs = tok * stride_out + h[:, None] * (2 * HALF) + j[None, :]
    x1 = tl.load(x_ptr + in_offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + in_offs + HALF, mask=mask, other=0.0).to(tl.float32)
    # In float32: with large inputs x1*cos - x2*sin is a small difference of large products,
    # and rounding the products to bf16 first would leave only noise.
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(out_ptr + out_offs, out1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + out_offs + HALF, out2.to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    head_dim = cos_sin_cache.shape[-1]
    half = head_dim // 2
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens = x.shape[0]
    num_heads = x.shape[-1] // head_dim
    out = torch.empty((tokens, x.shape[-1]), dtype=x.dtype, device=x.device)
    _rope_neox_kernel[(tokens,)](
        positions, x, out, cos_sin_cache,
        num_heads, half, x.stride(0), out.stride(0), cos_sin_cache.stride(0),
        BLOCK_H=triton.next_power_of_2(num_heads), BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4,
    )
    return out


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if cos_sin_cache.stride(-1) != 1:
        cos_sin_cache = cos_sin_cache.contiguous()
    return _rotate(positions, query, cos_sin_cache), _rotate(positions, key, cos_sin_cache)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_embedding(positions, query, key, cos_sin_cache)
