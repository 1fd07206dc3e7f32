"""rms_norm_fp8_quant: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "RMSNorm with a learned weight fused with dynamic per-token fp8 (e4m3) quantisation of its "
    "output, as before every attention and MLP block of an fp8-served Llama-style model. "
    "Memory-bound: read x and w, write a byte per element and a float per row; the normalised "
    "row never goes to memory."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at Llama-3 8B/70B and Qwen2 hidden sizes.
PUBLIC_SHAPES = [
    {"T": 1, "H": 4096},
    {"T": 32, "H": 8192},
    {"T": 4096, "H": 4096},
    {"T": 16384, "H": 8192},
]
# Tiny, odd, non-power-of-two and large; never shown.
HIDDEN_SHAPES = [
    {"T": 1, "H": 100},
    {"T": 3, "H": 2048},
    {"T": 77, "H": 5120},
    {"T": 1000, "H": 3584},
    {"T": 8191, "H": 7168},
]
CPU_PUBLIC_SHAPES = [{"T": 1, "H": 256}, {"T": 16, "H": 1536}]
CPU_HIDDEN_SHAPES = [{"T": 3, "H": 200}, {"T": 33, "H": 1100}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
# The input's dtype. q is float8_e4m3fn and scale float32 on every device: torch converts to
# fp8 on the CPU as well, so the reference and the inputs work there. The interpreter's own
# float32 -> fp8 conversion rounds wrongly (below), so the seed is checked on a GPU only.
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}

INTERPRETER_UNSUPPORTED = (
    "the Triton interpreter converts float32 to float8_e4m3fn incorrectly (Triton 3.9: a "
    "mantissa carry into an odd exponent halves the value, e.g. 31.6 -> 16 instead of 32; ties "
    "round away from zero; some subnormals are off by a step; no saturation at 448), so the "
    "seed's q cannot match torch's rounding there"
)


def make_inputs(shape, dist, dtype, device, generator):
    t, h = shape["T"], shape["H"]
    x = _draw((t, h), dist, device, generator)
    weight = 1.0 + 0.1 * torch.randn(h, device=device, generator=generator)
    return [x.to(dtype), weight.to(dtype)]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: rare huge values dominate the mean of squares and
        # set the scale, pushing the rest of the row into fp8's low binades.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Large magnitude with a common offset: each square is ~1e5, so a running sum kept in
        # bf16 stops growing correctly after a few hundred terms; it must be float32.
        return 300.0 + 50.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, h = shape["T"], shape["H"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # read x and w once, write q (1 byte per element) and one float32 scale per row
    nbytes = (t * h + h) * elem + t * h * 1 + t * 4
    flops = 7 * t * h  # square, sum, normalise, weight, |y| and max, divide, clamp
    return nbytes, flops


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows, size

    if device == "cpu":
        h = size(rng, 16, 1536, 64, align=4)
        return {"T": rows(rng, h, 33, 33 * 1100), "H": h}
    return {"T": log_int(rng, 1, 16384), "H": size(rng, 16, 8192, 128, align=4)}
