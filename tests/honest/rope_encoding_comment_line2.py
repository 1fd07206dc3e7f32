"""Fused NeoX-style rotary embedding for query and key in one Triton kernel."""
# Rotary position encoding: NeoX layout, the two halves of each head are rotated together.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, cs_ptr, NQ, NK,
                 stride_qt, stride_kt, stride_cs,
                 HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    d = tl.arange(0, BLOCK_D)
    md = d < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=md, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=md, other=0.0).to(tl.float32)
    h = tl.arange(0, BLOCK_H)
    # query heads
    mq = (h < NQ)[:, None] & md[None, :]
    base = t * stride_qt + h[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(q_ptr + base, mask=mq, other=0.0).to(tl.float32)
    x2 = tl.load(q_ptr + base + HALF, mask=mq, other=0.0).to(tl.float32)
    tl.store(qo_ptr + base, (x1 * cos[None, :] - x2 * sin[None, :]).to(qo_ptr.dtype.element_ty), mask=mq)
    tl.store(qo_ptr + base + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(qo_ptr.dtype.element_ty), mask=mq)
    # key heads
    mk = (h < NK)[:, None] & md[None, :]
    base = t * stride_kt + h[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(k_ptr + base, mask=mk, other=0.0).to(tl.float32)
    x2 = tl.load(k_ptr + base + HALF, mask=mk, other=0.0).to(tl.float32)
    tl.store(ko_ptr + base, (x1 * cos[None, :] - x2 * sin[None, :]).to(ko_ptr.dtype.element_ty), mask=mk)
    tl.store(ko_ptr + base + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(ko_ptr.dtype.element_ty), mask=mk)


class ModelNew(nn.Module):
    def forward(self, positions, query, key, cos_sin_cache):
        query = query.contiguous()
        key = key.contiguous()
        cos_sin_cache = cos_sin_cache.contiguous()
        D = cos_sin_cache.shape[-1]
        T = query.shape[0]
        NQ = query.shape[1] // D
        NK = key.shape[1] // D
        q_out = torch.empty_like(query)
        k_out = torch.empty_like(key)
        _rope_kernel[(T,)](positions, query, key, q_out, k_out, cos_sin_cache, NQ, NK,
                           query.stride(0), key.stride(0), cos_sin_cache.stride(0),
                           HALF=D // 2, BLOCK_D=triton.next_power_of_2(D // 2), BLOCK_H=triton.next_power_of_2(max(NQ, NK)))
        return q_out, k_out
# task: rotary_embedding
