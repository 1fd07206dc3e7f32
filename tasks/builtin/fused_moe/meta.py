"""fused_moe: hidden metadata (never shown to the model)."""

import math

import torch

DESCRIPTION = (
    "Fused mixture-of-experts MLP for a given top-k routing: every token runs its chosen SwiGLU "
    "experts (gate/up projection, silu(gate)*up, down projection) and sums them weighted by the "
    "router, from Mixtral's 8 experts (top-2) to DeepSeek-V3's 256 (top-8). Decode is bound by "
    "reading the chosen experts' weights; prefill by the grouped GEMMs."
)

# Mixtral 8x7B (E=8, top-2, I=14336) decode and prefill; Qwen3-30B-A3B (E=128, top-8, I=768)
# decode and prefill; DeepSeek-V3 at tensor-parallel 8 (E=256, top-8, I=2048/8=256) decode.
PUBLIC_SHAPES = [
    {"T": 1, "H": 4096, "I": 14336, "E": 8, "TOPK": 2},
    {"T": 4096, "H": 4096, "I": 14336, "E": 8, "TOPK": 2},
    {"T": 64, "H": 2048, "I": 768, "E": 128, "TOPK": 8},
    {"T": 8192, "H": 2048, "I": 768, "E": 128, "TOPK": 8},
    {"T": 32, "H": 7168, "I": 256, "E": 256, "TOPK": 8},
]
# Tiny with odd sizes; Qwen1.5-MoE-A2.7B (E=60 and I=1408, not powers of two, top-4); Qwen2-57B-
# A14B (E=64, top-8, I=2560, H=3584); a single DeepSeek token; DeepSeek-V3 TP8 prefill. Never
# shown. Each keeps its weights (bf16) under 3.6 GB so the test's copies fit easily.
HIDDEN_SHAPES = [
    {"T": 3, "H": 1000, "I": 200, "E": 8, "TOPK": 2},
    {"T": 77, "H": 2048, "I": 1408, "E": 60, "TOPK": 4},
    {"T": 1000, "H": 3584, "I": 2560, "E": 64, "TOPK": 8},
    {"T": 1, "H": 7168, "I": 256, "E": 256, "TOPK": 8},
    {"T": 8192, "H": 7168, "I": 256, "E": 256, "TOPK": 8},
]
# Small enough for the interpreter; odd H and I exercise the masks, E=6 and 12 the routing.
CPU_PUBLIC_SHAPES = [
    {"T": 1, "H": 64, "I": 32, "E": 4, "TOPK": 2},
    {"T": 16, "H": 128, "I": 64, "E": 8, "TOPK": 2},
]
CPU_HIDDEN_SHAPES = [
    {"T": 5, "H": 72, "I": 40, "E": 6, "TOPK": 3},
    {"T": 24, "H": 96, "I": 48, "E": 12, "TOPK": 4},
]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}
# bf16 output: atol 6e-2 instead of 4e-3 (times the output's rms). Serving stacks' fused MoE
# (vLLM's and SGLang's Triton kernels) store the gate/up projections, the SwiGLU activation
# and each expert's weighted output in bf16 and sum the top-k in bf16: tensor-core GEMMs need
# bf16 operands between the two projections. Simulated on these shapes and distributions that
# pipeline needs atol up to 3.7e-2 at the default rtol (bf16 activation alone: 1.0e-2; gate/up
# and activation in bf16 with a float32 sum: 1.8e-2), so 6e-2 leaves margin for larger
# outputs. It still rejects a gate/up reduction over H rounded to bf16 every 64 terms (needs
# 0.11 to 0.14) and fp8 weights with per-row scales (needs 0.24 or more).
TOLERANCES = {"bfloat16": (6e-2, 8e-3)}


