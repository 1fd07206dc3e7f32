"""Merge two partial attention results by their log-sum-exp (vLLM's merge_attn_states).

Attention over a prefix (e.g. cached context) and a suffix (the new tokens) computed apart
gives, per token and head, an output o and the log-sum-exp of its scores lse. The result of
attending over both is their mix weighted by the softmax of the two lse values:

    lse    = log(exp(lse_p) + exp(lse_s))
    output = o_p * exp(lse_p - lse) + o_s * exp(lse_s - lse)

prefix_output, suffix_output [T, H, D]; prefix_lse, suffix_lse [H, T] float32 (note the
transposed layout). Returns (output [T, H, D], output_lse [H, T] float32) as new tensors.
An empty part has lse = -inf and weight 0; when both parts are empty the prefix output is
passed through and the lse is -inf, as vLLM does. Used by chunked prefill, prefix caching and
cascade attention. Computes in float32.
"""

import torch
import torch.nn as nn

T = 16  # tokens
H = 32  # heads
D = 128  # head dim


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        prefix_output: torch.Tensor,
        prefix_lse: torch.Tensor,
        suffix_output: torch.Tensor,
        suffix_lse: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        p_lse = prefix_lse.float()
        s_lse = suffix_lse.float()
        max_lse = torch.maximum(p_lse, s_lse)
        both_empty = torch.isneginf(max_lse)
        # Subtract the larger lse before exp(): lse values in the thousands overflow otherwise.
        max_lse = torch.where(both_empty, torch.zeros_like(max_lse), max_lse)
        p_se = torch.exp(p_lse - max_lse)
        s_se = torch.exp(s_lse - max_lse)
        total = p_se + s_se
        output_lse = torch.log(total) + max_lse  # log(0) = -inf where both parts are empty
        p_scale = torch.where(both_empty, torch.ones_like(total), p_se / total)
        s_scale = torch.where(both_empty, torch.zeros_like(total), s_se / total)
        # [H, T] weights against [T, H, D] outputs
        output = prefix_output.float() * p_scale.t()[:, :, None] + suffix_output.float() * s_scale.t()[:, :, None]
        return output.to(prefix_output.dtype), output_lse.to(prefix_lse.dtype)


def get_inputs():
    prefix_output = torch.randn(T, H, D)
    suffix_output = torch.randn(T, H, D)
    prefix_lse = 5.0 + 3.0 * torch.randn(H, T)
    suffix_lse = 5.0 + 3.0 * torch.randn(H, T)
    prefix_lse[:, ::7] = float("-inf")  # some tokens have an empty prefix
    return [prefix_output, prefix_lse, suffix_output, suffix_lse]


def get_init_inputs():
    return []
