"""Seed kernel for paged_decode_attention: one program per (sequence, query head), walking the
sequence's context BLOCK_N tokens at a time with an online (running-max) softmax.

Clear, not fast: the keys and values of a KV head are re-read by each of its NQ/NKV query heads
(from L2 at best), a long sequence is walked by one program alone (no split over the context),
each token's block is looked up separately, and the dot products are broadcast-multiply-and-sum
rather than tensor-core tl.dot.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
    scale, GROUP, D, BLOCK_SIZE,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ob, stride_oh,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    head = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = head // GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    length = tl.load(seq_lens_ptr + seq)

    # Scores, softmax and the weighted sum are float32 throughout: a bf16 score of ~100 is off by
    # up to 0.25, which changes exp() by 28%. Folding 1/sqrt(D) into q costs one rounding.
    q = tl.load(q_ptr + seq * stride_qb + head * stride_qh + offs_d, mask=d_mask, other=0.0)
    q = q.to(tl.float32) * scale
    m_i = tl.full((), float("-inf"), tl.float32)  # running max of the scores
    l_i = tl.zeros((), dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)  # running sum of exp(score - m_i) * v

    for start in range(0, length, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        # Positions past the sequence's end are neither loaded nor counted: the block-table
        # entries beyond its last block belong to other sequences.
        valid = pos < length
        # Token pos lives in slot pos % BLOCK_SIZE of block block_tables[seq, pos // BLOCK_SIZE];
        # int64 because block * stride_kb exceeds 2^31 elements in a large pool.
        block = tl.load(block_tables_ptr + seq * stride_bt + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        tile_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + (block * stride_kb + slot * stride_ks + kv_head * stride_kh)[:, None] + offs_d[None, :],
                    mask=tile_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (block * stride_vb + slot * stride_vs + kv_head * stride_vh)[:, None] + offs_d[None, :],
                    mask=tile_mask, other=0.0).to(tl.float32)
        scores = tl.where(valid, tl.sum(q[None, :] * k, axis=1), float("-inf"))
        # Online softmax: rescale what was summed so far to the new maximum. Every tile holds at
        # least one valid token, so m_new is finite and exp(-inf - m_new) = 0 on the first tile.
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    out = acc / l_i
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    batch, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        key_cache, value_cache = key_cache.contiguous(), value_cache.contiguous()
    block_tables = block_tables.contiguous()
    seq_lens = seq_lens.contiguous()
    out = torch.empty((batch, num_q_heads, head_dim), dtype=query.dtype, device=query.device)
    grid = (num_q_heads, batch)
    _paged_decode_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, out,
        head_dim**-0.5, num_q_heads // num_kv_heads, head_dim, block_size,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=64, BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4,
    )
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, query, key_cache, value_cache, block_tables, seq_lens) -> torch.Tensor:
        return paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens)