def make_inputs(shape, dist, dtype, device, generator):
    t, h, inter, e, k = shape["T"], shape["H"], shape["I"], shape["E"], shape["TOPK"]
    hidden = _draw((t, h), dist, device, generator)
    # Weights scaled like a trained layer's: unit-variance gate/up for unit-variance inputs.
    # (In place, so the float32 draw of a 2 GB weight is not held twice.)
    w1 = torch.randn((e, 2 * inter, h), device=device, generator=generator).div_(math.sqrt(h)).to(dtype)
    w2 = torch.randn((e, h, inter), device=device, generator=generator).div_(math.sqrt(inter)).to(dtype)
    topk_ids = _route(t, e, k, dist == "heavy_tailed", device, generator)
    # Mixtral/Qwen-style: a softmax over the chosen experts' logits.
    topk_weights = torch.randn((t, k), device=device, generator=generator).softmax(dim=-1)
    return [hidden.to(dtype), w1, w2, topk_weights, topk_ids]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: a few channels dominate each token's gate and up
        # projections. Each token is then scaled to unit RMS, as the RMSNorm before every MoE
        # block leaves it, so no single token dwarfs the rest of the batch.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        x = n / torch.sqrt(chi / 2 + 1e-6)
        return x / x.pow(2).mean(dim=-1, keepdim=True).sqrt()
    return torch.randn(size, device=device, generator=generator)


def _route(tokens, experts, top_k, skewed, device, generator):
    """topk_ids [tokens, top_k] int32, distinct experts per token, touching exactly
    min(experts, tokens * top_k) experts (so the roofline knows which weights must be read).

    Tokens draw experts without replacement (Gumbel top-k) with uniform popularity, or Zipf-like
    when ``skewed`` (a few hot experts get most tokens and the rest only a few, as real routers
    do). Then ceil(experts / top_k) randomly chosen tokens are overwritten to cover every expert.
    """
    popularity = torch.ones(experts, device=device)
    if skewed:
        # A random permutation as a sort of uniform draws: the judge draws a batch's calls
        # at once under vmap, which batches a sort and runs randperm call by call.
        ranks = torch.rand(experts, device=device, generator=generator, dtype=torch.float64).argsort()
        popularity = 1.0 / (ranks.float() + 1.0) ** 1.2
    gumbel = -torch.log(-torch.log(torch.rand((tokens, experts), device=device, generator=generator).clamp(1e-12, 1 - 1e-7)))
    ids = (popularity.log() + gumbel).topk(top_k, dim=-1).indices
    covering = min(tokens, -(-experts // top_k))
    which = torch.rand(tokens, device=device, generator=generator, dtype=torch.float64).argsort()[:covering]
    order = torch.rand(experts, device=device, generator=generator, dtype=torch.float64).argsort()
    slots = torch.arange(covering * top_k, device=device).reshape(covering, top_k) % experts
    ids[which] = order[slots]
    return ids.to(torch.int32)


def roofline(shape, dtype):
    t, h, inter, e, k = shape["T"], shape["H"], shape["I"], shape["E"], shape["TOPK"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    touched = min(e, t * k)  # exactly the experts make_inputs routes to
    # read the hidden states, the routing and each touched expert's three matrices once; write
    # the output once. The intermediate activations need not leave the chip.
    nbytes = 2 * t * h * elem + t * k * 8 + touched * 3 * inter * h * elem
    flops = 2 * t * k * 3 * h * inter  # gate, up and down projections per (token, expert)
    return nbytes, flops


# No library baseline (verifier/library.py), though one exists: Liger-Kernel 0.8.5's
# LigerFusedMoEFunction computes this op (w13 with the gate rows first, SwiGLU, the top-k weighted
# sum; bf16 intermediates, which the tolerance above allows) and equals the reference on the CPU
# shapes (under the Triton interpreter, one config). The judge cannot time it as it times the
# others: each call reads the routing's tile count on the host (.item()), so no CUDA graph can hold
# it, and its first call at every (H, I) autotunes 32 configs of each GEMM and 40 of the gather,
# about a hundred Triton compiles per shape inside the reference worker (only
# LIGER_FUSED_MOE_AUTOTUNE=0, read when Liger is imported, turns that off).


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, size

    if device == "cpu":
        e, h = rng.choice((2, 4, 6, 8, 12)), size(rng, 16, 128, 8, align=8)
        return {"T": log_int(rng, 1, 16 * 128 // h), "H": h, "I": size(rng, 16, min(64, 12 * 48 * 96 // (e * h)), 8, align=8), "E": e,
                "TOPK": rng.randint(1, min(4, e))}
    e = rng.choice((8, 16, 32, 60, 64, 128, 256))
    h = size(rng, 64, 7168, 128, align=8)
    i = size(rng, 32, min(14336, 8 * 14336 * 4096 // (e * h)), 128, align=8)
    return {"T": log_int(rng, 1, 8192), "H": h, "I": i, "E": e, "TOPK": rng.randint(1, min(8, e))}
