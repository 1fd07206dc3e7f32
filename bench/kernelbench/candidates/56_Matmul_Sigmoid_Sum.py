"""KernelBench level 2, 56_Matmul_Sigmoid_Sum: y = sigmoid(x @ W^T + b).sum(dim=1, keepdim=True).

Two launches, and the (batch, hidden) activation never goes to memory:

1. ``_gemm_sigmoid_rowsum_kernel``: a tiled GEMM (x against W^T, W the (hidden, in) weight of
   ModelNew's own nn.Linear, built under the reference's seed and never called; read through
   strides, never copied), then bias and sigmoid on the float32 accumulator tile, whose rows are
   summed over the tile's columns (masked columns count zero) into one partial sum per (row,
   column tile);
2. ``_rowsum_kernel``: each row's partial sums folded into the output, in a fixed order (no
   atomics: the result does not depend on the order programs finish).

GEMM: masked loads, so batch, in and hidden may be any size; programs in groups of GROUP_M tile
rows share tiles in L2. Numerics: float32 accumulation with ``input_precision="ieee"`` (TF32
inputs would be ~1e-3 off, beyond float32 tolerance); sigmoid from e = exp(-|h|), which never
overflows; sums in float32.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 32
GROUP_M = 8
SUM_BLOCK = 256


@triton.jit
def _sigmoid(v):
    e = tl.exp(-tl.abs(v))
    inv = 1.0 / (1.0 + e)
    return tl.where(v >= 0, inv, e * inv)


@triton.jit
def _gemm_sigmoid_rowsum_kernel(
    x_ptr, w_ptr, bias_ptr, part_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk,
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

    s = _sigmoid(acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :])
    # sigmoid(0) = 1/2, so masked columns must be zeroed, not left to the zero padding
    s = tl.where((rn < N)[None, :], s, 0.0)
    tl.store(part_ptr + rm * tiles_n + pid_n, tl.sum(s, axis=1), mask=rm < M)


@triton.jit
def _rowsum_kernel(part_ptr, y_ptr, n_parts, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_parts, BLOCK):
        idx = start + lanes
        acc += tl.load(part_ptr + row * n_parts + idx, mask=idx < n_parts, other=0.0)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def gemm_sigmoid_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty(M, 1, device=x.device, dtype=x.dtype)
    if M == 0:
        return y
    tiles_n = max(1, triton.cdiv(N, BLOCK_N))
    parts = torch.empty(M, tiles_n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(M, BLOCK_M) * tiles_n,)
    _gemm_sigmoid_rowsum_kernel[grid](
        x, weight, bias, parts, M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, num_warps=8, num_stages=3,
    )
    block = min(SUM_BLOCK, triton.next_power_of_2(tiles_n))
    _rowsum_kernel[(M,)](parts, y, tiles_n, BLOCK=block, num_warps=4)
    return y


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.linear = nn.Linear(input_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_sigmoid_sum(x, self.linear.weight, self.linear.bias)
