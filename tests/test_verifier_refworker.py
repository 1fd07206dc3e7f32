"""The reference worker's batch bookkeeping, run directly on the CPU: the same code a GPU batch
uses to lay out fresh inputs, read every call's outputs where they lie and find the first wrong
call, the probe's positions, and the inputs' integrity (only the clock itself needs a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape
from kernforge.verifier import refworker as W
from kernforge.verifier.arena import Arena, Slots
from kernforge.verifier.messages import TensorRef
from refworker_helpers import refworker_arena  # noqa: E402

TASK = str(Path(__file__).parent / "tasks" / "tiny_norm")
SHAPE = {"T": 5, "H": 200}


@pytest.fixture
def batch():
    with refworker_arena(8 << 20, 4 << 20) as arena:
        yield _honest_batch(arena)


def _honest_batch(arena: Arena) -> tuple[Arena, Any, Any]:
    """A planned batch of six calls, each call's output computed honestly in the heap."""
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
    return arena, b, task


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


def test_outputs_placed_elsewhere_are_read_where_they_now_lie(batch):
    """The views of a batch's outputs are kept from window to window while its calls leave them
    in the same places (a captured batch's do). A window whose calls leave them elsewhere is read
    there: views kept from the last window would compare its right answers, not these."""
    arena, b, task = batch
    assert verify(task)["failed_call"] == -1  # the views of these places are made and kept
    heap = Slots(arena.layout.input_bytes + (2 << 20), arena.layout.size)
    moved = [[arena.place(heap, arena.view(r)) for r in call] for call in b.outputs]
    arena.view(moved[2][0]).zero_()  # the new place of call 2's output is wrong; its old place still right
    W._place_outputs(b, moved)
    assert verify(task)["failed_call"] == 2
    W._place_outputs(b, [list(call) for call in moved])  # the same places again: the views are kept
    kept = b.out_views
    assert kept is not None and verify(task)["failed_call"] == 2 and b.out_views is kept


@pytest.mark.parametrize("chunk_bytes", [None, W.CHUNK_BYTES, 1], ids=["stacked reference", "one chunk", "a chunk per call"])
def test_the_first_wrong_call_is_found_and_explained(batch, monkeypatch, chunk_bytes):
    """Run over every call at once (reference_batched.py), or call by call compared in chunks."""
    arena, b, task = batch
    if chunk_bytes is not None:
        b.ref_stacked = False  # the calls' reference one at a time
        monkeypatch.setattr(W, "CHUNK_BYTES", chunk_bytes)
    arena.view(b.outputs[3][0])[2, 7] += 1.0
    arena.view(b.outputs[5][0]).zero_()
    got = verify(task)
    assert got["failed_call"] == 3
    assert got["results"][0]["ok"] is False and got["results"][0]["details"]["bad"] == 1
    arena.view(b.outputs[3][0])[2, 7] -= 1.0
    assert verify(task)["failed_call"] == 5, "a later chunk's failure is found too"


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
    b.probe_index = W._draw_probe(b, arena.data.device)
    b.probe = arena.data[b.probe_index]
    assert int(b.probe_index.max()) < arena.layout.size
    arena.view(b.outputs[4][0]).add_(1.0)  # written after the probe read it: still running at "done"
    assert verify(task)["incomplete_calls"] == [4]


def test_a_captured_batchs_output_places_are_kept_from_its_first_window(batch):
    """A captured batch's outputs' places come with its first window and are kept for the next
    ones (its graph writes where it was captured); an eager batch's empty list still clears them
    until its probe says where they went; a first window with no places is refused, never a
    window whose outputs no verification would read."""
    arena, b, task = batch
    sent = [[r.to_dict() for r in call] for call in b.outputs]
    b.outputs = []
    with pytest.raises(ValueError, match="outputs' places"):
        W._placed_outputs(b, {"key": "b"})
    W._placed_outputs(b, {"key": "b", "outputs": sent})
    views = W._output_views(b, arena)
    W._placed_outputs(b, {"key": "b"})  # a later window: the places and their views kept
    assert [[r.to_dict() for r in call] for call in b.outputs] == sent and W._output_views(b, arena) is views
    assert verify(task)["failed_call"] == -1
    W._placed_outputs(b, {"key": "b", "outputs": []})  # an eager window: nothing until its probe
    assert b.outputs == [] and b.probe_plan is None


