"""rms_norm: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "RMSNorm over the hidden dimension with a learned weight, as before every attention and "
    "MLP block of Llama-style models. Memory-bound: read x and w, write y."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at Llama-3 8B/70B and Qwen2 hidden sizes.
PUBLIC_SHAPES = [
    {"T": 1, "H": 4096},
    {"T": 32, "H": 4096},
    {"T": 4096, "H": 4096},
    {"T": 16384, "H": 8192},
]
# Tiny, odd, non-power-of-two and large; never shown.
HIDDEN_SHAPES = [
    {"T": 3, "H": 2048},
    {"T": 77, "H": 5120},
    {"T": 1000, "H": 3584},
    {"T": 8191, "H": 8192},
]
CPU_PUBLIC_SHAPES = [{"T": 1, "H": 256}, {"T": 16, "H": 512}]
CPU_HIDDEN_SHAPES = [{"T": 3, "H": 200}, {"T": 33, "H": 384}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    t, h = shape["T"], shape["H"]
    x = _draw((t, h), dist, device, generator)
    weight = 1.0 + 0.1 * torch.randn(h, device=device, generator=generator)
    return [x.to(dtype), weight.to(dtype)]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: rare huge values dominate the mean of squares.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Large magnitude with a common offset: squares overflow bf16 accumulation quickly.
        return 300.0 + 50.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, h = shape["T"], shape["H"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    nbytes = (2 * t * h + h) * elem  # read x, write y, read w once
    flops = 4 * t * h  # square, sum, scale, weight
    return nbytes, flops


# The production libraries to beat (verifier/library.py), timed beside eager and torch.compile:
# the first installed whose output agrees with the reference. vLLM's own CUDA kernel and
# FlashInfer's (what serving engineers compare with), then Liger-Kernel's RMSNorm in its "gemma"
# casting mode, which computes in float32 from x and the weight and casts the result back, as the
# reference does (its default "llama" mode applies the weight after the cast back to the input's dtype).
LIBRARY_BASELINE = [{"package": "vllm", "call": "vllm_rms_norm"},
                    {"package": "flashinfer-python", "call": "flashinfer_rms_norm"},
                    {"package": "liger-kernel", "call": "liger_rms_norm"}]


def vllm_rms_norm(x, weight):
    from vllm import _custom_ops as ops

    out = torch.empty_like(x)
    ops.rms_norm(out, x, weight, 1e-6)  # eps as the reference's EPS
    return out


def flashinfer_rms_norm(x, weight):
    from flashinfer.norm import rmsnorm

    return rmsnorm(x, weight, eps=1e-6)


def liger_rms_norm(x, weight):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, weight, 1e-6, 0.0, "gemma", False)  # eps as the reference's EPS


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows, size

    if device == "cpu":
        h = size(rng, 16, 512, 64, align=8)
        return {"T": rows(rng, h, 33, 33 * 384), "H": h}
    return {"T": log_int(rng, 1, 16384), "H": size(rng, 16, 8192, 128, align=8)}
