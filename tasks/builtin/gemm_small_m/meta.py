"""gemm_small_m: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "Small-M GEMM y = x @ w.T (x [M, K], w [N, K]) as in every linear layer of a decoding "
    "model: M is 1-64 tokens, N and K are projection sizes of Llama-3 8B/70B-class models. "
    "Memory-bound: the weight is read once and dominates; the whole game is streaming w at "
    "full bandwidth while keeping enough work in flight for so few rows."
)

# Llama-3 8B: qkv (6144x4096), o (4096x4096), one gate/up half (14336x4096), down (4096x14336);
# Llama-3 70B: o (8192x8192), qkv (10240x8192). M from single-stream decode to a batch of 64.
PUBLIC_SHAPES = [
    {"M": 1, "N": 6144, "K": 4096},
    {"M": 16, "N": 4096, "K": 4096},
    {"M": 32, "N": 14336, "K": 4096},
    {"M": 64, "N": 4096, "K": 14336},
    {"M": 1, "N": 8192, "K": 8192},
    {"M": 8, "N": 10240, "K": 8192},
]
# Tiny, odd (N and K not multiples of any block), non-power-of-two, and large; never shown.
HIDDEN_SHAPES = [
    {"M": 1, "N": 40, "K": 72},
    {"M": 3, "N": 5120, "K": 13824},
    {"M": 7, "N": 4097, "K": 4093},
    {"M": 33, "N": 12288, "K": 5120},
    {"M": 63, "N": 1000, "K": 3000},
    {"M": 64, "N": 28672, "K": 8192},
]
CPU_PUBLIC_SHAPES = [{"M": 1, "N": 128, "K": 256}, {"M": 16, "N": 192, "K": 320}]
CPU_HIDDEN_SHAPES = [{"M": 3, "N": 100, "K": 200}, {"M": 33, "N": 72, "K": 131}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    m, n, k = shape["M"], shape["N"], shape["K"]
    x = _draw((m, k), dist, device, generator)
    # Weights scaled like a trained layer's (unit-variance outputs for unit-variance inputs).
    w = torch.randn((n, k), device=device, generator=generator) / k**0.5
    return [x.to(dtype), w.to(dtype)]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: a few huge activations dominate each dot product.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Massive activations: a few fixed channels ~100x larger than the rest, as in trained
        # LLMs. Those channels dominate every dot product; the others must still be summed.
        x = torch.randn(size, device=device, generator=generator)
        # A random permutation as a sort of uniform draws: the judge draws a batch's calls
        # at once under vmap, which batches a sort and runs randperm call by call.
        channels = torch.rand(size[-1], device=device, generator=generator, dtype=torch.float64).argsort()[: size[-1] // 512 + 1]
        # (a scale per channel, not an indexed write, which vmap cannot batch)
        return x * torch.ones(size[-1], device=device).index_fill(0, channels, 100.0)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    m, n, k = shape["M"], shape["N"], shape["K"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    nbytes = (m * k + n * k + m * n) * elem  # read x and w once, write y once
    flops = 2 * m * n * k
    return nbytes, flops


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, size

    if device == "cpu":
        return {"M": log_int(rng, 1, 33), "N": size(rng, 16, 192, 16), "K": size(rng, 16, 320, 16)}
    n = size(rng, 16, 28672, 128)
    return {"M": log_int(rng, 1, 64), "N": n, "K": size(rng, 16, min(14336, 28672 * 8192 // n), 128)}
