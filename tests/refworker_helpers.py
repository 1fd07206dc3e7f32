"""The reference worker run in-process for tests: its state holding one arena, cleared after."""

from __future__ import annotations

import contextlib
from typing import Iterator

from kernforge.verifier import refworker as W
from kernforge.verifier.arena import Arena, Layout


@contextlib.contextmanager
def refworker_arena(size: int, input_bytes: int, device: str = "cpu") -> Iterator[Arena]:
    """An arena of ``size`` bytes (``input_bytes`` of them the input region) that the in-process
    reference worker's requests use; its state starts empty and is cleared, the arena closed, after."""
    W._STATE.clear()
    made = Arena.create(Layout(size, input_bytes), device)
    W._STATE.update(arena=made, calls={}, history={}, batches={}, device=device)
    try:
        yield made
    finally:
        made.close()
        W._STATE.clear()


@contextlib.contextmanager
def gpu_batch(task: object) -> Iterator[tuple[Arena, W._Batch, int]]:
    """A timed batch of ``task`` planned on the GPU at its smallest public shape: 24 calls, fewer
    where they would take more than 2 GiB of inputs (fused_moe's weights: 27 GiB on the H100 beside
    two other test workers), at least three; (the arena, the batch, its calls)."""
    shape = min(task.public_shapes, key=lambda s: sum(v for _, v in s.params))
    sizes = W._sizes("cuda", {"task_ref": task.ref, "shapes": [shape.as_dict()], "init_seed": 3})["sizes"][0]
    calls = max(3, min(24, (2 << 30) // max(sizes["input_bytes"], 1)))
    input_bytes = int((sizes["input_bytes"] + 4096) * calls * 1.1) + (1 << 20)
    heap_bytes = int((sizes["output_bytes"] + 4096) * calls * 1.1) + (1 << 20)
    with refworker_arena(input_bytes + heap_bytes, input_bytes, "cuda") as made:
        W._plan_batch("cuda", {"key": "b", "task_ref": task.ref, "shape": shape.as_dict(), "dist": task.distributions[0],
                               "seeds": list(range(1, calls + 1)), "init_seed": 3})
        yield made, W._STATE["batches"]["b"], calls
