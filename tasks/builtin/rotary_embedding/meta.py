"""rotary_embedding: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "NeoX-style rotary position embedding of query and key: each head's two halves are "
    "rotated by the cos/sin of the token's position, read from a [MAX_POS, D] cache. Runs on "
    "q and k in every attention layer. Memory-bound: read q, k, positions and one cache row "
    "per token, write q and k."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) at real head layouts: Llama-3.2 1B
# (32 q / 8 kv heads, D=64), Llama-3 8B (32 / 8, D=128), Qwen2 7B (28 / 4, D=128); MAX_POS
# from their configs (131072 for Llama-3.x, 32768 for Qwen2) or a serving limit (8192).
PUBLIC_SHAPES = [
    {"T": 1, "NQ": 32, "NK": 8, "D": 64, "MAX_POS": 131072},
    {"T": 64, "NQ": 32, "NK": 8, "D": 128, "MAX_POS": 8192},
    {"T": 4096, "NQ": 28, "NK": 4, "D": 128, "MAX_POS": 32768},
    {"T": 4096, "NQ": 32, "NK": 8, "D": 64, "MAX_POS": 131072},
    {"T": 16384, "NQ": 32, "NK": 8, "D": 128, "MAX_POS": 131072},
]
# Tiny, odd, non-power-of-two and large; never shown. D=96 is Phi-3-mini's head dim,
# 14 / 2 heads Qwen2 0.5B's, 40 / 8 Qwen2.5 14B's, 64 / 8 Llama-3 70B's.
HIDDEN_SHAPES = [
    {"T": 1, "NQ": 8, "NK": 1, "D": 64, "MAX_POS": 2048},
    {"T": 3, "NQ": 40, "NK": 8, "D": 128, "MAX_POS": 4096},
    {"T": 77, "NQ": 32, "NK": 32, "D": 96, "MAX_POS": 4096},
    {"T": 1000, "NQ": 14, "NK": 2, "D": 64, "MAX_POS": 32768},
    {"T": 8191, "NQ": 64, "NK": 8, "D": 128, "MAX_POS": 131072},
]
CPU_PUBLIC_SHAPES = [
    {"T": 1, "NQ": 4, "NK": 2, "D": 64, "MAX_POS": 64},
    {"T": 8, "NQ": 4, "NK": 1, "D": 128, "MAX_POS": 128},
]
CPU_HIDDEN_SHAPES = [
    {"T": 3, "NQ": 3, "NK": 1, "D": 96, "MAX_POS": 50},
    {"T": 13, "NQ": 6, "NK": 2, "D": 64, "MAX_POS": 40},
]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}


def make_inputs(shape, dist, dtype, device, generator):
    t, nq, nk, d, max_pos = shape["T"], shape["NQ"], shape["NK"], shape["D"], shape["MAX_POS"]
    # Distinct positions (as within one sequence), so each token reads its own cache row and
    # the roofline's one row per token is exact.
    # A random permutation as a sort of uniform draws: the judge draws a batch's calls
    # at once under vmap, which batches a sort and runs randperm call by call.
    positions = torch.rand(max_pos, device=device, generator=generator, dtype=torch.float64).argsort()[:t]
    query = _draw((t, nq * d), dist, device, generator)
    key = _draw((t, nk * d), dist, device, generator)
    # A real cos/sin cache, but with a rope base drawn per call between 1e4 (Llama-2) and 1e6
    # (Qwen2): a kernel that recomputes cos/sin from a hard-coded base instead of reading the
    # cache is wrong.
    # (a tensor, not a Python float: the judge draws a batch's calls at once, under vmap)
    base = 10.0 ** (4.0 + 2.0 * torch.rand((), device=device, generator=generator, dtype=torch.float64))
    inv_freq = (1.0 / (base ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))).float()
    angles = torch.arange(max_pos, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return [positions, query.to(dtype), key.to(dtype), cos_sin_cache.to(dtype)]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: the outlier channels real q/k projections have.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        # Large magnitude with a common offset: x1*cos - x2*sin cancels to a small difference
        # of large products, which bf16 intermediates would destroy.
        return 300.0 + 50.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, nq, nk, d = shape["T"], shape["NQ"], shape["NK"], shape["D"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    qk = t * (nq + nk) * d
    # read q and k, write them rotated; read the positions (int64) and one cache row per token
    nbytes = 2 * qk * elem + 8 * t + t * d * elem
    flops = 3 * qk  # two multiplies and an add per output element
    return nbytes, flops


# The production library to beat (verifier/library.py), timed beside eager and torch.compile where
# installed: Liger-Kernel's RoPE, HF Llama's rotate_half, which is the NeoX layout (each head's two
# halves, not interleaved pairs) the reference uses. Liger takes cos and sin per token rather than
# positions and a cache, so the wrapper gathers each token's cache row and passes its halves as
# cos and sin of width D / 2 with rotary_dim = D (Liger's form for cos/sin that are not doubled).
# The rows are cast to float32 first, as the reference casts the cache: the kernel computes in
# cos's dtype, and in bf16 the "large" distribution's x1*cos - x2*sin would cancel to noise. Liger
# rotates q and k in place: the same bytes moved as the task's new tensors (the judge writes every
# input afresh before each timed batch), plus a gather of T cache rows, small beside q and k.
LIBRARY_BASELINE = {"package": "liger-kernel", "call": "liger_rotary_embedding"}


def liger_rotary_embedding(positions, query, key, cos_sin_cache):
    from liger_kernel.ops.rope import LigerRopeFunction

    tokens, head_dim = query.shape[0], cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    # Liger's layout: [batch, heads, tokens, head_dim] views of [batch, tokens, heads, head_dim] memory
    q = query.view(1, tokens, -1, head_dim).transpose(1, 2)
    k = key.view(1, tokens, -1, head_dim).transpose(1, 2)
    q, k = LigerRopeFunction.apply(q, k, cos, sin, None, 1, head_dim)
    return q.transpose(1, 2).reshape(query.shape), k.transpose(1, 2).reshape(key.shape)


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int, rows

    # every token has a distinct position below MAX_POS
    if device == "cpu":
        nq, d = log_int(rng, 1, 6), rng.choice((64, 96, 128))
        nk = log_int(rng, 1, nq)
        t = rows(rng, (nq + nk) * d, 13, 13 * 8 * 64)
        return {"T": t, "NQ": nq, "NK": nk, "D": d, "MAX_POS": 2 * log_int(rng, max(t, 32) // 2 + 1, 128 * 128 // d // 2)}
    nq, d = log_int(rng, 1, 64), rng.choice((64, 96, 128))
    nk = log_int(rng, 1, nq)
    t = rows(rng, (nq + nk) * d, 16384, 16384 * 40 * 128)
    return {"T": t, "NQ": nq, "NK": nk, "D": d, "MAX_POS": rng.choice([p for p in (2048, 4096, 8192, 32768, 131072) if p >= t])}
