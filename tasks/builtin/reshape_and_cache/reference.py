"""Paged KV-cache write, flash layout (vLLM's reshape_and_cache_flash), in place.

key, value [T, NKV, D]: this step's keys and values. key_cache, value_cache
[NUM_BLOCKS, BLOCK_SIZE, NKV, D]: the paged cache. slot_mapping [T] int64: token t goes to
block slot_mapping[t] // BLOCK_SIZE, row slot_mapping[t] % BLOCK_SIZE; slots are distinct, and
a negative slot (padding) means the token is skipped. Every other cache entry must be left as
it was. Writes the caches in place and returns None. Runs in every attention layer of every
step. A copy: values land in the cache bit for bit.
"""

import torch
import torch.nn as nn

T = 16  # tokens
NKV = 8  # key/value heads
D = 128  # head dim
NUM_BLOCKS = 64  # cache blocks
BLOCK_SIZE = 16  # tokens per block


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        valid = slot_mapping >= 0
        slots = slot_mapping[valid]
        # [NUM_BLOCKS * BLOCK_SIZE, NKV, D] views: slot s is row s, written through to the caches.
        key_rows = key_cache.view(-1, key_cache.shape[2], key_cache.shape[3])
        value_rows = value_cache.view(-1, value_cache.shape[2], value_cache.shape[3])
        key_rows[slots] = key[valid].to(key_cache.dtype)
        value_rows[slots] = value[valid].to(value_cache.dtype)
        return None


def get_inputs():
    key = torch.randn(T, NKV, D)
    value = torch.randn(T, NKV, D)
    key_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, NKV, D)
    value_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, NKV, D)
    slot_mapping = torch.randperm(NUM_BLOCKS * BLOCK_SIZE)[:T]
    slot_mapping[::8] = -1  # padding tokens
    return [key, value, key_cache, value_cache, slot_mapping]


def get_init_inputs():
    return []
