"""Seed kernel for merge_attn_states: one program per (token, head), the head in one block.

Clear, not fast: each program reads two lse scalars, forms the two weights, and mixes two
head vectors; no program handles more than one head.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _merge_attn_states_kernel(
    out_ptr, out_lse_ptr, p_out_ptr, p_lse_ptr, s_out_ptr, s_lse_ptr,
    D, stride_tok, stride_head, stride_lse,
    BLOCK_D: tl.constexpr,
):
    # int64 offsets: T * H * D passes 2^31 elements on long prefills with many heads.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    lse_off = head * stride_lse + tok
    # Weights in float32 from float32 lse values: subtract the larger lse first, so exp()
    # sees values in (-inf, 0] (lse near 5000 would overflow), and the larger part's weight
    # term is exactly 1.
    p_lse = tl.load(p_lse_ptr + lse_off).to(tl.float32)
    s_lse = tl.load(s_lse_ptr + lse_off).to(tl.float32)
    m = tl.maximum(p_lse, s_lse)
    # Both parts empty (-inf): pass the prefix output through and report lse = -inf, as
    # vLLM does; m = 0 there keeps -inf - m from becoming NaN.
    both_empty = m == -float("inf")
    m = tl.where(both_empty, 0.0, m)
    p_se = tl.exp(p_lse - m)
    s_se = tl.exp(s_lse - m)
    # At least 1 unless both parts are empty, so the divisions below are safe.
    total = tl.where(both_empty, 1.0, p_se + s_se)
    tl.store(out_lse_ptr + lse_off, tl.where(both_empty, -float("inf"), tl.log(total) + m))
    p_scale = tl.where(both_empty, 1.0, p_se / total)
    s_scale = s_se / total  # 0 when the suffix is empty, whatever its output holds

    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    off = tok * stride_tok + head * stride_head + cols
    p_out = tl.load(p_out_ptr + off, mask=mask, other=0.0).to(tl.float32)
    s_out = tl.load(s_out_ptr + off, mask=mask, other=0.0).to(tl.float32)
    out = p_out * p_scale + s_out * s_scale
    tl.store(out_ptr + off, out.to(out_ptr.dtype.element_ty), mask=mask)


def merge_attn_states(
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    # One set of strides for both parts and the output, unit stride along the head dim.
    p_out, s_out = prefix_output.contiguous(), suffix_output.contiguous()
    p_lse, s_lse = prefix_lse.contiguous(), suffix_lse.contiguous()
    tokens, heads, head_dim = p_out.shape
    output = torch.empty_like(p_out)
    output_lse = torch.empty_like(p_lse)
    _merge_attn_states_kernel[(tokens, heads)](
        output, output_lse, p_out, p_lse, s_out, s_lse,
        head_dim, p_out.stride(0), p_out.stride(1), p_lse.stride(0),
        BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4,
    )
    return output, output_lse


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        prefix_output: torch.Tensor,
        prefix_lse: torch.Tensor,
        suffix_output: torch.Tensor,
        suffix_lse: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return merge_attn_states(prefix_output, prefix_lse, suffix_output, suffix_lse)
