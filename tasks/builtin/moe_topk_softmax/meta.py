"""moe_topk_softmax: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "MoE router: softmax of [T, E] float32 gating logits, top-k experts per token sorted by "
    "weight, weights renormalised over the k. Runs once per MoE layer per step, 8 to 256 "
    "experts, k from 2 to 8. Tiny rows: latency- and launch-bound, far from any roofline."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at real router shapes: Mixtral (8
# experts, top-2), Qwen2-MoE 57B (64, top-8), DeepSeek-V2-Lite (64, top-6), Qwen3-MoE (128,
# top-8), DeepSeek-V3's width (256, top-8).
PUBLIC_SHAPES = [
    {"T": 1, "E": 8, "K": 2},
    {"T": 64, "E": 64, "K": 8},
    {"T": 64, "E": 256, "K": 8},
    {"T": 4096, "E": 8, "K": 2},
    {"T": 4096, "E": 128, "K": 8},
    {"T": 16384, "E": 64, "K": 6},
]
# Tiny, odd, non-power-of-two and large; never shown: Qwen1.5-MoE (60 experts, top-4), Phi-3.5
# MoE (16, top-2), Granite MoE (40, top-8), DeepSeek-V2 (160, top-6), k == E, odd k.
HIDDEN_SHAPES = [
    {"T": 1, "E": 60, "K": 4},
    {"T": 3, "E": 16, "K": 2},
    {"T": 5, "E": 8, "K": 8},
    {"T": 77, "E": 40, "K": 8},
    {"T": 1000, "E": 160, "K": 6},
    {"T": 2049, "E": 32, "K": 3},
    {"T": 8191, "E": 256, "K": 8},
]
# Small: the interpreter runs the seed's k selection rounds one program at a time.
CPU_PUBLIC_SHAPES = [{"T": 1, "E": 8, "K": 2}, {"T": 8, "E": 64, "K": 8}]
CPU_HIDDEN_SHAPES = [{"T": 3, "E": 60, "K": 4}, {"T": 9, "E": 40, "K": 3}, {"T": 2, "E": 8, "K": 8}]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
# Router logits in float32 on both devices, as many MoE models route (the gate's logits
# upcast, or the gate run in float32) and as vLLM's topk_softmax computes. In bf16, with 8
# significant bits (steps of 0.125 at |logit| ~ 20), 256 experts' logits cannot all be kept
# apart by more than rounding noise within a realistic range, so two correct kernels could
# pick different experts at a near-tie; see make_inputs.
DTYPES = {"cuda": "float32", "cpu": "float32"}
# The expert ids are integers and must match exactly: a wrong id routes the token to a
# different expert. (Without this entry int32 would get the float32 default.)
TOLERANCES = {"int32": (0.0, 0.0)}

# Smallest distance between two logits of a row. Float32 keeps 24 bits: at |logit| ~ 1100 (the
# "large" offset) one rounding is 6e-5, and exp() differs between kernels by a few ulp, so a
# gap of 0.05 (a probability ratio of 1.05) orders every pair the same in any correct kernel.
_MIN_GAP = 0.05


def make_inputs(shape, dist, dtype, device, generator):
    """Logits with a guaranteed gap between any two experts of a token.

    Top-k is ill-conditioned at near-ties: two experts whose logits differ by rounding noise
    may come out in either order, so a correct kernel could be rejected. Each row is instead a
    random permutation of E well-separated levels: consecutive levels are at least _MIN_GAP
    apart, plus a random share (drawn from ``dist``) of the rest of the row's spread. The spread
    grows with E like real routers' (about 5 for 8 experts, 30 for 256), so the top-k weights
    stay far from float32 underflow.
    """
    t, e = shape["T"], shape["E"]
    spread = 4.0 + 0.1 * e
    slack = spread - (e - 1) * _MIN_GAP
    share_size = (t, max(e - 1, 1))
    if dist == "normal":
        share = torch.randn(share_size, device=device, generator=generator).abs()
    elif dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: a few huge gaps, so one or two experts dominate.
        n = torch.randn(share_size, device=device, generator=generator)
        chi = torch.randn((2, *share_size), device=device, generator=generator).pow(2).sum(0)
        share = (n / torch.sqrt(chi / 2 + 1e-6)).abs()
    else:
        share = torch.rand(share_size, device=device, generator=generator)
    share = share + 1e-6
    gaps = _MIN_GAP + slack * share / share.sum(dim=-1, keepdim=True)
    levels = torch.cat([torch.zeros((t, 1), device=device), gaps.cumsum(dim=-1)], dim=-1)[:, :e]
    levels = levels - spread / 2
    if dist == "large":
        # A large common offset per row: exp(logit) overflows float32 unless the maximum is
        # subtracted first. Float32 at ~1100 still resolves the 0.05 gaps 800-fold.
        offset = 1000.0 + 100.0 * torch.rand((t, 1), device=device, generator=generator)
    else:
        offset = 2.0 * torch.randn((t, 1), device=device, generator=generator)
    # each row's levels in a random order (a gather by a random permutation, which vmap batches:
    # the judge draws a batch's calls at once)
    order = torch.rand((t, e), device=device, generator=generator).argsort(dim=-1)
    logits = (levels + offset).gather(1, order)
    return [logits.to(dtype)]


def roofline(shape, dtype):
    t, e, k = shape["T"], shape["E"], shape["K"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    nbytes = t * e * elem + t * k * (4 + 4)  # read the logits; write float32 weights, int32 ids
    flops = (4 + k) * t * e  # softmax (max, subtract, exp, sum) and k passes of selection
    return nbytes, flops


# No library baseline: Liger-Kernel 0.8.5 has no routing op (its fused MoE takes the top-k ids and
# weights already computed).


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows

    if device == "cpu":
        e = 4 * log_int(rng, 1, 16)  # a multiple of 4, as every declared count of experts is
        return {"T": log_int(rng, 1, 9), "E": e, "K": rng.randint(1, min(8, e))}
    e = 4 * log_int(rng, 1, 64)
    return {"T": rows(rng, e, 16384, 8191 * 256), "E": e, "K": rng.randint(1, min(8, e))}
