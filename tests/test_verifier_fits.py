"""A task too large for the GPU is said so before any candidate runs (verifier/fits.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernforge.tasks.loader import load_task
from kernforge.verifier import fits
from kernforge.verifier.gate import DeviceGate
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
        self.gate, self._memory_share = DeviceGate(), 1.0  # one lane: the whole GPU

    def environment(self):
        return {"memory_gib": self._memory}

    def _shape_sizes(self, task, shapes, init_seed, **_):
        n = int(self._per_call * GIB)
        return {s.params: {"input_bytes": n, "output_bytes": n} for s in shapes}


def test_the_judge_refuses_the_task_before_any_candidate_runs():
    task = load_task(TASKS / "tiny_norm")
    _GpuJudge(139.8, 1.0).check_fits(task)  # fits: nothing raised
    with pytest.raises(TaskTooLarge, match="tiny_norm: task too large for this GPU"):
        _GpuJudge(139.8, 30.0).verify("this source is never read", task)


def test_the_cpu_interpreter_refuses_a_file_at_its_own_sizes_with_what_to_do(tmp_path):
    """On the CPU 19_ReLU at its own sizes moves 12 GiB a call: its reference's worker failed with
    "File too large" on the arena, and the run set the task aside as the judge's failure. It is now
    refused up front, the task named, with the way out; CPU-sized shapes of its own are judged."""
    from kernforge.sandbox.protocol import Limits

    relu = Path(__file__).resolve().parents[1] / "bench" / "kernelbench" / "problems" / "level1" / "19_ReLU.py"
    judge = object.__new__(Judge)  # no workers: check_fits reads the options and the task only
    judge.on_gpu, judge.options = False, JudgeOptions(device="cpu")
    with pytest.raises(TaskTooLarge, match=r"19_ReLU: task too large for the CPU interpreter: at its own sizes "
                                           r"\(batch_size=4096 dim=393216\) one call moves 12\.0 GiB.*CPU_PUBLIC_SHAPES"):
        judge.check_fits(load_task(relu))
    (tmp_path / "19_ReLU.py").write_text(relu.read_text())
    (tmp_path / "19_ReLU.meta.py").write_text("CPU_PUBLIC_SHAPES = [{'batch_size': 4, 'dim': 300}]\n")
    assert judge.check_fits(load_task(tmp_path / "19_ReLU.py")) == 0
    assert fits.too_large_for_cpu(Limits().file_bytes // 2, "N=1", Limits().file_bytes) is None
    assert fits.too_large_for_cpu(Limits().file_bytes // 2 + 1, "N=1", Limits().file_bytes) is not None


def test_weights_count_twice_toward_what_a_call_needs():
    """A KernelBench linear of 32768x32768 float32 holds 4 GiB of weights in the reference worker
    and again in the candidate's worker: a shape whose calls fit may not fit with them."""
    calls = {("a",): {"input_bytes": 20 * GIB, "output_bytes": 10 * GIB}}
    assert fits.too_large(calls, {("a",): "N=1"}, int(139.8 * GIB)) is None
    heavy = {("a",): {**calls[("a",)], "param_bytes": 8 * GIB}}
    why = fits.too_large(heavy, {("a",): "N=1"}, int(139.8 * GIB))
    assert why is not None and "8.0 GiB of weights" in why


def test_the_heap_holds_every_shapes_weights():
    """The candidate's worker builds ModelNew once per shape inside the arena's heap and keeps
    each: the heap grows by the weights of every shape, beside the margin for temporaries."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(139.8, 0.001)
    shapes = [Shape.of({"N": 1}), Shape.of({"N": 2})]
    bare = {s.params: {"input_bytes": 1 << 20, "output_bytes": 1 << 20} for s in shapes}
    weighted = {k: {**v, "param_bytes": (3 + i) * GIB} for i, (k, v) in enumerate(bare.items())}
    plain, heavy = judge._arena_layout(bare, shapes, {}), judge._arena_layout(weighted, shapes, {})
    assert heavy["input_bytes"] == plain["input_bytes"]
    # both shapes' weights, and a working copy of the largest (a transposed 4 GiB weight)
    assert heavy["size"] - plain["size"] >= (3 + 4 + 4) * GIB - (8 << 20)  # less the small margin it replaced


def test_the_heap_has_room_for_a_working_copy_of_the_largest_input():
    """A reduction's output is small, but a kernel may cast or transpose its 8 GiB input once."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(139.8, 0.001)
    shape = Shape.of({"N": 1})
    layout = judge._arena_layout({shape.params: {"input_bytes": 8 * GIB, "output_bytes": 1 << 20}}, [shape], {})
    assert layout["size"] - layout["input_bytes"] >= 8 * GIB + (2 << 30)


