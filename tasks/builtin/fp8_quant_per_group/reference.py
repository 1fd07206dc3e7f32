"""Per-token-group fp8 quantisation: x [T, H] -> (q float8_e4m3fn [T, H], scales float32 [T, H/128]).

DeepSeek-V3's block-wise fp8 scheme quantises activations in groups of 128 consecutive
channels of one token, each group with its own scale, before every fp8 GEMM:

    g = x[t, j*128 : (j+1)*128]
    scales[t, j] = max(max |g|, 1e-10) / 448
    q[t, j*128 : (j+1)*128] = clamp(g / scales[t, j], -448, 448) rounded to float8_e4m3fn

448 is the largest finite float8_e4m3fn; rounding is to nearest, ties to even. The floor of
1e-10 on the group maximum keeps an all-zero group finite (its q is zeros). The clamp catches
g / scale landing a rounding step above 448. scales is row-major [T, H/128] (token-major, not
the column-major layout some GEMMs want). H is a multiple of the group size. The reference
computes in float32 whatever the input dtype; q is float8_e4m3fn and scales float32 always.
"""

import torch
import torch.nn as nn

T = 16  # tokens
H = 7168  # hidden size, a multiple of GROUP_SIZE
GROUP_SIZE = 128  # channels per scale
FP8_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-10


class Model(nn.Module):
    def __init__(self, group_size: int):
        super().__init__()
        self.group_size = group_size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, hidden = x.shape
        groups = hidden // self.group_size
        xg = x.float().reshape(tokens, groups, self.group_size)
        amax = xg.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR)
        scales = amax / FP8_MAX
        q = (xg / scales).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q.reshape(tokens, hidden), scales.reshape(tokens, groups)


def get_inputs():
    return [torch.randn(T, H)]


def get_init_inputs():
    return [GROUP_SIZE]
