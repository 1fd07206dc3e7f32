"""Dynamic per-token fp8 quantisation: x [T, H] -> (q float8_e4m3fn [T, H], scale float32 [T, 1]).

Before every fp8 GEMM of a model served in W8A8-fp8, each token's activations are scaled so
that the row's largest magnitude lands on 448, the largest finite float8_e4m3fn value:

    scale[t] = max(max_h |x[t, h]| / 448, 1 / (448 * 512))
    q[t, h]  = clamp(x[t, h] / scale[t], -448, 448) rounded to float8_e4m3fn (nearest, ties even)

The floor on the scale (vLLM's minimum scaling factor) keeps an all-zero row finite: its scale
is 1/(448*512) and its q is all zeros. The clamp catches x/scale landing a rounding step above
448. The reference computes in float32 whatever the input dtype; q is float8_e4m3fn and scale
float32 always.
"""

import torch
import torch.nn as nn

T = 16  # tokens
H = 4096  # hidden size
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        amax = xf.abs().amax(dim=-1, keepdim=True)
        scale = (amax / FP8_MAX).clamp_min(MIN_SCALE)
        q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q, scale


def get_inputs():
    return [torch.randn(T, H)]


def get_init_inputs():
    return []
