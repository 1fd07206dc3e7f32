"""reshape_and_cache: hidden metadata (never shown to the model)."""

import torch

DESCRIPTION = (
    "Write this step's keys and values into the paged KV cache (vLLM's flash layout "
    "[NUM_BLOCKS, BLOCK_SIZE, NKV, D]) at the slots a slot mapping gives; negative slots are "
    "padding and skipped; the rest of the cache is left untouched. In place on both caches. "
    "Every attention layer, every step. Pure data movement: memory-bound, no FLOPs."
)

# Decode (1-64 tokens) and prefill (4096-16384 tokens) with real KV layouts: Llama-3 8B (8 kv
# heads, D=128), Llama-3.2 1B (8, D=64), Qwen2 7B (4, D=128); vLLM's block sizes 16 and 32; caches of a
# few hundred MB as a serving engine holds (far larger than what one step writes).
PUBLIC_SHAPES = [
    {"T": 1, "NKV": 8, "D": 128, "NUM_BLOCKS": 4096, "BLOCK_SIZE": 16},
    {"T": 64, "NKV": 8, "D": 128, "NUM_BLOCKS": 4096, "BLOCK_SIZE": 16},
    {"T": 4096, "NKV": 8, "D": 64, "NUM_BLOCKS": 2048, "BLOCK_SIZE": 16},
    {"T": 4096, "NKV": 4, "D": 128, "NUM_BLOCKS": 1024, "BLOCK_SIZE": 32},
    {"T": 16384, "NKV": 8, "D": 128, "NUM_BLOCKS": 2048, "BLOCK_SIZE": 16},
]
# Tiny, odd, non-power-of-two and large; never shown: MQA (1 kv head), Qwen2 0.5B (2, D=64),
# Phi-3-mini's D=96, Gemma 7B (16 kv heads, D=256), odd block counts, block size 64.
HIDDEN_SHAPES = [
    {"T": 1, "NKV": 1, "D": 128, "NUM_BLOCKS": 100, "BLOCK_SIZE": 16},
    {"T": 3, "NKV": 2, "D": 64, "NUM_BLOCKS": 37, "BLOCK_SIZE": 16},
    {"T": 77, "NKV": 8, "D": 96, "NUM_BLOCKS": 513, "BLOCK_SIZE": 32},
    {"T": 1000, "NKV": 16, "D": 256, "NUM_BLOCKS": 300, "BLOCK_SIZE": 64},
    {"T": 8191, "NKV": 8, "D": 128, "NUM_BLOCKS": 1031, "BLOCK_SIZE": 16},
]
CPU_PUBLIC_SHAPES = [
    {"T": 1, "NKV": 2, "D": 64, "NUM_BLOCKS": 8, "BLOCK_SIZE": 16},
    {"T": 16, "NKV": 4, "D": 64, "NUM_BLOCKS": 8, "BLOCK_SIZE": 16},
]
CPU_HIDDEN_SHAPES = [
    {"T": 3, "NKV": 1, "D": 96, "NUM_BLOCKS": 5, "BLOCK_SIZE": 4},
    {"T": 21, "NKV": 3, "D": 32, "NUM_BLOCKS": 7, "BLOCK_SIZE": 8},
]

DISTRIBUTIONS = ("normal", "uniform", "heavy_tailed", "large")
DTYPES = {"cuda": "bfloat16", "cpu": "float32"}
# Inputs 2 (key_cache) and 3 (value_cache) are written in place; both are compared like outputs.
MUTATED_INPUTS = (2, 3)
# A copy is exact: every correct kernel puts the very bits of key and value into the cache and
# leaves the rest alone, so any difference at all is a wrong slot, a lost write or a lowered
# precision, never rounding.
TOLERANCES = {"bfloat16": (0.0, 0.0), "float32": (0.0, 0.0)}


