"""The reference worker's batch bookkeeping, run directly on the CPU: the same code a GPU batch
uses to lay out fresh inputs, read every call's outputs where they lie and find the first wrong
call, the probe's positions, and the inputs' integrity (only the clock itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape
from kernforge.verifier import refworker as W
from kernforge.verifier.arena import Arena, Layout, Slots
from kernforge.verifier.messages import TensorRef

TASK = str(Path(__file__).parent / "tasks" / "tiny_norm")
SHAPE = {"T": 5, "H": 200}


@pytest.fixture
def batch():
    W._STATE.clear()
    arena = Arena.create(Layout(8 << 20, 4 << 20), "cpu")
    W._STATE.update(arena=arena, calls={}, history={}, batches={})
    planned = W._plan_batch("cpu", {"key": "b", "task_ref": TASK, "shape": SHAPE, "dist": "normal",
                                    "seeds": [11, 12, 13, 14, 15, 16], "init_seed": 3})
    b = W._STATE["batches"]["b"]
    b.region.copy_(b.pristine)  # what the trusted write does inside the window
    # an honest candidate: each call's output, computed from that call's inputs, in the heap
    heap = Slots(arena.layout.input_bytes, arena.layout.size)
    task = load_task(TASK)
    model = W._model(TASK, Shape.of(SHAPE), 3, "cpu")
    outputs = []
    for args in planned["sets"]:
        inputs = [arena.view(TensorRef(**a["ref"])) for a in args]
        y = model(*inputs)
        outputs.append([arena.place(heap, y)])
    b.outputs = outputs
    yield arena, b, task
    arena.close()
    W._STATE.clear()


def verify(task):
    return W._verify_batch("cpu", {"key": "b", "tolerances": task.tolerance_table()})


def test_fresh_inputs_per_call_in_one_region(batch):
    arena, b, _ = batch
    offsets = [TensorRef(**s[0]["ref"]).offset for s in b.sets]
    assert len(set(offsets)) == len(offsets) and max(offsets) < arena.layout.input_bytes
    firsts = [b.pristine[o: o + 8].clone() for o in offsets]
    assert all(not torch.equal(firsts[0], f) for f in firsts[1:]), "every call has inputs of its own"


def test_an_honest_batch_verifies(batch):
    *_, task = batch
    got = verify(task)
    assert got["failed_call"] == -1 and got["mutated_inputs"] == [] and got["incomplete_calls"] == []
    assert got["max_abs_err"] < 1e-3


def test_the_first_wrong_call_is_found_and_explained(batch):
    arena, b, task = batch
    arena.view(b.outputs[3][0])[2, 7] += 1.0
    arena.view(b.outputs[5][0]).zero_()
    got = verify(task)
    assert got["failed_call"] == 3
    assert got["results"][0]["ok"] is False and got["results"][0]["details"]["bad"] == 1


def test_a_call_computed_from_bf16_inputs_is_named_on_evidence(batch):
    """The first wrong call of a batch is explained in full: its output is the reference run on
    bf16-rounded activations, so #15 is named, with the lowered run that explains it."""
    arena, b, task = batch
    x, w = W._call_inputs(b, 3)
    model = W._model(TASK, Shape.of(SHAPE), 3, "cpu")
    arena.view(b.outputs[3][0]).copy_(model(x.to(torch.bfloat16).float(), w))
    got = verify(task)
    details = got["results"][0]["details"]
    assert got["failed_call"] == 3 and details["lowered_precision"] == "bf16", details
    assert details["lowered_evidence"]["lowering"] == "input 0 rounded to bf16, to nearest"
    assert torch.equal(W._call_inputs(b, 3)[0], x), "the pristine inputs are left as they were"


def test_a_written_input_is_caught(batch):
    arena, b, task = batch
    arena.view(TensorRef(**b.sets[2][0]["ref"]))[0, 0] = 123.0
    assert verify(task)["mutated_inputs"] == [0]


def test_probe_positions_cover_every_call_and_find_late_changes(batch):
    arena, b, task = batch
    b.probe_index = W._probe_index(b.outputs, arena.data.device)
    b.probe = arena.data[b.probe_index]
    assert int(b.probe_index.max()) < arena.layout.size
    arena.view(b.outputs[4][0]).add_(1.0)  # written after the probe read it: still running at "done"
    assert verify(task)["incomplete_calls"] == [4]


# ---- the baselines' batch ------------------------------------------------------------------------
def test_baseline_layout_draws_every_call_fresh_into_one_region():
    task = load_task(TASK)
    shape = Shape.of(SHAPE)
    from kernforge.tasks import runtime

    first = runtime.make_inputs(task, shape, "normal", 21, "cpu")
    region, pristine, views = W._baseline_layout(task, shape, "normal", [21, 22, 23], "cpu", first)
    assert len(views) == 3 and region.numel() == pristine.numel()
    region.copy_(pristine)  # the trusted write
    for seed, call in zip([21, 22, 23], views):
        for got, want in zip(call, runtime.make_inputs(task, shape, "normal", seed, "cpu")):
            assert torch.equal(got, want)
    pointers = [t.data_ptr() for call in views for t in call]
    assert len(set(pointers)) == len(pointers)  # no two calls share an input


