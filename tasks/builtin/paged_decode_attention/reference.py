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
        # Every sequence at once, without a host sync (a loop over seq_lens would read each length
        # on the host): all MAX_BLOCKS blocks of a sequence are gathered and the tokens at or past
        # its length get a score of -inf, so their softmax weight is exactly 0 (those blocks hold
        # other sequences' finite data, never read into the answer).
        blocks = block_tables.long()  # [B, MAX_BLOCKS]
        k = key_cache[blocks].reshape(batch, -1, num_kv_heads, head_dim).float()  # [B, L, NKV, D]
        v = value_cache[blocks].reshape(batch, -1, num_kv_heads, head_dim).float()
        q = query.float().reshape(batch, num_kv_heads, group, head_dim)
        scores = torch.einsum("bhgd,blhd->bhgl", q, k) * scale
        past = torch.arange(k.shape[1], device=query.device) >= seq_lens[:, None]  # [B, L]
        scores = scores.masked_fill(past[:, None, None, :], float("-inf"))
        scores = scores - scores.amax(dim=-1, keepdim=True)
        p = scores.exp()
        p = p / p.sum(dim=-1, keepdim=True)
        out = torch.einsum("bhgl,blhd->bhgd", p, v).reshape(batch, num_q_heads, head_dim)
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
