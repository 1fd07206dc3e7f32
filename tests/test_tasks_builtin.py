"""The built-in serving suite: every task loads, its inputs and reference are sane, and its seed
kernel matches the reference on the public and hidden shapes (interpreter on the CPU; every
task, the GPU-only ones included, on a GPU).

This checks the seeds directly, in-process; the verifier's own tests run them through the full
sandboxed verifier as well.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernforge.tasks import draws, runtime
from kernforge.tasks.loader import builtin_names, load_task
from kernforge.tasks.spec import DISTRIBUTIONS
from kernel_checks import check_kernel
from kernforge.verifier.reference import run_reference

REQUIRED = {
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    "fp8_quant_per_token",
    "fp8_quant_per_group",
    "rms_norm_fp8_quant",
    "softmax",
    "moe_topk_softmax",
    "reshape_and_cache",
    "paged_decode_attention",
    "merge_attn_states",
    "fused_moe",
    "gemm_small_m",
}
NAMES = builtin_names()
INTERPRETABLE = [n for n in NAMES if load_task(n).interpreter_unsupported is None]


def test_the_suite_is_complete():
    assert REQUIRED <= set(NAMES), f"missing built-in tasks: {sorted(REQUIRED - set(NAMES))}"


@pytest.mark.parametrize("name", NAMES)
def test_task_metadata(name):
    task = load_task(name)
    assert task.seed_path is not None, "every built-in task has a seed kernel"
    assert task.dtype("cuda") in ("bfloat16", "float16", "float32")
    assert task.dtype("cpu") == "float32"
    assert set(task.distributions) <= set(DISTRIBUTIONS) and len(task.distributions) >= 2
    assert task.public_shapes and task.hidden_shapes and task.cpu_public_shapes and task.cpu_hidden_shapes
    assert not set(task.hidden_shapes) & set(task.public_shapes), "hidden shapes must not be public"
    for shape in task.public_shapes + task.hidden_shapes:
        line = runtime.roofline(task, shape, task.dtype("cuda"))
        assert line is not None and line.bytes > 0 and line.flops >= 0
    # the source shown to the model says nothing about hidden shapes
    for shape in task.hidden_shapes:
        assert shape.label not in task.reference_source


def _check_not_degenerate(task, device: str, shape) -> None:
    model = runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 0, device)
    singles: dict[int, set[float]] = {}
    for dist in task.distributions:
        inputs = runtime.make_inputs(task, shape, dist, 1234, device)
        _, low = run_reference(model, inputs, task.mutated_inputs)
        for i, out in enumerate(low):
            values = out.double()
            finite = values[torch.isfinite(values)]
            if out.numel() == 1:  # one value (a per-tensor scale of one token): it must move with the inputs
                assert finite.numel() == 1, f"output {i} is not finite under {dist!r}"
                singles.setdefault(i, set()).add(float(finite))
                continue
            assert finite.numel() > 1 and float(finite.std()) > 0, f"output {i} is constant under {dist!r}"
    for i, seen in singles.items():
        assert len(seen) > 1, f"output {i} is the same {seen} under every distribution"


@pytest.mark.parametrize("name", NAMES)
def test_reference_outputs_are_not_degenerate(name):
    """THREATS #2: on every distribution each output varies, so constants cannot pass."""
    task = load_task(name)
    _check_not_degenerate(task, "cpu", task.cpu_public_shapes[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_reference_outputs_are_not_degenerate_on_gpu(name):
    """The same in the GPU dtype (bf16 rounding can make an output constant that fp32 keeps)."""
    task = load_task(name)
    _check_not_degenerate(task, "cuda", min(task.public_shapes, key=lambda s: sum(v for _, v in s.params)))


def _check_seed(task, device: str, shapes) -> None:
    check_kernel(task, device, shapes, task.seed_path)


@pytest.mark.parametrize("name", INTERPRETABLE)
def test_seed_matches_reference_on_cpu(name):
    task = load_task(name)
    _check_seed(task, "cpu", task.cpu_public_shapes + task.cpu_hidden_shapes)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_seed_matches_reference_on_gpu(name):
    task = load_task(name)
    _check_seed(task, "cuda", task.public_shapes + task.hidden_shapes)


#: drawn shapes each seed is checked at (tasks/draws.py), from a generator seeded by the task's
#: name: a verdict draws at random, a test the same shapes every run
DRAWN = {"cpu": 8, "cuda": 12}


@pytest.mark.parametrize("name", INTERPRETABLE)
def test_seed_matches_reference_at_drawn_shapes_on_cpu(name):
    """Every verdict checks a shape drawn for it: a seed wrong at some shape of its task's space
    would be rejected by chance, some nights. Found here, at the same shapes every run."""
    task = load_task(name)
    _check_seed(task, "cpu", list(draws.draw(task, "cpu", DRAWN["cpu"], random.Random(name))))


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_seed_matches_reference_at_drawn_shapes_on_gpu(name):
    task = load_task(name)
    _check_seed(task, "cuda", list(draws.draw(task, "cuda", DRAWN["cuda"], random.Random(name))))