def test_baseline_calls_shrink_to_the_free_memory(monkeypatch):
    """A call of a few GB: the baselines time as many calls as fit beside the arena, at least one."""
    from kernforge.tasks import runtime

    task = load_task(TASK)
    shape = Shape.of(SHAPE)
    model = W._model(TASK, shape, 3, "cpu")
    per_call = 3 * 5 * 200 * 4 + 2 * 200 * 4  # x twice (region and pristine), the output, the weight twice
    drawing = 2 * (5 * 200 * 4 + 200 * 4)  # the next call's inputs drawn while the first's are held
    reserve = W.BASELINE_RESERVE + drawing
    for free, want in ((reserve + 10 * per_call, 6), (reserve + 2 * per_call + 1, 2), (reserve + 2 * per_call - 1, 1), (0, 1)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 1 << 40))
        inputs = runtime.make_inputs(task, shape, "normal", 1, "cpu")
        assert W._baseline_calls(model, inputs, task.mutated_inputs, 6, "cpu") == want


@pytest.mark.parametrize("keep", [W.DRAWN_KEEP_BYTES, 0], ids=["drawn_once", "drawn_again"])
def test_pristine_bytes_are_each_seeds_inputs(monkeypatch, keep):
    """The layout's own draw fills the pristine bytes of a small batch; a large one draws again:
    either way each call's bytes are exactly its seed's inputs."""
    from kernforge.tasks import runtime

    monkeypatch.setattr(W, "DRAWN_KEEP_BYTES", keep)
    W._STATE.clear()
    arena = Arena.create(Layout(8 << 20, 4 << 20), "cpu")
    W._STATE.update(arena=arena, calls={}, history={}, batches={})
    try:
        seeds = [31, 32, 33]
        planned = W._plan_batch("cpu", {"key": "p", "task_ref": TASK, "shape": SHAPE, "dist": "normal",
                                        "seeds": seeds, "init_seed": 3})
        b = W._STATE["batches"]["p"]
        task = load_task(TASK)
        for seed, args in zip(seeds, planned["sets"]):
            for a, want in zip(args, runtime.make_inputs(task, Shape.of(SHAPE), "normal", seed, "cpu")):
                assert torch.equal(W._pristine_view(b, a), want)
    finally:
        arena.close()
        W._STATE.clear()


def test_a_new_batch_leaves_valid_inputs_where_its_calls_are_captured():
    """The candidate warms up on the batch's places before capturing them: a new plan writes
    its own draw there (an index input must hold valid indices, not an earlier layout's bytes);
    a plan again before a window draws fresh inputs and leaves the arena to the trusted write."""
    W._STATE.clear()
    arena = Arena.create(Layout(8 << 20, 4 << 20), "cpu")
    W._STATE.update(arena=arena, calls={}, history={}, batches={})
    try:
        arena.data[: 1 << 20].fill_(0xFF)  # what an earlier layout left: NaNs, or an index far out of range
        msg = {"key": "v", "task_ref": TASK, "shape": SHAPE, "dist": "normal", "seeds": [41, 42], "init_seed": 3}
        W._plan_batch("cpu", msg)
        b = W._STATE["batches"]["v"]
        assert torch.equal(b.region, b.pristine)
        captured = b.region.clone()
        W._plan_batch("cpu", {**msg, "seeds": [43, 44]})
        assert torch.equal(b.region, captured), "the arena is written only inside the timed window"
        assert not torch.equal(b.pristine, captured), "every window gets inputs of its own"
    finally:
        arena.close()
        W._STATE.clear()


class _Channel:
    """The judge's end of the reference worker's channel, as far as ``arena`` uses it."""

    def __init__(self):
        self.sent = []

    def send_fds(self, fds, tag):
        import os

        self.sent.append((tag, os.fstat(fds[0]).st_size))


def test_a_verdict_leaves_no_model_behind():
    """Every verdict draws its own weights, so the models it built go when it is forgotten: a night
    of large-weight tasks (8192x8192 linears) must not fill the GPU one verdict at a time."""
    W._STATE.clear()
    W._STATE.update(calls={}, history={}, batches={})
    for init_seed in (3, 4):
        W._model(TASK, Shape.of(SHAPE), init_seed, "cpu")
    assert len(W._MODELS) == 2
    W._forget("cpu", {})
    assert W._MODELS == {}


def test_an_arena_far_larger_than_asked_for_is_made_again(monkeypatch):
    """A large task's arena is kept for a slightly smaller one (no churn), but not for a task that
    needs a fraction of it: the bytes it would hold back are the next batch's room."""
    monkeypatch.setattr(W, "ARENA_SLACK_BYTES", 1 << 20)
    W._STATE.clear()
    W._STATE.update(channel=_Channel())
    try:
        sizes = []
        for size in (16 << 20, 12 << 20, 4 << 20, 6 << 20):
            got = W._arena("cpu", {"size": size, "input_bytes": size // 2})
            sizes.append(got["size"])
        assert sizes[0] >= 16 << 20
        assert sizes[1] == sizes[0], "a somewhat smaller verdict keeps the arena"
        assert 4 << 20 <= sizes[2] < 8 << 20, "a far smaller one gets an arena of its own size"
        assert sizes[3] >= 6 << 20
    finally:
        arena = W._STATE.get("arena")
        if arena is not None:
            arena.close()
        W._STATE.clear()