def test_the_probe_holds_every_outputs_elements_whole_in_call_order():
    """Outputs of several layouts, dtypes and an empty one: each output's probed bytes follow the
    last one's in call order, lie inside its own span and are whole elements; each window draws
    its positions afresh over the plan made once for the places."""
    refs, at = [], 1 << 12
    for k in range(7):
        call = [TensorRef(offset=at, dtype="bfloat16", shape=[3, 40], strides=[40, 1]),
                TensorRef(offset=at + 512, dtype="float32", shape=[0], strides=[1]),
                TensorRef(offset=at + 1024, dtype="float32", shape=[2, 5], strides=[1, 2])]
        refs.append(call)
        at += 4096
    plan = W._probe_plan(refs)
    first, second = W._probe_draw(plan, "cpu"), W._probe_draw(plan, "cpu")
    assert not torch.equal(first, second), "fresh positions every window"
    for index in (first, second, W._probe_draw(W._probe_plan(refs), "cpu")):
        at = 0
        for call in refs:
            for r in call:
                if not r.numel:
                    continue
                width = min(W.PROBE_ELEMENTS, r.numel) * r.itemsize
                got = index[at: at + width].view(-1, r.itemsize)
                at += width
                assert bool(((got - got[:, :1]) == torch.arange(r.itemsize)).all()), "each element's bytes whole"
                assert bool(((got[:, 0] - r.offset) % r.itemsize == 0).all())
                assert r.offset <= int(got.min()) and int(got.max()) < r.offset + r.span
        assert at == index.numel()
    assert W._probe_plan([[TensorRef(offset=0, dtype="float32", shape=[0], strides=[1])]]) is None


# ---- the baselines' batch ------------------------------------------------------------------------
def test_baseline_layout_draws_every_call_fresh_into_its_regions():
    task = load_task(TASK)
    shape = Shape.of(SHAPE)
    from kernforge.tasks import runtime

    first = runtime.make_inputs(task, shape, "normal", 21, "cpu")
    layout = W._baseline_layout(task, shape, "normal", [21, 22, 23], "cpu", first)
    assert len(layout.calls) == 3
    assert [r.numel() for r in layout.regions] == [p.numel() for p in layout.pristine]
    layout.write()  # the trusted write
    for seed, call in zip([21, 22, 23], layout.calls):
        for got, want in zip(call, runtime.make_inputs(task, shape, "normal", seed, "cpu")):
            assert torch.equal(got, want)
    pointers = [t.data_ptr() for call in layout.calls for t in call]
    assert len(set(pointers)) == len(pointers)  # no two calls share an input


# ---- torch.compile's baseline, compiled ahead of its timing --------------------------------------
def compile_msg(shape=SHAPE, init_seed=3):
    return {"task_ref": TASK, "shape": shape, "dist": "normal", "seeds": [31], "init_seed": init_seed}


@pytest.fixture
def fresh_worker():
    W._STATE.clear()
    W._STATE.update(calls={}, history={}, batches={})
    yield
    W._STATE.clear()
    W._MODELS.clear()
    torch._dynamo.reset()


def test_a_compile_asked_ahead_is_the_one_its_baseline_times(fresh_worker):
    """The judge asks for the compile while it holds the GPU shared; the baseline that follows, under
    the exclusive hold, times that compiled module rather than compiling again."""
    from kernforge.tasks import runtime

    got = W._compile_baseline("cpu", compile_msg())
    assert got["error"] is None and got["seconds"] > 0
    ahead = W._STATE["compiled"]
    model = W._model(TASK, Shape.of(SHAPE), 3, "cpu")
    used = W._compiled_for(compile_msg(), model, "cpu")
    assert used is ahead and "compiled" not in W._STATE, "used once, then gone"
    x = runtime.make_inputs(load_task(TASK), Shape.of(SHAPE), "normal", 7, "cpu")
    torch.testing.assert_close(used.fn(*x), model(*x))


@pytest.mark.parametrize("other", [{"shape": {"T": 3, "H": 200}}, {"init_seed": 4}], ids=["shape", "weights"])
def test_a_compile_ahead_of_another_shape_or_weights_is_not_used(fresh_worker, other):
    W._compile_baseline("cpu", compile_msg())
    ahead = W._STATE["compiled"]
    msg = compile_msg(**other)
    model = W._model(TASK, Shape.of(msg["shape"]), msg["init_seed"], "cpu")
    used = W._compiled_for(msg, model, "cpu")
    assert used is not ahead and used.key == W._compiled_key(msg) and used.error is None
    assert "compiled" not in W._STATE