def make_inputs(shape, dist, dtype, device, generator):
    t, nkv, d = shape["T"], shape["NKV"], shape["D"]
    num_blocks, block_size = shape["NUM_BLOCKS"], shape["BLOCK_SIZE"]
    key = _draw((t, nkv, d), dist, device, generator)
    value = _draw((t, nkv, d), dist, device, generator)
    # The caches start full of other tokens' entries, so a write to a wrong place, or to the
    # whole cache, shows.
    key_cache = _draw((num_blocks, block_size, nkv, d), dist, device, generator)
    value_cache = _draw((num_blocks, block_size, nkv, d), dist, device, generator)
    # Distinct slots anywhere in the cache; exactly T // 8 tokens are padding (slot -1, vLLM's
    # PAD_SLOT_ID), at random places, so the roofline's count of written tokens is exact.
    # A random permutation as a sort of uniform draws: the judge draws a batch's calls
    # at once under vmap, which batches a sort and runs randperm call by call.
    slot_mapping = torch.rand(num_blocks * block_size, device=device, generator=generator, dtype=torch.float64).argsort()[:t]
    padding = torch.rand(t, device=device, generator=generator, dtype=torch.float64).argsort()[: t // 8]
    slot_mapping[padding] = -1
    return [key.to(dtype), value.to(dtype), key_cache.to(dtype), value_cache.to(dtype), slot_mapping]


def _draw(size, dist, device, generator):
    if dist == "uniform":
        return torch.rand(size, device=device, generator=generator) * 2 - 1
    if dist == "heavy_tailed":
        # Student-t with 2 degrees of freedom: the outlier channels real keys have.
        n = torch.randn(size, device=device, generator=generator)
        chi = torch.randn((2, *size), device=device, generator=generator).pow(2).sum(0)
        return n / torch.sqrt(chi / 2 + 1e-6)
    if dist == "large":
        return 300.0 + 50.0 * torch.randn(size, device=device, generator=generator)
    return torch.randn(size, device=device, generator=generator)


def roofline(shape, dtype):
    t, nkv, d = shape["T"], shape["NKV"], shape["D"]
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    written = t - t // 8  # tokens with a real slot (see make_inputs)
    # read the slot mapping; read key and value of the written tokens and write them once
    nbytes = 8 * t + 4 * written * nkv * d * elem
    return nbytes, 0


# The production library to beat (verifier/library.py), timed beside eager and torch.compile where
# installed and where its output agrees with the reference: vLLM's own reshape_and_cache_flash,
# which this task is (in place, a negative slot skipped), with the cache in the inputs' dtype
# ("auto") and unit scales. The scale tensors are made once per device, not in every timed call.
LIBRARY_BASELINE = [{"package": "vllm", "call": "vllm_reshape_and_cache"}]
_UNIT_SCALES = {}


def vllm_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    from vllm import _custom_ops as ops

    scale = _UNIT_SCALES.get(key.device)
    if scale is None:
        scale = _UNIT_SCALES[key.device] = torch.ones((), dtype=torch.float32, device=key.device)
    ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, "auto", scale, scale)


# One hidden shape drawn for each verdict beside the fixed ones (kernforge/tasks/draws.py), within
# the memory of the declared shapes: sizes tiny to large, odd and non-power-of-two among them.
def draw_hidden_shape(rng, device):
    from kernforge.tasks.draws import log_int

    # every token's slot is a distinct one of the cache's NUM_BLOCKS * BLOCK_SIZE
    if device == "cpu":
        nkv, d, bs = log_int(rng, 1, 4), rng.choice((32, 64, 96)), rng.choice((4, 8, 16))
        blocks = 8 * 16 * 4 * 64 // (bs * nkv * d)
        t = log_int(rng, 1, min(21, 16 * 4 * 64 // (nkv * d), blocks * bs))
        return {"T": t, "NKV": nkv, "D": d, "NUM_BLOCKS": log_int(rng, -(-t // bs), min(8, blocks)), "BLOCK_SIZE": bs}
    nkv, d, bs = rng.choice((1, 2, 4, 8, 16)), rng.choice((64, 96, 128, 256)), rng.choice((16, 32, 64))
    blocks = 4096 * 16 * 8 * 128 // (bs * nkv * d)  # at most the largest public cache
    t = log_int(rng, 1, min(16384 * 8 * 128 // (nkv * d), blocks * bs))  # at most the largest public call's tokens
    return {"T": t, "NKV": nkv, "D": d, "NUM_BLOCKS": log_int(rng, -(-t // bs), min(4096, blocks)), "BLOCK_SIZE": bs}
