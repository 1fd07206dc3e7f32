"""merge_attn_states: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "Merge two partial attention outputs (prefix and suffix) by log-sum-exp weights, as "
    "chunked prefill, prefix caching and cascade attention do in every attention layer. "
    "Outputs [T, H, D] in the model dtype, lse [H, T] in float32; -inf lse marks an empty "
    "part. Memory-bound: read two outputs and two lse arrays, write one of each."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at real head layouts: Llama-3 8B (32
# heads, D=128), DeepSeek MLA at TP=8 (16 heads, v head dim 128), Llama-3.2 1B (32, D=64),
# Qwen2 7B (28, D=128).
PUBLIC_SHAPES = [
    {"T": 1, "H": 32, "D": 128},
    {"T": 64, "H": 16, "D": 128},
    {"T": 4096, "H": 32, "D": 64},
    {"T": 4096, "H": 28, "D": 128},
    {"T": 16384, "H": 32, "D": 128},
]
# Tiny, odd, non-power-of-two and large; never shown. D=96 is Phi-3-mini's head dim; 128
# heads is DeepSeek MLA on one GPU.
HIDDEN_SHAPES = [
    {"T": 1, "H": 8, "D": 64},
    {"T": 3, "H": 40, "D": 128},
    {"T": 13, "H": 32, "D": 96},
    {"T": 77, "H": 14, "D": 64},
    {"T": 1000, "H": 128, "D": 128},
    {"T": 8191, "H": 64, "D": 128},
]
CPU_PUBLIC_SHAPES = [{"T": 1, "H": 4, "D": 64}, {"T": 16, "H": 4, "D": 128}]
CPU_HIDDEN_SHAPES = [{"T": 3, "H": 3, "D": 96}, {"T": 19, "H": 5, "D": 64}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    t, h, d = shape["T"], shape["H"], shape["D"]
    prefix_output = _draw_output((t, h, d), dist, device, generator)
    suffix_output = _draw_output((t, h, d), dist, device, generator)
    prefix_lse = _draw_lse((h, t), dist, device, generator)
    suffix_lse = _draw_lse((h, t), dist, device, generator)
    # Empty parts, per token (all heads), at random tokens: 1/8 of the tokens have no prefix
    # (no cache hit), 1/8 no suffix, 1/16 neither (vLLM's MLA corner case). Counts are fixed so
    # every shape of 16 tokens or more has each kind. The empty part's output holds finite
    # garbage, which its zero weight must cancel.
    # A random permutation as a sort of uniform draws: the judge draws a batch's calls
    # at once under vmap, which batches a sort and runs randperm call by call.
    order = torch.rand(t, device=device, generator=generator, dtype=torch.float64).argsort()
    n_one, n_both = t // 8, t // 16
    no_prefix = torch.cat([order[:n_one], order[2 * n_one : 2 * n_one + n_both]])
    no_suffix = order[n_one : 2 * n_one + n_both]
    prefix_lse[:, no_prefix] = float("-inf")
    suffix_lse[:, no_suffix] = float("-inf")
    return [prefix_output.to(dtype), prefix_lse, suffix_output.to(dtype), suffix_lse]


def _draw_output(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: the outlier channels attention outputs have.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        return 300.0 + 50.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def _draw_lse(size, dist, device, generator):
    """float32 log-sum-exp values; the two parts' difference sets the mix."""
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 20 - 5
    if dist == "heavy_tailed":
        # Mostly close lse pairs with rare large gaps, where one part takes all the weight.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return 5.0 + 2.0 * n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Scores with large logits: exp(lse) overflows float32 far below 5000, so the larger
        # lse must be subtracted before exponentiating; differences stay O(10).
        return 5000.0 + 10.0 * torch.randn(size, device=device, generator=generator)
    return 5.0 + 3.0 * torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, h, d = shape["T"], shape["H"], shape["D"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    # read two outputs and two float32 lse arrays, write one output and one lse array
    nbytes = 3 * t * h * d * elem + 3 * h * t * 4
    flops = 3 * t * h * d + 10 * t * h  # two multiplies and an add per element; the weights
    return nbytes, flops


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows

    if device == "cpu":
        h, d = log_int(rng, 1, 5), rng.choice((64, 96, 128))
        return {"T": rows(rng, h * d, 19, 16 * 4 * 128), "H": h, "D": d}
    h, d = log_int(rng, 1, 128), rng.choice((64, 96, 128))
    return {"T": rows(rng, h * d, 16384, 16384 * 32 * 128), "H": h, "D": d}
