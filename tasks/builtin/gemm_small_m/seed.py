"""Seed kernel for gemm_small_m: one program per (BLOCK_M x BLOCK_N) tile of y, looping over K.

Clear, not fast: no split-K (so few tiles leave most SMs idle at M=1), no swizzling, no
autotuning, no persistent grid. Every M fits in one tile row (BLOCK_M >= M up to 64).
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # Accumulate in float32: a K=14336 reduction in bf16 would keep ~3 significant digits.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        # Masked lanes load 0, which adds nothing to the dot product (odd K, odd M, odd N).
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        # w is [N, K] row-major; reading it as a [BLOCK_K, BLOCK_N] tile gives w.T directly.
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None],
                    mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y,
             mask=m_mask[:, None] & n_mask[None, :])


def gemm_small_m(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    if w.stride(-1) != 1:
        w = w.contiguous()
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    # tl.dot needs every tile side >= 16; one tile row covers all M up to 64.
    block_m = min(max(16, triton.next_power_of_2(m)), 64)
    block_n, block_k = 64, 64
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    # float32 operands (the interpreter's dtype, or a float32 run) must not be rounded to TF32.
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _gemm_kernel[grid](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, num_warps=4,
    )
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return gemm_small_m(x, w)