def test_a_reference_torch_compile_refuses_is_reported_not_raised(fresh_worker, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("dynamo cannot trace this")

    monkeypatch.setattr(torch, "compile", refuse)
    got = W._compile_baseline("cpu", compile_msg())
    assert got["error"] == "RuntimeError: dynamo cannot trace this"
    assert W._compiled_for(compile_msg(), None, "cpu").error is not None, "the baseline reports it"


def test_a_verdict_that_ends_before_its_baseline_leaves_no_compile_behind(fresh_worker):
    W._compile_baseline("cpu", compile_msg())
    W._forget("cpu", {})
    assert "compiled" not in W._STATE


RESHAPE_AND_CACHE = load_task("reshape_and_cache")
#: its CPU shapes, odd ones included: float32 keys, values and caches, an int64 slot mapping
CACHE_SHAPES = [*RESHAPE_AND_CACHE.cpu_public_shapes, *RESHAPE_AND_CACHE.cpu_hidden_shapes]
CACHE_SEEDS = [51, 52, 53]


def cache_batch(shape):
    """reshape_and_cache's baselines' batch at ``shape`` and its reference (it writes its caches,
    inputs 2 and 3, in place); the model is not the worker's own (a test counts those)."""
    from kernforge.tasks import runtime

    task = RESHAPE_AND_CACHE
    first = runtime.make_inputs(task, shape, "normal", CACHE_SEEDS[0], "cpu")
    layout = W._baseline_layout(task, shape, "normal", CACHE_SEEDS, "cpu", first)
    model = runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 3, "cpu")
    return layout, model


def fresh_cache_inputs(shape):
    from kernforge.tasks import runtime

    return [runtime.make_inputs(RESHAPE_AND_CACHE, shape, "normal", seed, "cpu") for seed in CACHE_SEEDS]


@pytest.mark.parametrize("shape", CACHE_SHAPES, ids=str)
def test_baseline_views_have_bases_of_their_own_dtype(shape):
    """torch.compile cannot trace a reference that writes an input in place when that input's
    base, or an input sharing its storage, has another dtype: every view is a slice of the region
    of its own dtype, ALIGN-aligned in it."""
    from kernforge.verifier.arena import ALIGN

    layout, _ = cache_batch(shape)
    tensors = [x for call in layout.calls for x in call]
    assert {x.dtype for x in tensors} == {torch.float32, torch.int64}
    assert len(layout.regions) == 2
    for x in tensors:
        assert x._base is not None and x._base.dtype == x.dtype, f"a {x.dtype} view of {getattr(x._base, 'dtype', None)}"
        assert any(x._base is r for r in layout.regions)
        assert (x.data_ptr() - x._base.data_ptr()) % ALIGN == 0
    for region in layout.regions:
        assert len({x.untyped_storage().data_ptr() for x in tensors if x.dtype == region.dtype}) == 1


@pytest.mark.parametrize("shape", CACHE_SHAPES, ids=str)
def test_writing_the_pristine_copies_restores_every_input_after_a_mutating_call(shape):
    layout, model = cache_batch(shape)
    layout.write()
    for call in layout.calls:
        model(*call)
    assert any(not torch.equal(got[2], want[2]) for got, want in zip(layout.calls, fresh_cache_inputs(shape))), \
        "the reference writes its caches"
    layout.write()
    for k, (call, drawn) in enumerate(zip(layout.calls, fresh_cache_inputs(shape))):
        for i, (got, want) in enumerate(zip(call, drawn)):
            assert torch.equal(got, want), f"call {k} input {i} not restored"


@pytest.mark.parametrize("shape", [CACHE_SHAPES[1], CACHE_SHAPES[2]], ids=str)
def test_torch_compile_runs_a_mutating_reference_on_the_baseline_views(shape):
    """reshape_and_cache had no torch.compile baseline: aot_autograd refused its in-place writes
    to inputs viewed out of one byte region ("input mutations on views with different dtypes").
    Without AOTAutograd's cache: a graph it kept from an earlier run would skip that check."""
    import torch._functorch.config as functorch_config

    layout, model = cache_batch(shape)
    layout.write()
    for call in layout.calls:
        model(*call)
    eager = [[x.clone() for x in call] for call in layout.calls]
    torch._dynamo.reset()
    try:
        with functorch_config.patch(enable_autograd_cache=False):
            compiled = torch.compile(model, dynamic=False)
            layout.write()
            for call in layout.calls:
                assert compiled(*call) is None
    finally:
        torch._dynamo.reset()
    for k, (call, want) in enumerate(zip(layout.calls, eager)):
        for i, (got, x) in enumerate(zip(call, want)):
            assert torch.equal(got, x), f"call {k} input {i}: torch.compile differs from eager"


