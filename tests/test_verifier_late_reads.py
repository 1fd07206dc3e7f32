"""A checked call's second read (late writes, THREATS #5/#6) deferred to a later compare on a GPU
(late_reads.py): never sooner than the pause after the snapshot, at the latest two compares on,
every change found and blamed on the call it belongs to; the worker keeps those calls' outputs in
place until then. The reference worker's part runs in-process on the CPU here, with the rule
that keeps the CPU from deferring set aside (the test owns the memory it writes)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernforge.tasks.spec import Shape
from kernforge.verifier import harness, judge as J, late_reads as L, refworker as W
from kernforge.verifier import messages as M
from kernforge.verifier.arena import Slots
from kernforge.verifier.messages import TensorRef
from kernforge.verifier.verdict import Rejected, Status
from refworker_helpers import refworker_arena  # noqa: E402

TASK = str(Path(__file__).parent / "tasks" / "tiny_norm")
SHAPE = {"T": 5, "H": 200}


class _Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


@pytest.fixture
def clock():
    return _Clock()


def _reads(clock: _Clock) -> L.LateReads:
    return L.LateReads(clock=clock, sleep=clock.sleep)


def _output(value: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    place = torch.full((4, 4), value)
    return place, place.clone()


def test_a_deferred_call_is_read_at_the_first_compare_after_its_pause(clock):
    reads = _reads(clock)
    place, snap = _output()
    reads.defer("a", [place], [snap], taken=0.0)
    clock.now = 0.005
    assert reads.at_compare() == [] and len(reads) == 1, "not read before its pause is over"
    clock.now = 0.021
    place[1, 2] = 7.0
    assert reads.at_compare() == [("a", [0])] and len(reads) == 0
    assert clock.slept == [], "nothing waited: the pause had passed"


def test_a_call_two_compares_old_is_read_with_what_is_left_of_its_pause_waited_out(clock):
    """Its memory may go back to the candidate's pool once this compare is over: read now, never
    sooner than the pause after its snapshot."""
    reads = _reads(clock)
    place, snap = _output()
    reads.defer("a", [place], [snap], taken=0.0)
    clock.now = 0.004
    assert reads.at_compare() == []
    clock.now = 0.008
    assert reads.at_compare() == [] and len(reads) == 0
    assert clock.slept == [0.012]


def test_each_change_is_named_with_its_call_and_output(clock):
    reads = _reads(clock)
    a0, a0s = _output()
    a1, a1s = _output(2.0)
    b0, b0s = _output(3.0)
    reads.defer("a", [a0, a1], [a0s, a1s], taken=0.0)
    reads.defer("b", [b0], [b0s], taken=0.001)
    a1[0, 0] = -1.0
    b0[3, 3] = float("nan")
    assert reads.settle() == [("a", [1]), ("b", [0])]
    assert clock.slept == [0.021], "one wait, until the newest call's pause is over"


def test_settle_reads_every_deferred_call_and_leaves_none(clock):
    reads = _reads(clock)
    for k in range(2):
        place, snap = _output()
        reads.defer(str(k), [place], [snap], taken=0.01 * k)
    clock.now = 0.015
    assert reads.settle() == [] and len(reads) == 0
    assert clock.slept == [0.015], "until the last call's pause is over"


def test_nan_bytes_that_did_not_change_are_no_change(clock):
    reads = _reads(clock)
    place, snap = _output(float("nan"))
    reads.defer("a", [place], [snap], taken=0.0)
    assert reads.settle() == []


FOUR = L.Deferral(input_parts=L.IN_PLACE_PARTS)


@pytest.mark.parametrize("on_gpu, failed, places, deferral, ok", [
    (True, False, [(4096, 1024)], L.Deferral(), True),
    (False, False, [(4096, 1024)], L.Deferral(), False),  # the CPU worker's slots are reused by the call after next
    (True, True, [(4096, 1024)], L.Deferral(), False),  # a failed call's reasons come whole, as always
    (True, False, [(100, 1024)], L.Deferral(), False),  # in place, two parts: the call after next's inputs go there
    (True, False, [(100, 1024), (4096, 64)], FOUR, True),  # four parts: written again after the compare two calls on
    (True, False, [(1500, 1024)], FOUR, False),  # in the input region, not in its own part
    (True, False, [(4096, L.DEFER_BYTES)], L.Deferral(), True),
    (True, False, [(4096, L.DEFER_BYTES), (8192, 1)], L.Deferral(), False),  # the worker keeps no third call of these
    (True, False, [(4096, 256 << 20)], L.Deferral(defer_bytes=256 << 20), True),  # the judge made room for them
], ids=["a passing GPU call", "a CPU call", "failed", "in place, two parts", "in place, four parts",
        "outside its part", "at the limit", "over it", "over it, with room made"])
def test_which_calls_are_deferred(on_gpu, failed, places, deferral, ok):
    assert L.deferrable(on_gpu, failed, places, 4096, (0, 1200), deferral) is ok


# ---- the judge makes room for them where the GPU has it ------------------------------------------
GIB = 1 << 30


@pytest.mark.parametrize("in_place, check_in, check_out, room, defer_bytes, parts, grow", [
    (False, GIB, 1 << 20, 0, L.DEFER_BYTES, 2, 0),  # small outputs: deferred without any room made
    (False, GIB, GIB // 4, GIB, GIB // 4, 2, GIB // 2),  # two more calls' outputs in the heap, their snapshots beside
    (False, GIB, GIB // 4, GIB - 1, L.DEFER_BYTES, 2, 0),  # no room: each call's pause waited out as before
    (True, GIB, 1 << 20, 2 * GIB, L.DEFER_BYTES, 4, 0),  # two more calls' inputs
    (True, GIB, 1 << 20, 2 * GIB - 1, L.DEFER_BYTES, 2, 0),
    (True, GIB, GIB // 2, 3 * GIB, L.DEFER_BYTES, 4, 0),  # the snapshots of in-place outputs paid for
    (True, GIB, GIB // 2, 3 * GIB - 1, GIB // 2, 2, GIB),  # short of it: the heap's growth alone
    (True, GIB, GIB // 2, 4 * GIB, GIB // 2, 4, GIB),  # both: the snapshots paid for once
], ids=["small", "large, room", "large, no room", "in place, room", "in place, no room",
        "in place with large outputs", "short of the parts", "both"])
def test_what_a_verdict_may_defer_is_decided_by_the_room_left(in_place, check_in, check_out, room, defer_bytes, parts, grow):
    deferral, grown = J._deferral(in_place, check_in, check_out, room)
    assert (deferral.defer_bytes, deferral.input_parts, grown) == (defer_bytes, parts, grow)


def _layout(memory_gib: float, in_place: bool) -> dict:
    """The judge's arena layout on a GPU of ``memory_gib`` for a call of rms_norm's largest size
    (256 MiB in, 256 MiB out), checked and timed in batches of one call."""
    judge = SimpleNamespace(on_gpu=True, environment=lambda: {"memory_gib": memory_gib}, _memory_share=1.0)
    shape = Shape.of({"T": 16384, "H": 8192})
    sizes = {shape.params: {"input_bytes": 256 << 20, "output_bytes": 256 << 20, "param_bytes": 0}}
    return J.Judge._arena_layout(judge, sizes, [shape], {shape.params: 1}, in_place=in_place)


def test_the_layout_grows_the_heap_and_the_input_region_for_what_it_defers():
    small, large = _layout(6, in_place=True), _layout(80, in_place=True)
    assert (small["defer_bytes"], small["input_parts"]) == (L.DEFER_BYTES, 2), "a 6 GiB GPU: no room for it"
    assert (large["defer_bytes"], large["input_parts"]) == (256 << 20, L.IN_PLACE_PARTS)
    assert large["input_bytes"] >= L.IN_PLACE_PARTS * (256 << 20) > small["input_bytes"]
    heap = lambda layout: layout["size"] - layout["input_bytes"]  # noqa: E731
    assert heap(large) - heap(_layout(80, in_place=False)) == 0, "the heap's growth is for large outputs, in place or not"
    assert _layout(80, in_place=False)["input_parts"] == 2, "four parts only for a task that writes inputs in place"


# ---- the candidate's worker keeps those outputs in place ------------------------------------------
def _kept():
    return [held[0] for held, _ in harness._STATE["keep"]]


def test_before_a_call_the_worker_keeps_the_last_call_and_two_more_small_ones(monkeypatch):
    """While call n runs, call n-1's compare runs beside it (reading n-1, and the deferred n-2 and
    n-3); the compare of n-2 ended before n was sent. So n-1 is kept whatever its size, n-2 and
    n-3 only where they could be deferred (small), and nothing older."""
    monkeypatch.setitem(harness._STATE, "keep", __import__("collections").deque())
    big = L.DEFER_BYTES + 1
    for k in range(5):
        harness._keep([f"call {k}"], 1024)
    harness._let_go()
    assert _kept() == ["call 2", "call 3", "call 4"]
    harness._keep(["big"], big)
    assert _kept() == ["call 2", "call 3", "call 4", "big"], "nothing is let go until the next call"
    harness._let_go()
    assert _kept() == ["call 3", "call 4", "big"], "the last call's outputs stay, whatever their size"
    harness._keep(["after"], 1024)
    harness._let_go()
    assert _kept() == ["call 4", "after"], "a large call is let go once it is not the last"
    harness._keep(["big 2"], big)
    harness._let_go()
    harness._keep(["big 3"], big)
    harness._let_go()
    assert _kept() == ["after", "big 3"], \
        "two large calls' outputs at most, the new one's included: the heap the judge sizes holds two"
    harness._let_go(everything=True)
    assert _kept() == [], "a timed batch: every read was settled"


def test_a_verdict_that_made_room_keeps_its_large_calls_too(monkeypatch):
    monkeypatch.setitem(harness._STATE, "keep", __import__("collections").deque())
    monkeypatch.setitem(harness._STATE, "defer_bytes", 256 << 20)
    for k in range(4):
        harness._keep([f"big {k}"], 256 << 20)
        harness._let_go()
    harness._keep(["bigger"], (256 << 20) + 1)
    harness._let_go()
    assert _kept() == ["big 2", "big 3", "bigger"]
    harness._keep(["next"], 1024)
    harness._let_go()
    assert _kept() == ["big 3", "next"], "over the verdict's limit: let go once it is not the last"


# ---- the reference worker's compare, in-process --------------------------------------------------
@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def worker(request, monkeypatch):
    """A reference worker whose compares defer as on a GPU (on the CPU, the rule that keeps it
    from deferring set aside), its outputs in a heap the test writes."""
    device = request.param
    if device == "cpu":
        real = L.deferrable
        monkeypatch.setattr(W.late_reads, "deferrable", lambda on_gpu, *rest: real(True, *rest))
    with refworker_arena(8 << 20, 4 << 20, device) as arena:
        heap = Slots(arena.layout.input_bytes, arena.layout.size)
        model = W._model(TASK, Shape.of(SHAPE), 3, device)
        task = W.load_task(TASK)

        def call(key: str, seed: int, *, wrong: bool = False) -> list[dict]:
            prepared = W._prepare(device, {"key": key, "task_ref": TASK, "shape": SHAPE, "dist": "normal", "seed": seed,
                                           "init_seed": 3, "part": seed % 2})
            inputs = [arena.view(TensorRef(**a["ref"])) for a in prepared["args"]]
            y = model(*inputs)
            if wrong:
                y = y + 1.0
            return [arena.place(heap, y).to_dict()]

        def compare(key: str, outputs: list[dict]) -> dict:
            return W._compare(device, {"key": key, "task_ref": TASK, "outputs": outputs, "tolerances": task.tolerance_table()})

        yield arena, call, compare


def test_a_write_after_a_passing_call_is_found_at_a_later_compare_and_blamed_on_it(worker):
    arena, call, compare = worker
    first = call("first", 1)
    got = compare("first", first)
    assert all(r["ok"] for r in got["results"]) and got["late_writes"] == [] and got["late_earlier"] == []
    arena.view(TensorRef(**first[0]))[0, 0] += 1.0  # written after the reply: work the call left running
    second = call("second", 2)
    third = call("third", 3)
    found = compare("second", second)["late_earlier"] + compare("third", third)["late_earlier"]
    assert found == [{"key": "first", "outputs": [0]}]
    assert W._settle(W._STATE["device"], {}) == {"late": []}, "the two later calls held still"


def test_a_failed_call_is_read_again_within_its_own_compare(worker):
    arena, call, compare = worker
    first = call("first", 1)
    compare("first", first)
    arena.view(TensorRef(**first[0]))[1, 1] = 0.0
    wrong = call("wrong", 2, wrong=True)
    got = compare("wrong", wrong)
    assert not got["results"][0]["ok"] and got["late_writes"] == []
    assert got["late_earlier"] == [{"key": "first", "outputs": [0]}], "every earlier call read with it"
    assert len(W._late_reads(W._STATE["device"])) == 0


def test_settle_finds_a_write_to_the_last_call_of_a_group(worker):
    arena, call, compare = worker
    last = call("last", 1)
    compare("last", last)
    arena.view(TensorRef(**last[0])).zero_()
    device = W._STATE["device"]
    assert W._settle(device, {}) == {"late": [{"key": "last", "outputs": [0]}]}
    assert M.parse(M.Settled, {"op": "settle", "ok": True, **W._settle(device, {})}).late == []


def test_a_verdicts_end_forgets_the_deferred_reads(worker):
    _, call, compare = worker
    compare("only", call("only", 1))
    W._forget(W._STATE["device"], {})
    assert len(W._late_reads(W._STATE["device"])) == 0


def test_a_verdict_loads_its_task_once_and_the_next_verdict_afresh(worker, monkeypatch):
    """Every checked call's prepare and compare ask for the task: loaded once per verdict (it took
    2-6 ms a time on the path of every checked call), read again after ``_forget``."""
    _, call, compare = worker
    W._forget(W._STATE["device"], {})
    loads, real = [], W.load_task
    monkeypatch.setattr(W, "load_task", lambda ref: loads.append(ref) or real(ref))
    for key, seed in (("a", 1), ("b", 2), ("c", 3)):
        compare(key, call(key, seed))
    assert loads == [TASK]
    W._forget(W._STATE["device"], {})
    compare("d", call("d", 4))
    assert loads == [TASK, TASK]


IN_PLACE = str(Path(__file__).parents[1] / "tasks" / "builtin" / "fused_add_rms_norm")


@pytest.mark.parametrize("parts", [2, L.IN_PLACE_PARTS])
def test_in_place_outputs_wait_for_their_second_read_only_where_the_inputs_rotate_through_four_parts(monkeypatch, parts):
    """fused_add_rms_norm writes x and the residual in place: with two parts the call after next's
    inputs land on them right after the compare (read within it); with four, the call whose
    inputs land there is prepared after the compare two calls on, where they are read again."""
    real = L.deferrable
    monkeypatch.setattr(W.late_reads, "deferrable", lambda on_gpu, *rest: real(True, *rest))
    shape = {"T": 2, "H": 256}
    with refworker_arena(8 << 20, 4 << 20) as arena:
        W._STATE["deferral"] = L.Deferral(input_parts=parts)
        task = W.load_task(IN_PLACE)
        model = W._model(IN_PLACE, Shape.of(shape), 3, "cpu")

        def checked(key: str, k: int) -> tuple[list[dict], dict]:
            prepared = W._prepare("cpu", {"key": key, "task_ref": IN_PLACE, "shape": shape, "dist": "normal", "seed": k + 1,
                                          "init_seed": 3, "part": k})
            model(*[arena.view(TensorRef(**a["ref"])) if "ref" in a else a["value"] for a in prepared["args"]])
            outputs = [a["ref"] for a in prepared["args"][:2]]  # x and the residual, written in place
            return outputs, W._compare("cpu", {"key": key, "task_ref": IN_PLACE, "outputs": outputs,
                                               "tolerances": task.tolerance_table()})

        places = [W._regions(k)[0] for k in range(parts)]
        assert all(a.end <= b.start for a, b in zip(places, places[1:])), "the parts lie apart"
        first, got = checked("first", 0)
        assert all(r["ok"] for r in got["results"]) and got["late_writes"] == []
        assert len(W._late_reads("cpu")) == (1 if parts == L.IN_PLACE_PARTS else 0)
        arena.view(TensorRef(**first[1]))[0, 0] += 1.0  # the residual written after the reply
        found = checked("second", 1)[1]["late_earlier"] + checked("third", 2)[1]["late_earlier"]
        if parts == L.IN_PLACE_PARTS:
            assert found == [{"key": "first", "outputs": [1]}], "found two compares on, blamed on its own call"
        else:
            assert found == [], "read within its own compare: the write came after that read"


# ---- the judge blames the call it belongs to ---------------------------------------------------
def _calls() -> dict[str, J._Call]:
    shape = Shape.of(SHAPE)
    calls = {}
    for k, offset in enumerate((4096, 8192, 4096)):
        c = J._Call(shape, "normal", False, f"k{k}", part=k % 2)
        c.outputs = [TensorRef(offset, "float32", [5, 200], [200, 1])]
        calls[c.key] = c
    return calls


def _late_earlier(late: list[M.LateRead], calls: dict) -> Rejected | None:
    return J.Judge._late_earlier(SimpleNamespace(on_gpu=True), late, calls)


def test_a_late_write_found_later_is_rejected_as_its_own_calls():
    calls = _calls()
    calls["k2"].outputs = [TensorRef(1 << 20, "float32", [5, 200], [200, 1])]
    got = _late_earlier([M.LateRead("k1", [0])], calls)
    assert isinstance(got, Rejected) and got.status is Status.CHEAT and got.threat == 5
    assert "output 0 changed after forward returned (public shape T=5 H=200, normal inputs)" in got.reason
    assert got.evidence["shape"] == {"T": 5, "H": 200}
    assert _late_earlier([], calls) is None


def test_a_later_call_returning_the_same_memory_is_named_as_that_not_as_a_cheat():
    """A module that returns one persistent buffer overwrites its last result at its next call:
    wrong, but not work left running."""
    got = _late_earlier([M.LateRead("k0", [0])], _calls())
    assert isinstance(got, Rejected) and got.status is Status.INCORRECT
    assert "lie in the same memory" in got.reason and "a later call" in got.reason
