"""fp8_quant_per_group: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "Per-token-group fp8 (e4m3) quantisation with groups of 128 channels, as DeepSeek-V3's "
    "block-wise fp8 GEMMs need before every linear layer: one float32 scale per (token, group) "
    "and x / scale rounded to float8_e4m3fn. Memory-bound: read x, write a byte per element "
    "and a float per 128 elements."
)

# DeepSeek-V3: hidden 7168 for decode (1-64 tokens) and prefill (16384 tokens); an expert's
# intermediate (2048, the down projection's input) at a 4096-token prefill.
PUBLIC_SHAPES = [
    {"T": 1, "H": 7168},
    {"T": 64, "H": 7168},
    {"T": 4096, "H": 2048},
    {"T": 16384, "H": 7168},
]
# One group, tiny, odd token counts, non-power-of-two group counts (DeepSeek's q_lora_rank
# 1536 = 12 groups, dense intermediate 18432 = 144 groups), large; never shown.
HIDDEN_SHAPES = [
    {"T": 1, "H": 128},
    {"T": 3, "H": 384},
    {"T": 77, "H": 1536},
    {"T": 1000, "H": 18432},
    {"T": 8191, "H": 7168},
]
CPU_PUBLIC_SHAPES = [{"T": 1, "H": 256}, {"T": 16, "H": 1024}]
CPU_HIDDEN_SHAPES = [{"T": 3, "H": 128}, {"T": 33, "H": 640}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
# The input's dtype. q is float8_e4m3fn and scales float32 on every device: torch converts to
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
    x = _draw((shape["T"], shape["H"]), dist, device, generator)
    return [x.to(dtype)]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        # Uniform with a random amplitude per token: with one amplitude everywhere most bf16
        # group maxima round to exactly 1.0 and the scales barely vary.
        u = torch.rand(size, device=device, generator=generator) * 2 - 1
        return u * torch.exp(torch.randn((size[0], 1), device=device, generator=generator))
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: a group's one huge value sets its scale and pushes
        # the other 127 into fp8's low binades.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Massive activations: a few fixed channels ~100x larger than the rest, as in trained
        # LLMs; only the groups holding them get large scales, the others must not.
        x = torch.randn(size, device=device, generator=generator)
        # A random permutation as a sort of uniform draws: the judge draws a batch's calls
        # at once under vmap, which batches a sort and runs randperm call by call.
        channels = torch.rand(size[-1], device=device, generator=generator, dtype=torch.float64).argsort()[: size[-1] // 512 + 1]
        # (a scale per channel, not an indexed write, which vmap cannot batch)
        return x * torch.ones(size[-1], device=device).index_fill(0, channels, 100.0)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, h, g = shape["T"], shape["H"], shape["GROUP_SIZE"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    nbytes = t * h * elem + t * h * 1 + t * (h // g) * 4  # read x, write q (1 byte) and scales
    flops = 3 * t * h  # |x| and max, divide, clamp
    return nbytes, flops


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows

    # H is a multiple of the group size (128), as the reference requires
    if device == "cpu":
        h = 128 * log_int(rng, 1, 8)
        return {"T": rows(rng, h, 33, 33 * 640), "H": h}
    h = 128 * log_int(rng, 1, 144)
    return {"T": rows(rng, h, 16384, 16384 * 7168), "H": h}
