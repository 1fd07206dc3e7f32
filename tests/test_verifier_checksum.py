"""The checksums the reference worker keeps of every checked call's outputs (to tell a cached or
deferred answer from a wrong one): the same two numbers whether an output is reduced at once or
a piece at a time, and never a reduction over more than a piece, so no float64 copy of a whole
output is made (PyTorch casts a reduction's whole input to float64 first: 12 GiB for a
KernelBench output of 1.6e9 float32 elements on the H100)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernforge.verifier import timing


class _Reductions(TorchDispatchMode):
    """The largest input of any sum or norm dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket in (torch.ops.aten.sum, torch.ops.aten.linalg_vector_norm):
            self.largest = max(self.largest, args[0].numel())
        return func(*args, **(kwargs or {}))


def _whole(out: torch.Tensor) -> list[float]:
    if out.is_floating_point() and out.element_size() >= 2:
        x = out.double()
        return [float(x.sum()), float(x.abs().sum())]
    b = out.contiguous().view(torch.uint8).double()
    return [float(b.sum()), float(b.pow(2).sum())]


@pytest.mark.parametrize("make", [
    lambda: torch.randn(37, 1000),
    lambda: torch.randn(1000, 37).t(),  # strided: pieces by its leading dimension
    lambda: torch.randn(5, 3001).to(torch.bfloat16),
    lambda: torch.randn(40, 700).to(torch.float8_e4m3fn),
    lambda: torch.randint(0, 9, (3, 5000), dtype=torch.int32),
    lambda: torch.randn(7, 11)[:, 3],
], ids=["float32", "strided", "bfloat16", "float8", "int32", "column"])
def test_a_checksum_is_the_whole_outputs_a_piece_at_a_time(monkeypatch, make):
    out = make()
    monkeypatch.setattr(timing, "CHECKSUM_ELEMENTS", 4096)
    with _Reductions() as seen:
        got = [float(v) for v in timing.checksum([out])[0]]
    assert seen.largest <= max(4096, out[0].numel() if out.dim() > 1 else 0), "a reduction over more than a piece"
    assert got == pytest.approx(_whole(out), rel=1e-12)
