"""The built-in references are the baselines every speedup is a ratio over, so each must be the
plain PyTorch a serving engineer would write: no host sync (``.item()``, ``.tolist()``,
``nonzero``, boolean-mask indexing, a Python loop over tensor values). A reference run on fake
tensors (no data) fails exactly where it would need a value on the host. The references that
were rewritten to avoid a sync give what their old formulation gave, on every CPU shape and
input distribution."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from kernforge.tasks import runtime
from kernforge.tasks.loader import builtin_names, load_task

#: fused_moe groups tokens by expert (``unique().tolist()``, ``nonzero``): the sync-free plain
#: PyTorch formulations run every token through every expert (E / TOPK times the FLOPs, 32x at
#: E=256) or need a grouped GEMM that is not plain PyTorch on every device. Kept, and said.
SYNCS = {"fused_moe": "groups tokens by expert on the host"}


def _run_fake(fn, inputs):
    with FakeTensorMode() as mode:
        return fn(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs])


def _model(name: str, shape):
    task = load_task(name)
    return runtime.reference_module(task).Model(*runtime.make_init_inputs(task, shape))


@pytest.mark.parametrize("name", builtin_names())
def test_a_reference_needs_no_value_on_the_host(name):
    task = load_task(name)
    if name in SYNCS:
        pytest.xfail(SYNCS[name])
    for shape in task.cpu_public_shapes + task.cpu_hidden_shapes:
        _run_fake(_model(name, shape), runtime.sample_inputs(task, shape, "float32"))


# ---- the old formulations, kept here to compare against ---------------------------------------
def old_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    key_rows = key_cache.view(-1, key_cache.shape[2], key_cache.shape[3])
    value_rows = value_cache.view(-1, value_cache.shape[2], value_cache.shape[3])
    key_rows[slots] = key[valid].to(key_cache.dtype)
    value_rows[slots] = value[valid].to(value_cache.dtype)


def old_paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens):
    batch, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5
    out = torch.empty((batch, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
    for b, length in enumerate(seq_lens.tolist()):
        blocks = block_tables[b, : (length + block_size - 1) // block_size].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float()
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float()
        q = query[b].float().reshape(num_kv_heads, group, head_dim)
        scores = torch.einsum("hgd,lhd->hgl", q, k) * scale
        scores = scores - scores.amax(dim=-1, keepdim=True)
        p = scores.exp()
        p = p / p.sum(dim=-1, keepdim=True)
        out[b] = torch.einsum("hgl,lhd->hgd", p, v).reshape(num_q_heads, head_dim)
    return out.to(query.dtype)


@pytest.mark.parametrize("old", [old_reshape_and_cache, old_paged_decode_attention])
def test_the_old_formulations_needed_the_host(old):
    """The fake-tensor run above does catch a sync: the formulations replaced fail it."""
    name = old.__name__.removeprefix("old_")
    task = load_task(name)
    shape = task.cpu_public_shapes[-1]
    with pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
        _run_fake(old, runtime.make_inputs(task, shape, task.distributions[0], 0, "cpu"))


def _cases(name):
    task = load_task(name)
    for shape in task.cpu_public_shapes + task.cpu_hidden_shapes:
        for dist in task.distributions:
            for seed in (0, 1, 2):
                yield task, shape, dist, seed


def test_reshape_and_cache_writes_exactly_what_the_masked_form_wrote():
    n = 0
    for task, shape, dist, seed in _cases("reshape_and_cache"):
        inputs = runtime.make_inputs(task, shape, dist, seed, "cpu")
        old = [x.clone() for x in inputs]
        assert _model("reshape_and_cache", shape)(*inputs) is None
        old_reshape_and_cache(*old)
        for i in (2, 3):  # the caches, bit for bit
            assert torch.equal(inputs[i], old[i]), (shape.label, dist, seed, i)
        n += (inputs[4] < 0).any().item()
    assert n > 0  # padding slots were among the cases


@pytest.mark.parametrize("slots", [[-1, -1, -1], [-1, 7, -1], [3, -1, 0], [5, 6, 1]])
def test_reshape_and_cache_padding_anywhere(slots):
    """All padding, padding before the first real token, none: the rest of the cache untouched."""
    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(3, 2, 4, generator=gen), torch.randn(3, 2, 4, generator=gen)
    caches = [torch.randn(2, 4, 2, 4, generator=gen) for _ in range(2)]
    new = [key, value, *[c.clone() for c in caches], torch.tensor(slots)]
    old = [key, value, *[c.clone() for c in caches], torch.tensor(slots)]
    _model("reshape_and_cache", load_task("reshape_and_cache").cpu_public_shapes[0])(*new)
    old_reshape_and_cache(*old)
    assert torch.equal(new[2], old[2]) and torch.equal(new[3], old[3])


def test_paged_decode_attention_matches_the_per_sequence_loop():
    for task, shape, dist, seed in _cases("paged_decode_attention"):
        inputs = runtime.make_inputs(task, shape, dist, seed, "cpu")
        got = _model("paged_decode_attention", shape)(*inputs)
        want = old_paged_decode_attention(*inputs)
        # float32 throughout; only the order of the sums differs (masked tokens add exact zeros)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{shape.label} {dist} {seed}: {m}")
