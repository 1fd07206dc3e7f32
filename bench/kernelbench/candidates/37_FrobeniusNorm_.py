"""KernelBench level 1, 37_FrobeniusNorm_: y = x / ||x||_F, one norm over the whole tensor.

A global reduction, so three launches:

1. ``_partial_kernel``: each program sums the squares of CHUNK consecutive elements (in BLOCK
   tiles, float32) and writes one partial sum;
2. ``_norm_kernel``: one program folds the partial sums (again BLOCK at a time, float32) and
   writes sqrt(sum) into a one-element buffer;
3. ``_scale_kernel``: every element divided by that norm, read from device memory (no host sync).

Numerics: float32 throughout, as torch.norm on float32; the two-level sum (lanes within a chunk,
then chunks) keeps each running sum short: the default tensor has 1.9e9 elements, and one float32
running sum over them would lose about log2(1.9e9) bits. Offsets are int64 for the same reason.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 4096
TILES_PER_CHUNK = 8  # a chunk is TILES_PER_CHUNK * BLOCK elements


@triton.jit
def _partial_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr, TILES: tl.constexpr):
    chunk = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for t in range(TILES):
        offs = (chunk * TILES + t) * BLOCK + lanes
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(part_ptr + chunk, tl.sum(acc, axis=0))


@triton.jit
def _norm_kernel(part_ptr, norm_ptr, n_parts, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_parts, BLOCK):
        idx = start + lanes
        acc += tl.load(part_ptr + idx, mask=idx < n_parts, other=0.0)
    tl.store(norm_ptr, tl.sqrt(tl.sum(acc, axis=0)))


@triton.jit
def _scale_kernel(x_ptr, norm_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    norm = tl.load(norm_ptr)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x / norm).to(y_ptr.dtype.element_ty), mask=mask)


def frobenius_normalize(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    n_parts = max(1, triton.cdiv(n, BLOCK * TILES_PER_CHUNK))
    parts = torch.empty(n_parts, device=x.device, dtype=torch.float32)
    norm = torch.empty(1, device=x.device, dtype=torch.float32)
    _partial_kernel[(n_parts,)](x, parts, n, BLOCK=BLOCK, TILES=TILES_PER_CHUNK, num_warps=8)
    _norm_kernel[(1,)](parts, norm, n_parts, BLOCK=1024, num_warps=4)
    if n:
        _scale_kernel[(triton.cdiv(n, BLOCK),)](x, norm, y, n, BLOCK=BLOCK, num_warps=8)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return frobenius_normalize(x)