def test_a_batch_of_large_calls_has_few_of_them():
    """With no roofline of its own (a KernelBench problem), a task's batch is sized by the time
    its calls take at least to move their bytes: a GEMM of 352 MiB a call (88 us at 4 TB/s) gets
    the tens of calls of a 2.5 ms window, not the hundreds a 4 us call would, and a tiny call
    still fills the window."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(139.8, 0.001)
    judge.ceilings = lambda: {"bandwidth_gbps": 4000.0, "tflops": 800.0}
    task = load_task(TASKS / "tiny_norm")
    big, small = Shape.of({"T": 1, "H": 2}), Shape.of({"T": 1, "H": 4})
    sizes = {big.params: {"input_bytes": 64 << 20, "output_bytes": 32 << 20, "param_bytes": 256 << 20},
             small.params: {"input_bytes": 4096, "output_bytes": 4096}}
    plan = judge._batch_plan(task, sizes, [big, small])
    assert 20 <= plan[big.params] <= 40
    assert plan[small.params] == judge.options.max_batch_calls


def test_a_baseline_keeps_its_calls_when_a_candidates_batches_grow():
    """Sized for more calls than 512 (launch-bound shapes), a candidate's batch grows; the baselines'
    batch stays at ``BASELINE_MAX_CALLS``, keyed as before, so an archive's kept baselines still serve."""
    from kernforge.tasks.spec import Shape
    from kernforge.verifier import judge as J

    task = load_task(TASKS / "tiny_norm")
    small = Shape.of({"T": 1, "H": 4})
    sizes = {small.params: {"input_bytes": 4096, "output_bytes": 4096}}
    keys = []
    for most, least_us in ((512, 4.0), (4096, 1.0)):
        judge = _GpuJudge(139.8, 0.001)
        judge.options = JudgeOptions(max_batch_calls=most, min_call_us=least_us)
        judge.environment = lambda: {"memory_gib": 139.8, "l2_bytes": 50 << 20, "gpu": "test"}
        judge.ceilings = lambda: {"bandwidth_gbps": 4000.0, "tflops": 800.0}
        plan = judge._batch_plan(task, sizes, [small])
        calls = judge._baseline_calls(task, small, sizes[small.params])
        assert plan[small.params] == min(most, 2500) and calls == J.BASELINE_MAX_CALLS == 512
        keys.append(judge._baseline_key(task, small, calls))
    assert keys[0] == keys[1]


