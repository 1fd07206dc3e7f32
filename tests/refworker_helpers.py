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
