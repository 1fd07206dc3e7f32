"""KernelBench level 1, 40_LayerNorm: nn.LayerNorm over the trailing (features, dim1, dim2) dims.

Each of the batch_size rows holds N = features * dim1 * dim2 elements (4.2M by default): far too
many for one program, and 16 rows would leave most of the GPU idle. So three launches:

1. ``_chunk_stats_kernel``: every (row, chunk of BLOCK elements) program loads its chunk once and
   writes the chunk's mean and M2 = sum((x - chunk mean)^2);
2. ``_row_stats_kernel``: one program per row merges its chunks with Chan et al.'s parallel
   formula, mean = sum(n_c * mean_c) / N and M2 = sum(M2_c + n_c * (mean_c - mean)^2), and
   writes mean and rstd = 1 / sqrt(M2 / N + eps) (biased variance, as LayerNorm);
3. ``_apply_kernel``: y = (x - mean) * rstd * weight + bias, one program per (row, chunk).

Numerics: float32 throughout. Centred sums (M2 about each chunk's own mean, then the merge)
avoid the cancellation of E[x^2] - E[x]^2 when the mean is large against the spread.
The weight and bias are ModelNew's own nn.LayerNorm's parameters (built under the same seed as
the reference, so identical); the layer itself is never called.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 4096
STATS_BLOCK = 1024


@triton.jit
def _chunk_stats_kernel(x_ptr, mean_ptr, m2_ptr, N, n_chunks, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_chunks
    chunk = pid % n_chunks
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    count = tl.minimum(N - chunk * BLOCK, BLOCK).to(tl.float32)
    mean = tl.sum(x, axis=0) / count
    d = tl.where(mask, x - mean, 0.0)
    tl.store(mean_ptr + pid, mean)
    tl.store(m2_ptr + pid, tl.sum(d * d, axis=0))


@triton.jit
def _row_stats_kernel(mean_ptr, m2_ptr, row_mean_ptr, row_rstd_ptr, N, n_chunks, eps,
                      BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    # chunk c holds min(CHUNK, N - c * CHUNK) elements: all full but the last
    weighted = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_chunks, BLOCK):
        c = start + lanes
        mask = c < n_chunks
        count = tl.minimum(N - c.to(tl.int64) * CHUNK, CHUNK).to(tl.float32)
        m = tl.load(mean_ptr + row * n_chunks + c, mask=mask, other=0.0)
        weighted += tl.where(mask, count * m, 0.0)
    mean = tl.sum(weighted, axis=0) / N
    m2 = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_chunks, BLOCK):
        c = start + lanes
        mask = c < n_chunks
        count = tl.minimum(N - c.to(tl.int64) * CHUNK, CHUNK).to(tl.float32)
        m = tl.load(mean_ptr + row * n_chunks + c, mask=mask, other=0.0)
        q = tl.load(m2_ptr + row * n_chunks + c, mask=mask, other=0.0)
        d = m - mean
        m2 += tl.where(mask, q + count * d * d, 0.0)
    var = tl.sum(m2, axis=0) / N
    tl.store(row_mean_ptr + row, mean)
    tl.store(row_rstd_ptr + row, 1.0 / tl.sqrt(var + eps))


@triton.jit
def _apply_kernel(x_ptr, w_ptr, b_ptr, y_ptr, row_mean_ptr, row_rstd_ptr, N, n_chunks, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_chunks
    cols = (pid % n_chunks) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    mean = tl.load(row_mean_ptr + row)
    rstd = tl.load(row_rstd_ptr + row)
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean) * rstd * w + b
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    N = weight.numel()
    rows = x.numel() // N if N else 0
    if rows == 0:
        return y
    n_chunks = triton.cdiv(N, BLOCK)
    chunk_mean = torch.empty(rows * n_chunks, device=x.device, dtype=torch.float32)
    chunk_m2 = torch.empty_like(chunk_mean)
    row_mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    row_rstd = torch.empty_like(row_mean)
    _chunk_stats_kernel[(rows * n_chunks,)](x, chunk_mean, chunk_m2, N, n_chunks, BLOCK=BLOCK, num_warps=8)
    stats_block = min(STATS_BLOCK, triton.next_power_of_2(n_chunks))
    _row_stats_kernel[(rows,)](chunk_mean, chunk_m2, row_mean, row_rstd, N, n_chunks, eps,
                               BLOCK=stats_block, CHUNK=BLOCK, num_warps=4)
    _apply_kernel[(rows * n_chunks,)](x, weight.contiguous(), bias.contiguous(), y, row_mean, row_rstd,
                                      N, n_chunks, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
