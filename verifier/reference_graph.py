"""The reference of every call of a timed batch, replayed from one CUDA graph (trusted side only).

A timed batch of a small shape holds hundreds of calls, each on inputs of its own, and every
replay of it is verified call by call against the reference. Run eagerly, the reference's own
launches were the largest step of a verdict on the H200 (6 to 14 s of about 20). The batch's
inputs lie at the same places on every replay (only their values are drawn afresh), so the
reference of all its calls is captured once over those places and replayed for each
verification: the same kernels, on the same bytes.

A graph stands in for the eager reference only where it gives the same answer. It is captured
after an eager call has decided whether the reference runs one step wider (reference.py), it
is checked bit for bit against eager runs of its first and last calls, and there is none (the
eager path runs) when the reference syncs the host (it cannot be captured), when the outputs of
all the calls would hold more than ``GRAPH_BYTES``, for fewer than ``MIN_CALLS`` calls (eager is
cheap enough), or, at a replay, when a call's plain Python arguments differ from those captured.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import integrity, reference

#: device memory a batch's captured reference may hold (its outputs and the copies it makes)
GRAPH_BYTES = 1 << 30
#: fewer calls than this are run eagerly: their launches cost less than a capture
MIN_CALLS = 16

Outputs = tuple[list[torch.Tensor], list[torch.Tensor]]


@dataclass
class ReferenceGraph:
    """One captured reference over a batch's input places; ``outputs[k]`` is call k's (high, low)."""

    graph: Any
    outputs: list[Outputs]
    #: each call's arguments that are not tensors (None where one is), as captured
    values: list[list[Any]]

    def run(self, values: Sequence[Sequence[Any]]) -> list[Outputs] | None:
        """Every call's (high, low) for the inputs now in place; None when the calls' plain
        arguments are not those captured (the eager path must run)."""
        if [list(v) for v in values] != self.values:
            return None
        self.graph.replay()  # on the current stream: what reads the outputs next runs after it
        return self.outputs


def capture(model: Any, calls: Sequence[Sequence[Any]], values: Sequence[Sequence[Any]],
            mutated: Sequence[int]) -> ReferenceGraph | None:
    """The reference of ``calls`` (each call's arguments: views of the batch's input places and
    plain values) captured in one graph, or None where it would not give the eager answer."""
    if len(calls) < MIN_CALLS or not torch.cuda.is_available():
        return None
    # The eager call decides the wider run and warms every kernel up on the stream the capture
    # then uses (cuBLAS and its kin set up per stream, and must not do it mid-capture); a host
    # sync in it rules a graph out.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.no_grad(), torch.cuda.stream(stream), _no_host_sync():
            hi_model, high, low = reference.decide_wider(model, calls[0], mutated)
    except RuntimeError:
        return None
    finally:
        torch.cuda.current_stream().wait_stream(stream)
    inputs = reference.nbytes(calls[0], False)
    per_call = reference.nbytes(low, False) + inputs + (reference.nbytes(high, False) + 2 * inputs if hi_model is not None else 0)
    if per_call * len(calls) > GRAPH_BYTES:
        return None
    graph, outputs = torch.cuda.CUDAGraph(), []
    try:
        with torch.no_grad(), torch.cuda.graph(graph, stream=stream):
            for args in calls:
                outputs.append(reference.run_decided(model, hi_model, args, mutated))
    except (RuntimeError, TypeError):
        with contextlib.suppress(RuntimeError):  # a capture that raised may still allocate to its pool
            torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), graph.pool())
        torch.cuda.synchronize()
        return None
    captured = ReferenceGraph(graph, outputs, [list(v) for v in values])
    if captured.run(values) is None:
        return None
    for k in dict.fromkeys((0, len(calls) - 1)):
        if not _same(outputs[k], reference.run_reference(model, calls[k], mutated)):
            return None
    return captured


def _same(got: Outputs, want: Outputs) -> bool:
    pairs = list(zip(got[0], want[0])) + list(zip(got[1], want[1]))
    if len(got[0]) != len(want[0]) or len(got[1]) != len(want[1]):
        return False
    return all(integrity.bits_equal(a, b) for a, b in pairs)  # NaN where eager has the same NaN


@contextlib.contextmanager
def _no_host_sync():
    """PyTorch's sync debug mode as an error: an op that waits for the device raises."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)
