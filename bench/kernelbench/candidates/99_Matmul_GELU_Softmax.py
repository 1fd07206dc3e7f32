"""KernelBench level 2, 99_Matmul_GELU_Softmax: y = softmax(gelu(x @ W^T + b), dim=1).

Two launches:

1. ``_gemm_gelu_kernel``: a tiled GEMM (x against W^T, W the (out, in) weight of ModelNew's own
   nn.Linear, built under the reference's seed and never called; read through strides, never
   copied) with bias and exact (erf) GELU applied to the float32 accumulator tile before its one
   store into the output buffer;
2. ``_softmax_rows_kernel``: softmax over each row of that buffer, in place: an online pass keeps
   per lane the running maximum m and the running sum of exp(x - m) (rescaled when m grows),
   merged into the row's maximum M and sum S, then a second pass writes exp(x - M) / S. Rows of
   any length: the row is walked in BLOCK steps, never held whole.

GEMM: masked loads, so batch, in and out may be any size; programs in groups of GROUP_M tile rows
share tiles in L2. Numerics: float32 accumulation with ``input_precision="ieee"`` (TF32 inputs
would be ~1e-3 off, beyond float32 tolerance); GELU is torch's default erf form; the softmax is in
float32 and subtracts the row maximum, so exp never overflows.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 32
GROUP_M = 8
SOFTMAX_BLOCK = 4096


@triton.jit
def _gemm_gelu_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
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

    v = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _softmax_rows_kernel(y_ptr, N, stride_row, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * stride_row
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + lanes
        x = tl.load(y_ptr + base + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # a lane that has seen only -inf (a masked tail) shifts by 0: exp(-inf) = 0, never
        # exp(-inf - -inf) = NaN
        shift = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    row_max = tl.max(m, axis=0)
    inv = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
    for start in range(0, N, BLOCK):
        cols = start + lanes
        mask = cols < N
        x = tl.load(y_ptr + base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_ptr + base + cols, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=mask)


def gemm_gelu_softmax(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M and N:
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        _gemm_gelu_kernel[grid](
            x, weight, bias, y, M, N, K,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, num_warps=8, num_stages=3,
        )
        _softmax_rows_kernel[(M,)](y, N, y.stride(0), BLOCK=min(SOFTMAX_BLOCK, triton.next_power_of_2(N)),
                                   num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_gelu_softmax(x, self.linear.weight, self.linear.bias)
