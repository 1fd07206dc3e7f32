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
        # No host sync (a boolean-mask index would wait for the GPU to learn how many tokens are
        # real): every token writes one row. A padding token writes the row of the first real
        # token with that token's values, the very bits it gets anyway, so the repeated index
        # writes one value whatever the order; with no real token at all it writes row 0 back
        # with row 0's own values. Either way no other entry changes.
        valid = slot_mapping >= 0
        # the first real token (0 when none is), as a 1-element index: a 0-d tensor index is read
        # on the host
        first = torch.argmax(valid.to(torch.int32)).view(1)
        any_valid = valid[first]
        target = torch.where(any_valid, slot_mapping[first], 0)
        slots = torch.where(valid, slot_mapping, target)
        for new, cache in ((key, key_cache), (value, value_cache)):
            # [NUM_BLOCKS * BLOCK_SIZE, NKV, D] view: slot s is row s, written through to the cache.
            rows = cache.view(-1, cache.shape[2], cache.shape[3])
            pad_row = torch.where(any_valid, new[first].to(cache.dtype), rows[target])
            rows.index_copy_(0, slots, torch.where(valid[:, None, None], new.to(cache.dtype), pad_row))
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
