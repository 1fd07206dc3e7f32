"""A task too large for the GPU is said so before any candidate runs (verifier/fits.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernforge.tasks.loader import load_task
from kernforge.verifier import fits
from kernforge.verifier.judge import Judge, JudgeOptions, TaskTooLarge

GIB = 1 << 30
TASKS = Path(__file__).parent / "tasks"


@pytest.mark.parametrize("input_gib, output_gib, memory_gib, fits_there", [
    (6.4, 6.4, 139.8, True),    # KernelBench 19_ReLU at its default size, on an H200
    (6.4, 6.4, 40.0, False),    # ...on a 40 GB card
    (0.5, 0.5, 16.0, True),
    (20.0, 20.0, 139.8, False),
    (30.0, 0.001, 139.8, True),
])
def test_a_task_fits_when_its_largest_call_held_several_times_over_fits(input_gib, output_gib, memory_gib, fits_there):
    sizes = {("a",): {"input_bytes": int(0.001 * GIB), "output_bytes": int(0.001 * GIB)},
             ("b",): {"input_bytes": int(input_gib * GIB), "output_bytes": int(output_gib * GIB)}}
    why = fits.too_large(sizes, {("a",): "N=1", ("b",): "N=2"}, int(memory_gib * GIB))
    assert (why is None) == fits_there
    if why:
        assert why.startswith("task too large for this GPU") and "N=2" in why and f"{memory_gib:.0f} GiB" in why


class _GpuJudge(Judge):
    """A judge on a GPU of ``memory_gib`` whose reference worker says how large each call is."""

    def __init__(self, memory_gib: float, per_call_gib: float):
        self.on_gpu, self.options, self._memory, self._per_call = True, JudgeOptions(), memory_gib, per_call_gib

    def environment(self):
        return {"memory_gib": self._memory}

    def _shape_sizes(self, task, shapes, init_seed):
        n = int(self._per_call * GIB)
        return {s.params: {"input_bytes": n, "output_bytes": n} for s in shapes}


def test_the_judge_refuses_the_task_before_any_candidate_runs():
    task = load_task(TASKS / "tiny_norm")
    _GpuJudge(139.8, 1.0).check_fits(task)  # fits: nothing raised
    with pytest.raises(TaskTooLarge, match="tiny_norm: task too large for this GPU"):
        _GpuJudge(139.8, 30.0).verify("this source is never read", task)
