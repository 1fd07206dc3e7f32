"""Seed kernel for reshape_and_cache (flash layout): one program per token.

Each program reads its token's slot and, unless the slot is negative (padding), copies the
token's [NKV, D] key and value tiles into that cache row. Clear, not fast: no vectorisation
hints, one token per program.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    NKV, D, BLOCK_SIZE,
    stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    stride_kc_block, stride_kc_slot, stride_kc_head,
    stride_vc_block, stride_vc_slot, stride_vc_head,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # int64 slot arithmetic: a real cache holds far more than 2^31 elements.
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # A negative slot is a padding token: nothing to read or write.
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    row = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NKV) & (d < D)
    # A copy: no arithmetic, so no accumulation dtype; the values land bit for bit.
    key = tl.load(k_ptr + tok * stride_k_tok + h * stride_k_head + d, mask=mask)
    value = tl.load(v_ptr + tok * stride_v_tok + h * stride_v_head + d, mask=mask)
    kc_off = block * stride_kc_block + row * stride_kc_slot + h * stride_kc_head + d
    vc_off = block * stride_vc_block + row * stride_vc_slot + h * stride_vc_head + d
    tl.store(kc_ptr + kc_off, key.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + vc_off, value.to(vc_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    # The caches are written through as given (in place), so they cannot be made contiguous;
    # each needs unit stride along D, as vLLM's caches have.
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache need unit stride along the head dim")
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    tokens, num_kv_heads, head_dim = key.shape
    block_size = key_cache.shape[1]
    _reshape_and_cache_kernel[(tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        num_kv_heads, head_dim, block_size,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )


class ModelNew(nn.Module):
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
        reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return None
