"""silu_and_mul: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "SiLU(gate) * up over a [T, 2*I] tensor holding the gate and up projections side by side, "
    "as between the two matmuls of every SwiGLU MLP. Memory-bound: read 2*T*I, write T*I."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at real intermediate sizes: Llama-3.2
# 1B (8192), Llama-3 8B (14336), Qwen2 7B (18944) and a Llama-3 70B shard at TP=2 (14336).
PUBLIC_SHAPES = [
    {"T": 1, "I": 14336},
    {"T": 64, "I": 8192},
    {"T": 4096, "I": 14336},
    {"T": 4096, "I": 18944},
    {"T": 16384, "I": 8192},
]
# Tiny, odd, non-power-of-two and large; never shown.
HIDDEN_SHAPES = [
    {"T": 1, "I": 1407},
    {"T": 3, "I": 11008},
    {"T": 77, "I": 4864},
    {"T": 1000, "I": 13824},
    {"T": 8191, "I": 28672},
]
CPU_PUBLIC_SHAPES = [{"T": 1, "I": 256}, {"T": 8, "I": 512}]
CPU_HIDDEN_SHAPES = [{"T": 3, "I": 200}, {"T": 17, "I": 333}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    t, i = shape["T"], shape["I"]
    size = (t, 2 * i)
    if dist == "uniform":
        x = torch.rand(size, device=device, generator=generator) * 8 - 4
    elif dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: gates far out on both sides of the sigmoid.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        x = 2.0 * n / torch.sqrt(chi / 2 + 1e-6)
    elif dist == "large":
        # Gates far out on both sides: exp(-g) overflows float32 for g < -88, so a naive
        # sigmoid must still give silu(g) -> -0 there (inf is tolerable, NaN is not); the up
        # half carries a large common offset.
        gate = 40.0 * torch.randn((t, i), device=device, generator=generator)
        up = 200.0 + 50.0 * torch.randn((t, i), device=device, generator=generator)
        x = torch.cat([gate, up], dim=1)
    else:
        x = torch.randn(size, device=device, generator=generator) * 2
    return [x.to(dtype)]


def roofline(shape, dtype):
    t, i = shape["T"], shape["I"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    nbytes = 3 * t * i * elem  # read gate and up, write out
    flops = 5 * t * i  # negate, exp, add, divide, multiply
    return nbytes, flops


# The production libraries to beat (verifier/library.py), timed beside eager and torch.compile: the
# first installed whose output agrees with the reference. vLLM's own CUDA kernel and FlashInfer's
# (both gate first, as the reference), then Liger-Kernel's SiLU-and-mul on one [T, 2I] tensor,
# gate first (its LigerFusedGateUpSiLUMulFunction: no contiguous copies of the two halves, which
# its two-tensor LigerSiLUMulFunction would need here).
LIBRARY_BASELINE = [{"package": "vllm", "call": "vllm_silu_and_mul"},
                    {"package": "flashinfer-python", "call": "flashinfer_silu_and_mul"},
                    {"package": "liger-kernel", "call": "liger_silu_and_mul"}]


def vllm_silu_and_mul(x):
    import importlib

    importlib.import_module("vllm._custom_ops")  # loads vLLM's compiled ops into torch.ops._C
    out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
    torch.ops._C.silu_and_mul(out, x)
    return out


def flashinfer_silu_and_mul(x):
    from flashinfer.activation import silu_and_mul

    return silu_and_mul(x)


def liger_silu_and_mul(x):
    from liger_kernel.ops.swiglu import LigerFusedGateUpSiLUMulFunction

    return LigerFusedGateUpSiLUMulFunction.apply(x)


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import rows, size

    if device == "cpu":
        i = size(rng, 16, 512, 64)
        return {"T": rows(rng, i, 17, 17 * 333), "I": i}
    i = size(rng, 16, 28672, 128)
    return {"T": rows(rng, i, 16384, 16384 * 8192), "I": i}
