"""KernelBench level 2, 40_Matmul_Scaling_ResidualAdd: h = x @ W^T + b; y = h * scaling_factor + h.

One fused kernel: the GEMM x @ W^T, with W the (out, in) weight of ModelNew's own nn.Linear (built
under the same seed as the reference's, so identical; the layer is never called), read as its
transpose through strides and never copied; then the bias, the scaling and the residual add on the
float32 accumulator tile before the one store, so the (batch, out) intermediate never goes to
memory.

GEMM: each program computes one BLOCK_M x BLOCK_N tile, walking K in BLOCK_K steps with masked
loads, so batch, in and out may be any size; programs are ordered in groups of GROUP_M tile rows
to share tiles in L2. Numerics: float32 accumulation with ``input_precision="ieee"``: tl.dot on
float32 may otherwise round its inputs to TF32, ~1e-3 relative, beyond float32 tolerance.
The epilogue rounds as the reference does: h * s, then + h (not h * (1 + s)).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 32
GROUP_M = 8


@triton.jit
def _gemm_scale_residual_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    scaling_factor,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    # int64 row/column indices: batch * in may pass 2^31 elements
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        # W^T's (k, n) element is W[n, k]
        w = tl.load(w_ptr + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")

    h = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    y = h * scaling_factor + h
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm_scale_residual(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scaling_factor: float,
) -> torch.Tensor:
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M and N:
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _gemm_scale_residual_kernel[grid](
            x, weight, bias, y, M, N, K,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
            scaling_factor,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, num_warps=8, num_stages=3,
        )
    return y


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = float(scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_scale_residual(x, self.matmul.weight, self.matmul.bias, self.scaling_factor)
