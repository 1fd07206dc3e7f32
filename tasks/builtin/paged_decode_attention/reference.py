"""Paged decode attention with grouped-query heads over a block table (vLLM's cache layout).

Each of B sequences decodes one new token: its query attends to all seq_lens[b] cached keys
and values, which live in fixed-size blocks (pages) scattered through a shared pool:

    query        [B, NQ, D]
    key_cache    [NUM_BLOCKS, BLOCK_SIZE, NKV, D]   (token slot within a block, then head)
    value_cache  [NUM_BLOCKS, BLOCK_SIZE, NKV, D]
    block_tables [B, MAX_BLOCKS] int32: block_tables[b, i] holds tokens i*BLOCK_SIZE ... of b
    seq_lens     [B] int32, 1 <= seq_lens[b] <= MAX_BLOCKS * BLOCK_SIZE, different per sequence
    out          [B, NQ, D]

Token j of sequence b is key_cache[block_tables[b, j // BLOCK_SIZE], j % BLOCK_SIZE]. Entries
of block_tables past a sequence's last block point at blocks that are not its own and must
not be read. Query head h uses key/value head h // (NQ // NKV). Scores are scaled by
1/sqrt(D); the softmax is in float32 with its maximum subtracted. The reference computes in
float32 and returns the query's dtype.
"""

import torch
import torch.nn as nn

B = 8  # sequences, one query token each
NQ = 32  # query heads
NKV = 8  # key/value heads; NQ is a multiple of NKV
D = 128  # head dimension
BLOCK_SIZE = 16  # tokens per cache block
MAX_LEN = 1024  # longest context in the batch


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        batch, num_q_heads, head_dim = query.shape
        block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
        group = num_q_heads // num_kv_heads
        scale = head_dim**-0.5
        out = torch.empty((batch, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
        for b, length in enumerate(seq_lens.tolist()):
            blocks = block_tables[b, : (length + block_size - 1) // block_size].long()
            k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float()
            v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float()
            q = query[b].float().reshape(num_kv_heads, group, head_dim)
            scores = torch.einsum("hgd,lhd->hgl", q, k) * scale
            scores = scores - scores.amax(dim=-1, keepdim=True)
            p = scores.exp()
            p = p / p.sum(dim=-1, keepdim=True)
            out[b] = torch.einsum("hgl,lhd->hgd", p, v).reshape(num_q_heads, head_dim)
        return out.to(query.dtype)


def get_inputs():
    max_blocks = (MAX_LEN + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = B * max_blocks
    query = torch.randn(B, NQ, D)
    key_cache = torch.randn(num_blocks, BLOCK_SIZE, NKV, D)
    value_cache = torch.randn(num_blocks, BLOCK_SIZE, NKV, D)
    # Every sequence's blocks are scattered through the pool.
    block_tables = torch.randperm(num_blocks).reshape(B, max_blocks).to(torch.int32)
    seq_lens = torch.randint(1, MAX_LEN + 1, (B,), dtype=torch.int32)
    seq_lens[0] = MAX_LEN
    return [query, key_cache, value_cache, block_tables, seq_lens]


def get_init_inputs():
    return []