def test_baseline_layout_takes_fewer_calls_when_sizes_vary_with_the_seed(monkeypatch):
    """Inputs larger than the first call's (sizes drawn from the seed): the calls that fit."""
    from kernforge.tasks import runtime

    def draw(task, shape, dist, seed, device):
        n = 10 if seed < 3 else 1000
        return [torch.full((n,), float(seed)), torch.arange(4) + seed, 7]

    monkeypatch.setattr(runtime, "make_inputs", draw)
    layout = W._baseline_layout(None, Shape.of(SHAPE), "normal", [1, 2, 3, 4], "cpu", draw(None, None, None, 1, "cpu"))
    assert len(layout.calls) == 2
    layout.write()
    for seed, call in zip([1, 2], layout.calls):
        assert torch.equal(call[0], torch.full((10,), float(seed))) and torch.equal(call[1], torch.arange(4) + seed)
        assert call[2] == 7  # a plain argument passes through


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
    """Drawn one call at a time (a task whose draw cannot be batched), the layout's own draw
    fills the pristine bytes of a small batch; a large one draws again: either way each call's
    bytes are exactly its seed's inputs (drawn together: tests/test_verifier_batched_draws.py)."""
    from kernforge.tasks import runtime

    monkeypatch.setattr(W, "DRAWN_KEEP_BYTES", keep)
    monkeypatch.setattr(runtime, "make_many", lambda *args: None)
    with refworker_arena(8 << 20, 4 << 20):
        seeds = [31, 32, 33]
        planned = W._plan_batch("cpu", {"key": "p", "task_ref": TASK, "shape": SHAPE, "dist": "normal",
                                        "seeds": seeds, "init_seed": 3})
        b = W._STATE["batches"]["p"]
        task = load_task(TASK)
        for seed, args in zip(seeds, planned["sets"]):
            for a, want in zip(args, runtime.make_inputs(task, Shape.of(SHAPE), "normal", seed, "cpu")):
                assert torch.equal(W._pristine_view(b, a), want)


def test_a_new_batch_leaves_valid_inputs_where_its_calls_are_captured():
    """The candidate warms up on the batch's places before capturing them: a new plan writes
    its own draw there (an index input must hold valid indices, not an earlier layout's bytes);
    a plan again before a window draws fresh inputs and leaves the arena to the trusted write."""
    with refworker_arena(8 << 20, 4 << 20) as arena:
        arena.data[: 1 << 20].fill_(0xFF)  # what an earlier layout left: NaNs, or an index far out of range
        msg = {"key": "v", "task_ref": TASK, "shape": SHAPE, "dist": "normal", "seeds": [41, 42], "init_seed": 3}
        W._plan_batch("cpu", msg)
        b = W._STATE["batches"]["v"]
        assert torch.equal(b.region, b.pristine)
        captured = b.region.clone()
        again = W._plan_batch("cpu", {**msg, "seeds": [43, 44]})
        assert again["sets"] == [], "the layout is the first plan's: not sent again"
        assert torch.equal(b.region, captured), "the arena is written only inside the timed window"
        assert not torch.equal(b.pristine, captured), "every window gets inputs of its own"


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


def test_sizing_a_task_leaves_no_model_behind(fresh_worker):
    """A run sizes every task before its first verdict (43 KernelBench problems on the H200): the
    weights drawn to size them must not stay, holding the memory the first verdict's arena needs."""
    kept = W._model(TASK, Shape.of(SHAPE), 3, "cpu")
    got = W._sizes("cpu", {"task_ref": TASK, "shapes": [SHAPE, {"T": 3, "H": 200}], "init_seed": 9})
    assert [s["shape"] for s in got["sizes"]] == [SHAPE, {"T": 3, "H": 200}]
    assert list(W._MODELS.values()) == [kept], "a model built before is kept; those built to size are gone"


def test_nothing_is_timed_until_no_other_process_runs_gpu_work(monkeypatch):
    """Before a window, a baseline, the calibration or the ceilings, the reference worker probes
    the GPU: a tiny kernel that waits for another process's time slice (2.4 ms on the H200,
    against 14 us idle) means work is running or queued there, stopped neighbour or not. It
    waits until the least of three probes is quick, and gives up with GpuBusy."""
    slices = iter([2400.0] * 3 + [2400.0, 14.0, 2400.0])
    asked = []

    def probe(device):
        asked.append(device)
        return next(slices)

    monkeypatch.setattr(W.time, "sleep", lambda s: None)
    W._quiet_gpu("cuda:0", probe=probe)
    assert len(asked) == 6, "a second round of three, whose least probe was quick"
    monkeypatch.setattr(W, "QUIET_WAIT_S", 0.0)
    with pytest.raises(W.GpuBusy, match="busy"):
        W._quiet_gpu("cuda:0", probe=lambda device: 2400.0)
    assert W._quiet_gpu("cpu", probe=lambda device: pytest.fail("nothing to probe off a GPU")) == 0.0
