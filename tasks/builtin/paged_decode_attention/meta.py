"""paged_decode_attention: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "Paged decode attention with grouped-query heads: each sequence's single new query attends "
    "to its whole KV cache, stored in 16-token blocks scattered through a pool and found through "
    "a block table (vLLM's layout), with varied context lengths in one batch. Memory-bound: the "
    "cached keys and values of every sequence are read once; the work is uneven across sequences."
)

# Llama-3 8B (32/8 heads, D=128) single stream and batched, Llama-3 70B at tensor-parallel 8
# (8/1 heads), Llama-3.2 1B (D=64), Qwen2.5-7B (28/4 heads) at a 32k context.
PUBLIC_SHAPES = [
    {"B": 1, "NQ": 32, "NKV": 8, "D": 128, "BLOCK_SIZE": 16, "MAX_LEN": 4096},
    {"B": 32, "NQ": 32, "NKV": 8, "D": 128, "BLOCK_SIZE": 16, "MAX_LEN": 8192},
    {"B": 64, "NQ": 8, "NKV": 1, "D": 128, "BLOCK_SIZE": 16, "MAX_LEN": 4096},
    {"B": 16, "NQ": 32, "NKV": 8, "D": 64, "BLOCK_SIZE": 16, "MAX_LEN": 2048},
    {"B": 4, "NQ": 28, "NKV": 4, "D": 128, "BLOCK_SIZE": 32, "MAX_LEN": 32768},
]
# A one-token context; Qwen2-1.5B (12/2 heads); Phi-3-mini (multi-head, D=96, not a power of
# two); Qwen2.5-14B (40/8 heads) with a length one past a block; a large batch; a 64k context
# in 8-token blocks. Never shown.
HIDDEN_SHAPES = [
    {"B": 1, "NQ": 4, "NKV": 1, "D": 64, "BLOCK_SIZE": 16, "MAX_LEN": 1},
    {"B": 3, "NQ": 12, "NKV": 2, "D": 128, "BLOCK_SIZE": 16, "MAX_LEN": 100},
    {"B": 7, "NQ": 32, "NKV": 32, "D": 96, "BLOCK_SIZE": 16, "MAX_LEN": 1000},
    {"B": 37, "NQ": 40, "NKV": 8, "D": 128, "BLOCK_SIZE": 32, "MAX_LEN": 4097},
    {"B": 256, "NQ": 32, "NKV": 8, "D": 128, "BLOCK_SIZE": 16, "MAX_LEN": 2048},
    {"B": 2, "NQ": 64, "NKV": 8, "D": 128, "BLOCK_SIZE": 8, "MAX_LEN": 65536},
]
# Small enough for the interpreter: GQA groups of 2, 4 and 3, multi-head, D=48 (masked),
# blocks of 8 and 16 with lengths that end mid-block.
CPU_PUBLIC_SHAPES = [
    {"B": 2, "NQ": 4, "NKV": 2, "D": 32, "BLOCK_SIZE": 8, "MAX_LEN": 40},
    {"B": 3, "NQ": 4, "NKV": 1, "D": 64, "BLOCK_SIZE": 16, "MAX_LEN": 100},
]
CPU_HIDDEN_SHAPES = [
    {"B": 2, "NQ": 3, "NKV": 1, "D": 48, "BLOCK_SIZE": 8, "MAX_LEN": 37},
    {"B": 4, "NQ": 2, "NKV": 2, "D": 32, "BLOCK_SIZE": 16, "MAX_LEN": 64},
]

DISTRIBUTIONS = ("normal", "uniform", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}
# bf16 output: atol 2e-2 instead of 4e-3 (times the output's rms). Production decode kernels
# (FlashAttention, FlashInfer, vLLM's paged attention) round the softmax weights p to bf16 for
# the tensor-core p.v product while keeping scores, max and sum in float32. That rounding errs
# by up to 2^-9 per weight; simulated on these shapes and distributions it needs atol up to
# 1.4e-2 at the default rtol, so 2e-2 leaves margin. It still rejects scores rounded to bf16
# (needs 6e-2 on "normal", 0.46 on "large") and keys/values cast to fp8 (0.2 or more).
TOLERANCES = {"bfloat16": (2e-2, 8e-3)}


def _seq_lens(batch, max_len):
    """The context lengths of a batch: varied, spread over [1, max_len], the first exactly
    max_len. A fixed multiset (a multiplicative hash of the index) whose order make_inputs
    shuffles, so the roofline knows exactly how many tokens are read."""
    return [max_len - (i * 7919) % max_len for i in range(batch)]


def make_inputs(shape, dist, dtype, device, generator):
    b, nq, nkv, d = shape["B"], shape["NQ"], shape["NKV"], shape["D"]
    block_size, max_len = shape["BLOCK_SIZE"], shape["MAX_LEN"]
    max_blocks = -(-max_len // block_size)
    # The pool holds max_blocks blocks per sequence; the blocks past a sequence's length are
    # filled with data like the rest, so reading them changes the answer.
    num_blocks = b * max_blocks
    query = _draw((b, nq, d), dist, device, generator)
    key_cache = _draw((num_blocks, block_size, nkv, d), dist, device, generator)
    value_cache = _draw((num_blocks, block_size, nkv, d), "normal" if dist == "large" else dist, device, generator)
    # A random permutation as a sort of uniform draws: the judge draws a batch's calls
    # at once under vmap, which batches a sort and runs randperm call by call.
    pool = torch.rand(num_blocks, device=device, generator=generator, dtype=torch.float64).argsort()
    block_tables = pool.reshape(b, max_blocks).to(torch.int32)
    lens = torch.tensor(_seq_lens(b, max_len), dtype=torch.int32, device=device)
    order = torch.rand(b, device=device, generator=generator, dtype=torch.float64).argsort()
    return [query.to(dtype), key_cache.to(dtype), value_cache.to(dtype), block_tables, lens[order].contiguous()]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "large":
        # Queries and keys 5x larger: scores have a standard deviation of 25 and maxima near
        # 100, so exp overflows float32 unless the maximum is subtracted, and the softmax is
        # nearly one-hot: a score rounded to bf16 (an error of ~0.2) moves it visibly.
        return 5.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    b, nq, nkv, d = shape["B"], shape["NQ"], shape["NKV"], shape["D"]
    block_size = shape["BLOCK_SIZE"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    lens = _seq_lens(b, shape["MAX_LEN"])
    tokens = sum(lens)
    pages = sum(-(-n // block_size) for n in lens)
    # Only the cached tokens a sequence owns must be read (keys and values once each), plus the
    # query, the output, seq_lens and the block-table entries in use.
    nbytes = 2 * tokens * nkv * d * elem + 2 * b * nq * d * elem + b * 4 + pages * 4
    flops = 4 * nq * d * tokens  # q.k and p.v for every query head and token
    return nbytes, flops


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int

    # NQ is a multiple of NKV (grouped-query attention); head sizes and block sizes are the ones
    # models and vLLM's cache use
    if device == "cpu":
        nkv, d, b = rng.choice((1, 2)), rng.choice((32, 48, 64)), log_int(rng, 1, 4)
        longest = 3 * 112 * 64 // (b * nkv * d) // 16 * 16  # the largest declared cache, whole blocks
        return {"B": b, "NQ": nkv * rng.choice((1, 2, 3)), "NKV": nkv, "D": d,
                "BLOCK_SIZE": rng.choice((8, 16)), "MAX_LEN": log_int(rng, 1, min(100, longest))}
    nkv = rng.choice((1, 2, 4, 8))
    b = log_int(rng, 1, 256)
    return {"B": b, "NQ": nkv * rng.choice((1, 2, 4, 5, 8)), "NKV": nkv, "D": rng.choice((64, 96, 128)),
            "BLOCK_SIZE": rng.choice((8, 16, 32)), "MAX_LEN": log_int(rng, 1, min(65536, 256 * 2048 // b // 32 * 32))}