def test_the_working_copy_shrinks_to_the_room_the_gpu_has():
    """A 30 GiB input fits an H200 (fits.py), but not with a whole working copy beside it: the
    copy's room shrinks so that a task fits.py admits is never refused by its own arena."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(139.8, 0.001)
    shape = Shape.of({"N": 1})
    sizes = {shape.params: {"input_bytes": 30 * GIB, "output_bytes": 1 << 20}}
    layout = judge._arena_layout(sizes, [shape], {})
    room = int(139.8 * GIB) - fits.need_bytes(30 * GIB, 1 << 20)
    assert layout["size"] - layout["input_bytes"] <= room + (2 << 30) + (64 << 20)


def test_a_lane_plans_for_its_share_and_a_large_task_holds_the_gpu_alone():
    """Two lanes on one GPU: each verdict's batches fit half the arena's share of memory; a task
    one call of which needs more than that is judged alone, with all of it (verifier/gate.py)."""
    from kernforge.tasks.spec import Shape

    task = load_task(TASKS / "tiny_norm")
    shape = Shape.of({"T": 1, "H": 2})
    sizes = {shape.params: {"input_bytes": 2 * GIB, "output_bytes": 2 * GIB}}
    per_set = 2 * 2 * GIB + 2.25 * 2 * GIB  # the inputs twice, both batch sizes' outputs
    budgets, calls = {}, {}
    for lanes, share in ((1, 1.0), (2, 0.5)):
        judge = _GpuJudge(139.8, 2.0)
        judge.options = JudgeOptions(batch_window_ms=5.0)  # five calls at the floor: more than half the arena fits
        judge.ceilings = lambda: {"bandwidth_gbps": 4000.0, "tflops": 800.0}
        judge.gate, judge._memory_share = DeviceGate(lanes), share
        budgets[lanes], calls[lanes] = judge._arena_budget(), judge._batch_plan(task, sizes, [shape])[shape.params]
        assert calls[lanes] * per_set <= budgets[lanes]
    assert abs(budgets[2] - budgets[1] / 2) <= 1 and calls[2] < calls[1]
    two = DeviceGate(2)
    small, large = _GpuJudge(139.8, 1.0), _GpuJudge(139.8, 10.0)  # 12 and 84 GiB a call: a lane has 42
    small.gate = large.gate = two
    assert not small._needs_the_gpu(small.check_fits(task)) and large._needs_the_gpu(large.check_fits(task))


def test_a_baselines_calls_and_cache_key_do_not_depend_on_the_lanes(tmp_path):
    """A baseline is kept per call count. Four lanes fit fewer calls per batch than one, so a
    baseline cached by a four-lane night was measured again by a one-lane night, every task's
    (H200, session 37). Its calls are the batch window's, capped where the batch has long
    outgrown the L2 cache, never what a lane's arena fits; a small call keeps the window's."""
    from kernforge.tasks.spec import Shape
    from kernforge.verifier import judge as J

    task = load_task(TASKS / "tiny_norm")
    big, small = Shape.of({"T": 1, "H": 2}), Shape.of({"T": 1, "H": 1})
    sizes = {big.params: {"input_bytes": 2 * GIB, "output_bytes": 2 * GIB},
             small.params: {"input_bytes": 8 << 10, "output_bytes": 8 << 10}}
    plans, calls, keys = {}, {}, {}
    for lanes, share in ((1, 1.0), (4, 0.25)):
        judge = _GpuJudge(139.8, 2.0)
        judge.options = JudgeOptions(batch_window_ms=50.0)  # 50 big calls at the floor: more than a lane fits
        judge.environment = lambda: {"memory_gib": 139.8, "l2_bytes": 50 << 20, "gpu": "test"}
        judge.ceilings = lambda: {"bandwidth_gbps": 4000.0, "tflops": 800.0}
        judge.gate, judge._memory_share = DeviceGate(lanes), share
        plans[lanes] = judge._batch_plan(task, sizes, [big, small])
        calls[lanes] = {s: judge._baseline_calls(task, s, sizes[s.params]) for s in (big, small)}
        keys[lanes] = judge._baseline_key(task, big, calls[lanes][big])
    assert plans[4][big.params] < plans[1][big.params], "a lane's batches are smaller"
    assert calls[1] == calls[4] and keys[1] == keys[4]
    assert calls[1][big] == J.BASELINE_MIN_CALLS  # 4 GiB a call: the cache is outgrown by one
    assert calls[1][small] == plans[1][small.params] == JudgeOptions().max_batch_calls  # launch-bound: a window's worth


@pytest.mark.parametrize("words", [
    "the task's reference failed on prepare: OutOfMemoryError: CUDA out of memory",
    # the arena's own allocation through the driver (four lanes on the H200: fused_moe was set aside)
    "the task's reference failed on arena: VMMError: cuMemCreate of 16823353344 bytes failed: CUDA_ERROR_OUT_OF_MEMORY (2)",
])
def test_a_reference_out_of_memory_is_judged_once_more_alone_with_a_fresh_reference_worker(words):
    """On the H200, with two lanes, a KernelBench reference ran out of memory preparing a call
    (the other lane's reference worker held 60 GiB): the verdict is made once more, alone on the
    GPU, after the reference worker is started afresh, planned for the memory free then (fused_moe
    ran out again when planned for the whole GPU while the other lane's worker held 30 GiB).
    Another reference failure is the task's."""
    import threading

    from kernforge.verifier.judge import ReferenceFailed
    from kernforge.verifier.verdict import Accepted

    task = load_task(TASKS / "tiny_norm")
    judge = _GpuJudge(139.8, 1.0)
    judge.gate = DeviceGate(2)
    seen, dropped = [], []
    # the reference worker's "forget", and its reading of the GPU's memory: 40% free (another
    # lane's reference worker keeps its cache)
    judge._ask_ref = lambda reply_type, msg, **kw: ({"free_bytes": 56 << 30, "total_bytes": 140 << 30}
                                                    if msg["op"] == "memory" else {})
    judge._drop_ref = lambda: dropped.append(True)
    judge._phases = {}

    def verify(source, task):
        seen.append((judge._memory_share, judge.gate._writer == threading.get_ident()))
        if len(seen) == 1:
            raise ReferenceFailed(words)
        return Accepted(shapes=())

    judge._verify = verify
    assert judge.verify("source", task).accepted
    assert seen == [(0.5, False), (0.4, True)], "alone, planned for what is free"
    # a fresh reference worker before, and after (its arena was planned for the GPU alone: the
    # other lane needs that memory back)
    assert dropped == [True, True]

    def never(source, task):
        raise ReferenceFailed("the task's reference failed on prepare: ValueError: bad shape")

    judge._verify = never
    with pytest.raises(ReferenceFailed, match="bad shape"):
        judge.verify("source", task)


def test_a_large_elementwise_call_leaves_the_reference_worker_room_beside_the_arena():
    """KernelBench's ReLU moves 6 GiB in and 6 GiB out per call. On an H100 (79.2 GiB) the
    candidate's margin of four outputs (24 GiB) made an arena of 50 GiB, and the reference
    worker's two prepared calls then ran out of memory at every problem of its kind. The margin
    now takes only what the GPU has beside the reference worker's own peak, and still holds a
    working copy of the output."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(79.18, 0.001)
    shape = Shape.of({"N": 1})
    call = 4096 * 393216 * 4
    sizes = {shape.params: {"input_bytes": call, "output_bytes": call}}
    plan = {shape.params: 1}
    layout = judge._arena_layout(sizes, [shape], plan)
    beside = fits.reference_bytes(call, call, call)
    assert layout["size"] + beside + fits.OVERHEAD <= int(79.18 * GIB) + (4 << 20)  # the layout's rounding
    assert layout["size"] - layout["input_bytes"] >= 2 * call + call, "its two outputs and a working copy"


def test_the_margin_is_untouched_where_the_gpu_has_room():
    """The clamp binds only where the arena and the reference worker would not fit together: a
    built-in task's largest call keeps four outputs' margin."""
    from kernforge.tasks.spec import Shape

    judge = _GpuJudge(79.18, 0.001)
    shape = Shape.of({"N": 1})
    sizes = {shape.params: {"input_bytes": 512 << 20, "output_bytes": 256 << 20}}
    layout = judge._arena_layout(sizes, [shape], {shape.params: 32})
    heap = max(2 * (256 << 20), 32 * (256 << 20) * 9 // 8)
    assert layout["size"] - layout["input_bytes"] >= heap + max(heap // 2, 4 * (256 << 20)) + (2 << 30)


def test_a_heap_short_of_its_working_copy_says_so_and_an_out_of_memory_reason_tells_it():
    """35_GroupNorm_'s hidden shape on an H100 (6.3 GiB in and out a call, and its timed batches
    beside): the heap had room for 4.6 GiB of temporaries, less than the working copy of the input
    the judge plans, and the honest start that asked for one more input-sized buffer was told it
    had that copy. The plan now says the room it could give, and an out-of-memory reason tells the
    truth; an H200 has room. (Here a 74 GiB GPU stands for the H100 less its batches.)"""
    from kernforge.tasks.spec import Shape
    from kernforge.verifier.defences import failures
    from kernforge.verifier.messages import Failure

    shape = Shape.of({"N": 1})
    call = int(6.31 * GIB)
    sizes = {shape.params: {"input_bytes": call, "output_bytes": call}}
    short = _GpuJudge(74.0, 0.001)._arena_layout(sizes, [shape], {})["heap_short"]
    assert short is not None and short[0] < short[1] == call
    assert _GpuJudge(139.8, 0.001)._arena_layout(sizes, [shape], {})["heap_short"] is None
    oom = Failure(op="check", ok=False, stage="oom", error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.31 GiB")
    told = failures.failed(oom, "checking the hidden shape N=1", heap_bytes=19 * GIB, heap_short=short)
    assert f"less than the {call / GIB:.1f} GiB working copy" in told.reason and "no more room" in told.reason
    assert "a working copy of its largest input or weight and 2 GiB more" not in told.reason
    assert told.evidence["planned_copy"] == call
