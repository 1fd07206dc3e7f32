"""The batch's reference from one CUDA graph: it stands in for the eager reference only where it
gives the same answer. The replay rule runs on the CPU with a stand-in graph; the captures
themselves need a GPU (gpu-marked, run on the H200)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape
from kernforge.verifier import reference, reference_graph
from kernforge.verifier import refworker as W

TASK = str(Path(__file__).parent / "tasks" / "tiny_norm")
SHAPE = {"T": 5, "H": 200}


class _Replays:
    def __init__(self):
        self.count = 0

    def replay(self):
        self.count += 1


def test_a_replay_needs_the_captured_plain_arguments():
    graph = _Replays()
    outs = [([torch.ones(2)], [torch.ones(2)])]
    captured = reference_graph.ReferenceGraph(graph, outs, [[None, 1e-6]])
    assert captured.run([[None, 1e-6]]) is outs and graph.count == 1
    assert captured.run([[None, 1e-5]]) is None and graph.count == 1  # another eps: the eager path


def test_no_graph_without_a_gpu_or_for_few_calls():
    model = W._model(TASK, Shape.of(SHAPE), 3, "cpu")
    calls = [[torch.randn(5, 200), torch.ones(200)] for _ in range(reference_graph.MIN_CALLS)]
    assert reference_graph.capture(model, calls, [[None, None]] * len(calls), ()) is None
    assert reference_graph.capture(model, calls[:2], [[None, None]] * 2, ()) is None


# ---- on a GPU ------------------------------------------------------------------------------------
def _batch_calls(n: int, seed: int):
    """``n`` calls of tiny_norm at fixed places (as a batch's pristine bytes), filled for ``seed``."""
    from kernforge.tasks import runtime

    task = load_task(TASK)
    shape = Shape.of(SHAPE)
    places = [runtime.make_inputs(task, shape, "normal", seed + k, "cuda") for k in range(n)]
    return task, shape, places


def _refill(places, task, shape, seed):
    from kernforge.tasks import runtime

    for k, call in enumerate(places):
        for x, y in zip(call, runtime.make_inputs(task, shape, "normal", seed + k, "cuda")):
            x.copy_(y)


@pytest.mark.gpu
def test_the_graph_gives_the_eager_reference_on_every_refill():
    task, shape, places = _batch_calls(40, 100)
    model = W._model(TASK, shape, 3, "cuda")
    values = [[None, None]] * len(places)
    captured = reference_graph.capture(model, places, values, task.mutated_inputs)
    assert captured is not None
    for seed in (100, 500, 900):  # fresh values at the same places, as every timed replay draws
        _refill(places, task, shape, seed)
        got = captured.run(values)
        for k in (0, 17, 39):
            high, low = reference.run_reference(model, places[k], task.mutated_inputs)
            assert torch.equal(got[k][0][0], high[0]) and torch.equal(got[k][1][0], low[0])


@pytest.mark.gpu
def test_a_reference_that_syncs_the_host_gets_no_graph():
    class Syncing(torch.nn.Module):
        def forward(self, x, w):
            return x * float(w.abs().max())  # .item() in disguise: the host waits for the device

    task, shape, places = _batch_calls(20, 1)
    assert reference_graph.capture(Syncing(), places, [[None, None]] * 20, ()) is None
    assert torch.cuda.get_sync_debug_mode() == 0  # left as it was


@pytest.mark.gpu
def test_outputs_too_large_for_the_budget_run_eagerly(monkeypatch):
    monkeypatch.setattr(reference_graph, "GRAPH_BYTES", 1024)
    task, shape, places = _batch_calls(20, 1)
    model = W._model(TASK, shape, 3, "cuda")
    assert reference_graph.capture(model, places, [[None, None]] * 20, ()) is None
