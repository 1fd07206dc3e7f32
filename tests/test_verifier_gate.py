"""The GPU's gate between lanes: verdicts share it, timed phases hold it alone.

Orders of events between threads, never durations: a thread that must wait is shown to be still
waiting when another thread has done something it could only do while the first waits.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kernforge.verifier.gate import DeviceGate

#: generous: a correct gate reaches each of these points at once; a wrong one never does
LONG = 30.0


def until(condition, what: str) -> None:
    """Wait for ``condition`` (a state another thread reaches at once when the gate is right)."""
    tick = threading.Event()
    for _ in range(int(LONG / 0.001)):
        if condition():
            return
        tick.wait(0.001)
    raise AssertionError(f"never happened: {what}")


def run(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_verdicts_hold_the_gate_together():
    gate = DeviceGate(2)
    both = threading.Barrier(2, timeout=LONG)
    seen = []

    def verdict():
        with gate.shared():
            both.wait()  # only passes when the two hold it at once
            seen.append(True)

    threads = [run(verdict), run(verdict)]
    for t in threads:
        t.join(LONG)
    assert seen == [True, True]


def test_a_timed_phase_waits_for_every_other_verdict_and_runs_alone():
    gate = DeviceGate(2)
    order: list[str] = []
    b_holds, b_may_go, a_waiting = threading.Event(), threading.Event(), threading.Event()

    def lane_b():  # a verdict being checked
        with gate.shared():
            b_holds.set()
            b_may_go.wait(LONG)
            order.append("b checks done")

    def lane_a():  # a verdict that reaches its timing
        with gate.shared():
            a_waiting.set()
            with gate.exclusive():
                order.append("a times")

    tb = run(lane_b)
    assert b_holds.wait(LONG)
    ta = run(lane_a)
    assert a_waiting.wait(LONG)
    until(lambda: gate._waiting_writers, "a asked for the gate alone, and waits for b")
    b_may_go.set()
    ta.join(LONG)
    tb.join(LONG)
    assert order == ["b checks done", "a times"]


def test_a_waiting_timed_phase_goes_before_a_new_verdict():
    """Writer preference: timing is never starved by verdicts that keep starting."""
    gate = DeviceGate(3)
    order: list[str] = []
    b_holds, b_may_go = threading.Event(), threading.Event()

    def lane_b():
        with gate.shared():
            b_holds.set()
            b_may_go.wait(LONG)

    def lane_a():
        with gate.exclusive():
            order.append("a times")

    def lane_c():
        with gate.shared():
            order.append("c starts")

    tb = run(lane_b)
    assert b_holds.wait(LONG)
    ta = run(lane_a)
    until(lambda: gate._waiting_writers, "a is queued behind b")
    tc = run(lane_c)
    until(lambda: len(gate._cond._waiters) >= 2, "c is blocked too (a and c both wait on the condition)")
    b_may_go.set()
    for t in (ta, tb, tc):
        t.join(LONG)
    assert order == ["a times", "c starts"]


def test_a_verdict_gets_its_shared_hold_back_after_timing():
    """After its exclusive phase a verdict holds the gate shared again: another lane's timing
    then waits for the end of the verdict."""
    gate = DeviceGate(2)
    order: list[str] = []
    a_timed, a_may_end = threading.Event(), threading.Event()

    def lane_a():
        with gate.shared():
            with gate.exclusive():
                pass
            a_timed.set()
            a_may_end.wait(LONG)
            order.append("a ends")

    def lane_b():
        with gate.exclusive():
            order.append("b times")

    ta = run(lane_a)
    assert a_timed.wait(LONG)
    tb = run(lane_b)
    until(lambda: gate._waiting_writers, "b waits for a's verdict")
    a_may_end.set()
    ta.join(LONG)
    tb.join(LONG)
    assert order == ["a ends", "b times"]


def test_nested_holds_of_one_thread_never_wait_on_themselves():
    gate = DeviceGate(1)
    with gate.shared():
        with gate.shared():
            with gate.exclusive():
                with gate.exclusive():
                    with gate.shared():
                        pass
    assert gate._shared == 0 and gate._writer is None


def test_a_gate_needs_a_lane():
    with pytest.raises(ValueError):
        DeviceGate(0)


def test_gpu_work_of_the_event_loop_holds_the_gate_shared_until_it_ends():
    """A capture on the GPU (held from a coroutine) may overlap checks, never a timed phase."""
    import asyncio

    gate = DeviceGate(1)
    order: list[str] = []
    timer_waiting = threading.Event()

    def timed_phase():
        timer_waiting.set()
        with gate.exclusive():
            order.append("timed")

    async def capture():
        async with gate.shared_async():
            with gate.shared():  # a check of a verdict goes on beside it
                order.append("checked beside it")
            thread = run(timed_phase)
            assert timer_waiting.wait(LONG)
            await asyncio.to_thread(until, lambda: gate._waiting_writers, "the timed phase waits for the capture")
            order.append("capture done")
        return thread

    thread = asyncio.run(capture())
    thread.join(LONG)
    assert order == ["checked beside it", "capture done", "timed"]
    assert gate._shared == 0 and gate._writer is None


# ---- what a timed shape holds the GPU alone for (verifier/judge.py) ----------------------------
def enlisted_elsewhere(gate: DeviceGate, worker) -> tuple[threading.Thread, threading.Event]:
    """``worker`` enlisted with ``gate`` by another thread (another lane's judge, a compile
    ahead) until the event returned is set; that thread, to join."""
    enlisted, release = threading.Event(), threading.Event()

    def other():
        with gate.enlisted(lambda: worker):
            enlisted.set()
            release.wait(LONG)

    thread = run(other)
    assert enlisted.wait(LONG)
    return thread, release


class _Session:
    def __init__(self):
        self.events: list[str] = []

    def pause(self):
        self.events.append("pause")

    def stopped_seconds(self):
        return 0.0

    def resume(self):
        self.events.append("resume")

    def close(self):
        self.events.append("close")


@pytest.mark.parametrize("audit, hidden", [(False, False), (True, False), (True, True)],
                         ids=["routine", "audit", "audit, a hidden shape"])
def test_only_a_batchs_window_holds_the_gpu_alone(audit, hidden):
    """A timed batch's window holds the gate alone; its verification and the next batch's draw
    hold it shared, so another lane's checks run beside them instead of waiting (before, the
    whole shape was one exclusive hold: verification is most of its seconds). A routine verdict
    times ``batches`` windows of a kind, an audit's second verdict ``audit_batches`` at a public
    shape (what its comparison with the verdict rests on) and ``batches`` at a hidden one."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0", batches=2, audit_batches=3), gate=DeviceGate(2))
    judge._state.audit = audit
    n = 3 if audit and not hidden else 2
    task = load_task("rms_norm")
    shape = task.shapes("cuda", hidden=False)[0]
    alone: dict[str, list[bool]] = {}
    rates: list[float] = []

    def held(op):
        alone.setdefault(op, []).append(judge.gate._writer == threading.get_ident())

    def ask_ref(reply_type, msg, **kw):
        held(msg["op"])
        if msg["op"] == "time_batch":
            rates.append(msg["write_gbps"])
            return M.BatchTimed(op="time_batch", ok=True, done=True, window_ms=1.0, write_ms=0.0, write_floor_ms=0.0)
        if msg["op"] == "verify_batch":
            return M.BatchVerified(op="verify_batch", ok=True, failed_call=-1)
        return M.BatchPlanned(op="plan_batch", ok=True, sets=[]) if msg["op"] == "plan_batch" else None

    def reply(session, reply_type, op, what, timeout=None):
        held(f"worker {op}")
        return M.BatchRan(op="run_batch", ok=True, claimed_s=1e-3)

    judge._ask_ref, judge._reply, judge._send = ask_ref, reply, lambda s, m: held(f"send {m['op']}")
    judge._state.baselines = {shape.params: {"eager_us": 10.0, "compile_us": 5.0}}  # measured before the worker started
    ready = M.BatchReady(op="prepare_batch", ok=True, outputs=[], mode="graph")
    judge._time_prepared(_Session(), task, shape, hidden, 1, 8, 0, [("long", 8)], {"long": ready}, [], {"write_gbps": 4321.0},
                         1 << 30, "timing")
    # the write's floor from the ceilings' rate, measured before any candidate's worker existed;
    # measured by the reference worker beside this one, the candidate could have lowered it
    assert rates == [4321.0] * n
    assert alone == {"plan_batch": [False] * n, "send run_batch": [True] * n, "time_batch": [True] * n,
                     "worker run_batch": [True] * n, "verify_batch": [False] * n}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_captured_batchs_output_places_go_with_its_first_window_only(mode):
    """Resent every window, a batch of 512 calls' places were thousands of records encoded,
    decoded and compared again before each window; a captured batch's graph writes where it was
    captured, so they go with each batch's first window and the reference worker keeps them. An
    eager batch's places are known only after it ran: every window says none before it."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import Judge, JudgeOptions
    from kernforge.verifier.verdict import Rejected

    judge = Judge(None, None, JudgeOptions(device="cuda:0", batches=3), gate=DeviceGate(1))
    task = load_task("rms_norm")
    shape = task.shapes("cuda", hidden=False)[0]
    sent: list[tuple[str, Any]] = []

    def ask_ref(reply_type, msg, **kw):
        if msg["op"] == "time_batch":
            sent.append((msg["key"], msg.get("outputs", "kept") if not msg.get("probe") else "probe"))
            return M.BatchTimed(op="time_batch", ok=True, done=True, window_ms=1.0, write_ms=0.0, write_floor_ms=0.0)
        if msg["op"] == "verify_batch":
            return M.BatchVerified(op="verify_batch", ok=True, failed_call=-1)
        return M.BatchPlanned(op="plan_batch", ok=True, sets=[]) if msg["op"] == "plan_batch" else None

    def places(n, at):
        return [[M.TensorRef(offset=at + 1024 * k, dtype="float32", shape=[4], strides=[1])] for k in range(n)]

    running: list[str] = []

    def reply(session, reply_type, op, what, timeout=None):
        n = 8 if running[-1] == "long" else 1
        return M.BatchRan(op="run_batch", ok=True, claimed_s=1e-3, outputs=places(n, 1 << 20) if mode == "eager" else [])

    judge._ask_ref, judge._reply, judge._send = ask_ref, reply, lambda s, m: running.append(m["id"])
    judge._state.baselines = {shape.params: {}}
    ready = {key: M.BatchReady(op="prepare_batch", ok=True, mode=mode, outputs=places(n, at) if mode == "graph" else [])
             for key, n, at in (("long", 8, 1 << 20), ("short", 1, 1 << 21))}
    expected = [M.OutputMeta(dtype="float32", shape=[4])]
    got = judge._time_prepared(_Session(), task, shape, False, 1, 8, 1, [("long", 8), ("short", 1)], ready, expected,
                               {"write_gbps": 4321.0}, 1 << 30, "timing")
    assert not isinstance(got, Rejected), got
    if mode == "graph":
        firsts = {key: [[r.to_dict() for r in call] for call in ready[key].outputs] for key in ready}
        assert sent == [("long", firsts["long"]), ("short", firsts["short"])] + [("long", "kept"), ("short", "kept")] * 2
    else:
        assert sent == [("long", []), ("long", "probe"), ("short", []), ("short", "probe")] * 3


def test_the_baselines_are_measured_before_the_candidates_worker_exists(tmp_path):
    """A baseline is cached and every later candidate of the task is measured against it. Timed
    beside the candidate's worker, a thread or process of that worker could launch GPU work into
    the baseline's windows (the quiet probe looks only before they start), slowing the reference:
    a fake speedup for the whole night. So each timed shape's baseline is compiled (GPU held
    shared) and timed (held alone) before the worker is started; from the cache the next time."""
    import contextlib

    from kernforge.tasks.loader import load_task
    from kernforge.verifier.cache import JsonCache
    from kernforge.verifier.judge import Judge, JudgeOptions, _Verdict

    judge = Judge(None, None, JudgeOptions(device="cuda:0", cache_dir=tmp_path), gate=DeviceGate(2))
    judge.baseline_cache = JsonCache(tmp_path / "baselines.json")
    judge.environment = lambda: {"gpu": "stand-in", "driver": "0"}
    task = load_task("rms_norm")
    timed = [s for s, _ in judge._timed_shapes(task)]
    assert len(timed) > 1
    events: list[tuple[str, bool]] = []

    def ask_ref(reply_type, msg, **kw):
        events.append((msg["op"], judge.gate._writer == threading.get_ident()))
        return {"eager": {"median_us": 10.0}, "compile": {"median_us": 5.0}} if msg["op"] == "baseline" else {}

    @contextlib.contextmanager
    def candidate_session(backend, source, task, init_seed, layout, compiled=None):
        events.append(("worker started", False))
        yield object(), 1 << 20

    def judged(session, task, *args):
        events.append(("judged", False))
        return sorted(judge._state.baselines.values(), key=str)

    judge._ask_ref, judge._candidate_session, judge._judge = ask_ref, candidate_session, judged
    judge._shape_sizes = lambda task, shapes, seed, **_: {s.params: {"input_bytes": 1 << 20, "output_bytes": 1 << 20} for s in shapes}
    judge.ceilings = lambda: {"bandwidth_gbps": 4000.0, "tflops": 800.0, "write_gbps": 2000.0}
    judge._batch_plan = lambda task, sizes, shapes: {s.params: 8 for s in shapes}
    judge._arena_layout = lambda sizes, checked, plan, **_: {"input_parts": 2, "defer_bytes": 1 << 26}
    for first in (True, False):
        events.clear()
        judge._state, judge._phases = _Verdict(), {}
        got = judge._verify(task.seed_source, task)
        assert got == [{"compile_us": 5.0, "eager_us": 10.0, "eager_mode": None, "eager_spread_pct": None,
                        "compile_mode": None, "compile_spread_pct": None}] * len(timed)
        asked = [("compile_baseline", False), ("baseline", True)] * len(timed) if first else []
        assert events == asked + [("worker started", False), ("judged", False)], "the cached baselines are not measured again"


def test_a_timed_phase_stops_every_other_lanes_worker_instead_of_waiting_for_it():
    """Another lane's candidate is mid-check (its worker computing, its judge holding nothing):
    the timed phase does not wait for that verdict to reach a timed phase of its own (the old
    lockstep: 6-88 s at the gate per verdict with four lanes on the H200). It stops the other
    worker first, times, and lets it go on; its own worker it never stops."""
    from kernforge.verifier.judge import Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(2))
    gate = judge.gate
    theirs, ours = _Session(), _Session()
    enlisted, release = threading.Event(), threading.Event()

    def other_lane():
        with gate.enlisted(lambda: theirs):
            enlisted.set()
            release.wait(LONG)  # its check runs on: the judge waits for the worker's reply

    thread = run(other_lane)
    assert enlisted.wait(LONG)
    with gate.enlisted(lambda: ours):
        with judge._gpu_alone(ours):
            assert theirs.events == ["pause"], "the other lane's worker is stopped before anything is timed"
            ours.events.append("timed")
        assert theirs.events == ["pause", "resume"]
    release.set()
    thread.join(LONG)
    assert ours.events == ["timed"], "the judge's own worker runs its batch"

    single = _Session()
    one = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(1))
    with one.gate.enlisted(lambda: single), one._gpu_alone(single):
        pass
    assert single.events == []


def test_a_worker_does_not_start_while_another_lane_times_and_is_stopped_once_started():
    """A worker starts with the gate held shared (its start is trusted GPU work: a context, the
    arena), so never inside a window; once enlisted, the next timed phase of any other lane stops
    it. Given back once its session ends, it is stopped no more."""
    gate = DeviceGate(2)
    order: list[str] = []
    timing, may_end = threading.Event(), threading.Event()

    def timed_lane():
        with gate.exclusive():
            timing.set()
            may_end.wait(LONG)
            order.append("timed")

    thread = run(timed_lane)
    assert timing.wait(LONG)
    late = _Session()

    def start():
        order.append("started")
        return late

    held = gate.enlisted(start)  # kept: a context manager collected would end its hold
    starter = run(held.__enter__)
    until(lambda: len(gate._cond._waiters) >= 1, "the start waits for the window")
    assert order == []
    may_end.set()
    thread.join(LONG)
    starter.join(LONG)
    assert order == ["timed", "started"]
    with gate.exclusive():
        pass
    assert late.events == ["pause", "resume"]
    held.__exit__(None, None, None)  # its session ended
    with gate.exclusive():
        pass
    assert late.events == ["pause", "resume"]


def test_a_worker_warming_up_is_stopped_by_every_judge_that_times_until_it_is_warm():
    """A pool refills itself in the background while judges time, and a worker's warm-up creates
    a CUDA context and launches Triton's first kernel: now and then a start lands in a window
    (H100, session 62: the worst of 1,350 small windows 5.8 us a call beside starts, 2.9 alone,
    1.3 with the starters stopped). Enlisted as it starts, it is
    stopped for every timed phase, its own judge's too (it belongs to none yet), and no more once
    it is warm."""
    gate = DeviceGate(1)
    warming = _Session()
    warm = gate.warming(warming)
    with gate.exclusive():
        assert warming.events == ["pause"]
    assert warming.events == ["pause", "resume"]
    warm()
    with gate.exclusive():
        pass
    assert warming.events == ["pause", "resume"]


def test_a_worker_that_starts_while_a_judge_times_is_stopped_at_once_without_waiting_for_the_gate():
    """The pool's thread starts workers while a judge holds the gate alone, and that judge may be
    waiting for the pool's next worker (a verdict that holds the whole GPU): the start never waits
    for the gate. The worker is stopped at once, and let go with the rest when the hold ends."""
    gate = DeviceGate(2)
    late = _Session()
    enlisted: list = []
    with gate.exclusive():
        pool = run(lambda: enlisted.append(gate.warming(late)))
        pool.join(LONG)
        assert enlisted, "the pool's thread waited for the gate"
        assert late.events == ["pause"]
    assert late.events == ["pause", "resume"]
    enlisted[0]()
    with gate.exclusive():
        pass
    assert late.events == ["pause", "resume"]


def test_a_judge_holding_the_gate_alone_that_waits_for_a_worker_lets_the_warming_ones_go_meanwhile():
    """A verdict that holds the whole GPU, and the audit's profiled worker, wait for a worker with
    the gate held alone: the one they wait for may be warming, so while they wait none is
    stopped (else the wait never ended); once they have it, the rest are stopped again for the
    windows to come, and let go when the hold ends."""
    gate = DeviceGate(1)
    early, late, session = _Session(), _Session(), _Session()
    warm_early = gate.warming(early)
    with gate.exclusive():
        assert early.events == ["pause"]

        def start():
            assert early.events == ["pause", "resume"], "the worker waited for stays stopped"
            gate.warming(late)
            assert late.events == [], "a worker started for the judge is stopped by it"
            warm_early()  # ready: the pool hands it over
            return session

        with gate.enlisted(start) as got:
            assert got is session and session.events == []
            assert late.events == ["pause"] and early.events == ["pause", "resume"]
    assert late.events == ["pause", "resume"]


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_shapes_windows_stop_others_jobs_once_with_one_lane_and_warming_workers_window_by_window(lanes):
    """Each stop of a job is a walk of /proc or two: with one lane, a shape's run of windows
    stops the jobs others enlisted (a compile ahead's worker) once for the whole run; warming
    workers go on between its windows (a pool run dry costs a compile ahead). With more lanes
    another lane's verdict must not wait through this one's verifications: window by window."""
    gate = DeviceGate(lanes)
    ahead, warming, late = _Session(), _Session(), _Session()
    thread, release = enlisted_elsewhere(gate, ahead)
    gate.warming(warming)
    with gate.others_stopped():
        for window in range(3):
            with gate.exclusive():
                assert ahead.events[-1] == "pause" and warming.events[-1] == "pause"
            if window == 0:  # a job enlisted between windows is stopped by the next window alone
                held = gate.enlisted(lambda: late)  # kept: a context manager collected would end its hold
                late_thread = run(held.__enter__)
                late_thread.join(LONG)
    release.set()
    thread.join(LONG)
    assert warming.events == ["pause", "resume"] * 3
    assert ahead.events == (["pause", "resume"] if lanes == 1 else ["pause", "resume"] * 3)
    assert late.events == ["pause", "resume"] * 2


def test_a_shapes_windows_inside_a_hold_of_the_whole_gpu_leave_others_stopped_to_that_hold():
    """A verdict judged again on the whole GPU (out of memory on a lane's share) holds the gate
    alone from start to end: its shapes' runs of windows must not let others' jobs go when each
    run ends, while the hold still has windows to come."""
    gate = DeviceGate(1)
    ahead = _Session()
    thread, release = enlisted_elsewhere(gate, ahead)
    with gate.exclusive():
        for _ in range(2):
            with gate.others_stopped():
                with gate.exclusive():
                    pass
            assert ahead.events == ["pause"], "a job let go inside the hold"
    assert ahead.events == ["pause", "resume"]
    release.set()
    thread.join(LONG)


def test_a_reference_request_holds_the_gate_shared_for_its_own_length():
    """The trusted work of a verdict (a request to its reference worker) holds the gate shared
    while it runs, and only then: another lane's timing waits for the request in flight, not
    for the verdict."""
    from kernforge.verifier.judge import Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(2))
    seen = []

    def exchange(msg, op, fds, recv_fds, timeout):
        seen.append((op, judge.gate._shared, judge.gate._held_shared()))
        return {"ok": True}, None

    judge._ask_ref_held = exchange
    judge._ask_ref(None, {"op": "forget"})
    assert seen == [("forget", 1, 1)]
    assert judge.gate._shared == 0


def test_a_gpu_kept_busy_by_another_process_times_nothing_and_judges_nobody():
    """The reference worker's quiet probe waited in vain before a window: no verdict (neither the
    candidate's failure nor the task's), the worker closed, and the run is told why (GpuBusy)."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import GpuBusy, Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(1))
    task = load_task("rms_norm")
    shape = task.shapes("cuda", hidden=False)[0]

    def ask_ref(reply_type, msg, **kw):
        if msg["op"] == "time_batch":
            return M.BatchTimed(op="time_batch", ok=True, done=False, busy="another process kept the GPU busy for 20 s",
                                window_ms=0.0, write_ms=0.0, write_floor_ms=0.0)
        return M.BatchPlanned(op="plan_batch", ok=True, sets=[]) if msg["op"] == "plan_batch" else None

    judge._ask_ref, judge._send = ask_ref, lambda s, m: None
    session = _Session()
    ready = M.BatchReady(op="prepare_batch", ok=True, outputs=[], mode="graph")
    with pytest.raises(GpuBusy, match="busy for 20 s"):
        judge._time_prepared(session, task, shape, False, 1, 8, 0, [("long", 8)], {"long": ready}, [], {}, 1 << 30, "timing")
    assert session.events == ["close"]


def test_a_repeat_call_s_wall_leaves_out_the_time_its_worker_spent_stopped():
    """A repeat call's wall clock is set against the worker's own clock (clock.lied: a worker
    that reports less than the judge measured fooled the timer). Another lane's timing can stop
    the worker between the judge's send and the worker's reading of it: that stop is in the
    judge's wall and not in the worker's claim. It is taken off the wall, or an honest kernel
    stopped during every repeat call would be called a cheat."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import Judge, JudgeOptions, _Call

    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(2))
    task = load_task("rms_norm")
    shape = task.shapes("cuda", hidden=False)[0]

    class Stopped(_Session):
        def __init__(self):
            super().__init__()
            self.stopped = 0.0

        def stopped_seconds(self):
            return self.stopped

    session = Stopped()
    call = _Call(shape, task.distributions[0], False, "k" * 32, part=0, repeat_of="j" * 32)
    call.prepared = M.Prepared(op="prepare", ok=True, args=[], slots=[], outputs=[])
    judge._send = lambda s, m: None
    judge._send_check(session, call)
    # the worker: stopped 0.4 s by another lane before it read the call, then 1 ms of work; its
    # reply is read at once (a wrong type ends the verdict there, after the sample is taken)
    call.sent_at -= 0.401
    session.stopped = 0.4

    def reply(s, reply_type, op, what, timeout=None):
        return M.Checked(op="check", ok=True, types=["proxy"], outputs=[], signals=M.Signals(), claimed_s=0.001)

    judge._reply = reply
    judge._finish_check(session, task, call, None, [], 1 << 30, False, 1, {call.key: call})
    (claimed, wall, _), = judge._state.clock
    assert claimed == 0.001
    assert wall < 0.2, "the 0.4 s the worker was stopped is not the call's"


# ---- memory other lanes hold (verifier/judge.py: Judge._verify_free) ---------------------------
def _memory_judge(lanes, free_share, outcomes):
    """A judge whose verdicts are ``outcomes`` in turn (a verdict, or an exception to raise), on a
    GPU with ``free_share`` of its memory free; what each verdict was planned for is recorded."""
    from kernforge.verifier.judge import Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=DeviceGate(lanes))
    judge.check_fits = lambda task: 0
    judge.environment = lambda: {"memory_gib": 100}
    judge.device_memory = lambda: {"total_bytes": 100, "free_bytes": int(100 * free_share)}
    asked, planned = [], []

    def ask_ref(reply_type, msg, **kw):
        asked.append(msg["op"])
        return {"ok": True}

    def verify(source, task):
        planned.append(round(judge._memory_share, 3))
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    judge._ask_ref, judge._verify, judge._drop_ref = ask_ref, verify, lambda: asked.append("fresh reference worker")
    return judge, asked, planned


def _oom():
    from kernforge.verifier.defences import failures
    from kernforge.verifier.verdict import Status

    return failures.OOM.reject(Status.RUNTIME_ERROR, "ran out of memory while checking the public shape M=1")


def test_a_candidate_out_of_memory_beside_other_lanes_is_judged_again_on_the_whole_gpu():
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.verdict import Accepted

    judge, asked, planned = _memory_judge(4, 0.9, [_oom(), Accepted(shapes=())])
    got = judge.verify("source", load_task("rms_norm"))
    assert isinstance(got, Accepted)
    assert planned == [0.25, 0.9], "a lane's share first, then the memory free with the GPU held alone"


def test_out_of_memory_where_other_processes_held_the_gpus_memory_is_nobodys_verdict():
    """An audit planned for the 3 GiB that four lanes left free rejected an honest GEMM (H200,
    session 37): out of memory with less than a lane's share free, the attempt is left unjudged."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.judge import GpuMemoryHeld, ReferenceFailed

    judge, _, planned = _memory_judge(4, 0.05, [_oom(), _oom()])
    with pytest.raises(GpuMemoryHeld, match="5% of the GPU's memory free"):
        judge.verify("source", load_task("rms_norm"))
    assert planned == [0.25, 0.05]
    oom = ReferenceFailed("the task's reference failed on arena: VMMError: cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)")
    judge, _, planned = _memory_judge(4, 0.05, [oom, oom])
    with pytest.raises(GpuMemoryHeld):
        judge.verify("source", load_task("rms_norm"))


def test_out_of_memory_with_a_lanes_share_free_or_more_is_the_candidates():
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.judge import ReferenceFailed
    from kernforge.verifier.verdict import Rejected

    judge, _, planned = _memory_judge(4, 0.5, [_oom(), _oom()])
    got = judge.verify("source", load_task("rms_norm"))
    assert isinstance(got, Rejected) and "ran out of memory" in got.reason
    assert planned == [0.25, 0.5]
    # one lane: a reference out of memory is judged again with what is free; the candidate's own
    # shortage there is its verdict
    oom = ReferenceFailed("the task's reference failed on prepare: OutOfMemoryError: CUDA out of memory")
    judge, _, planned = _memory_judge(1, 0.97, [oom, _oom()])
    assert isinstance(judge.verify("source", load_task("rms_norm")), Rejected)
    assert planned == [1.0, 0.97]


def test_a_verdict_that_held_the_whole_gpu_gives_its_reference_workers_memory_back():
    """Its arena was planned for the whole GPU (a fused_moe verdict's reference worker kept 70 GiB
    on the H200, and the next lane's arena could not be made): with other lanes, a fresh
    reference worker after it. With one lane the worker is kept."""
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.verdict import Accepted

    judge, asked, _ = _memory_judge(4, 1.0, [Accepted(shapes=())])
    judge._needs_the_gpu = lambda need: True
    judge.verify("source", load_task("rms_norm"))
    assert asked == ["forget", "fresh reference worker"]
    judge, asked, _ = _memory_judge(1, 1.0, [Accepted(shapes=())])
    judge._needs_the_gpu = lambda need: True
    judge.verify("source", load_task("rms_norm"))
    assert asked == ["forget"]


# ---- stops and deadlines (red team, session 37) ---------------------------------------------------
class _Recorded:
    """A worker under a real ProcessSession's stop and deadline bookkeeping: its pauses and
    resumes recorded; ``visible``: whether the parent sees its processes (a container's it does
    not where the engine runs in another pid namespace: DockerWorker.freeze_target is None)."""

    def __init__(self, visible: bool = True):
        self.events: list[str] = []
        self.visible = visible

    def freeze_target(self):
        return (1, None) if self.visible else None

    def stopped(self, pids):
        self.events.append("pause")

    def resume(self):
        self.events.append("resume")


def _bookkept(worker, monkeypatch=None):
    import time

    from kernforge.sandbox.session import ProcessSession

    session = ProcessSession.__new__(ProcessSession)
    session.worker, session._lock = worker, threading.Lock()
    session._stopped_s, session._stopped_at = 0.0, None
    session.started = time.monotonic()
    session.deadline = session.started + 100.0
    return session


@pytest.fixture
def no_freeze(monkeypatch):
    """procs.freeze_many stands in: nothing real to stop (pid 1 is not ours)."""
    from kernforge.sandbox import procs

    monkeypatch.setattr(procs, "freeze_many", lambda targets: [(set(), True) for _ in targets])


def test_a_worker_nobody_can_stop_holds_the_gate_shared_to_the_end_of_its_verdict(no_freeze):
    """A container whose processes the parent cannot see cannot be stopped: it is never
    credited with a stop it did not make (its deadline, its timeouts and clock.lied's wall would
    all take that time off), and another lane's timing waits for its verdict to end instead."""
    gate = DeviceGate(2)
    worker = _Recorded(visible=False)
    session = _bookkept(worker)
    base = session.deadline
    order: list[str] = []
    enlisted, done = threading.Event(), threading.Event()

    def other_lane():
        with gate.enlisted(lambda: session):
            enlisted.set()
            done.wait(LONG)
            order.append("its verdict ended")

    thread = run(other_lane)
    assert enlisted.wait(LONG)
    assert gate._enlisted == {} and gate._shared == 1, "not enlisted: its verdict holds the gate shared"
    timer = run(lambda: (gate.exclusive().__enter__(), order.append("timed")))
    until(lambda: gate._waiting_writers, "the timing waits for the verdict")
    done.set()
    thread.join(LONG)
    timer.join(LONG)
    assert order == ["its verdict ended", "timed"]
    assert worker.events == [] and session.stopped_seconds() == 0.0 and session.deadline == base


def test_a_judge_waiting_at_the_gate_has_its_worker_stopped_and_gets_that_time_back_once(no_freeze):
    """While a judge waits for the gate (other lanes' requests in flight, or another lane
    timing), its worker is stopped: the wait is neither the candidate's time nor free running
    time for it. Its deadline moves back by the seconds it was stopped, and only by those (it
    moved by the wait too, counting a stop twice)."""
    from kernforge.verifier.judge import Judge, JudgeOptions

    for holding in ("shared", "exclusive"):
        gate = DeviceGate(2)
        judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=gate)
        worker = _Recorded()
        session = _bookkept(worker)
        base = session.deadline
        enlisted, go, inside, release = (threading.Event() for _ in range(4))

        def our_lane():  # the judge's own thread enlists its worker and times
            with gate.enlisted(lambda: session):
                enlisted.set()
                go.wait(LONG)
                with judge._gpu_alone(session):
                    worker.events.append("timed")

        def other_lane():
            with getattr(gate, holding)():
                inside.set()
                release.wait(LONG)

        ours = run(our_lane)
        assert enlisted.wait(LONG)
        thread = run(other_lane)
        assert inside.wait(LONG)
        go.set()
        until(lambda: gate._waiting_writers, "our judge waits")
        assert worker.events == ["pause"], f"stopped while it waits ({holding})"
        release.set()
        thread.join(LONG)
        ours.join(LONG)
        assert worker.events == ["pause", "resume", "timed"], holding
        moved, stopped = session.deadline - base, session.stopped_seconds()
        assert stopped > 0 and abs(moved - stopped) < 1e-6, (holding, moved, stopped)


def test_a_job_that_does_not_stop_times_nothing(monkeypatch):
    """procs.freeze_many gave up with a process of another lane's job still running: the timed
    phase does not go ahead (GpuBusy: the attempt is left unjudged), and what was stopped goes on."""
    from kernforge.sandbox import procs
    from kernforge.verifier.judge import GpuBusy

    monkeypatch.setattr(procs, "freeze_many", lambda targets: [(set(), False) for _ in targets])
    gate = DeviceGate(2)
    worker = _Recorded()
    session = _bookkept(worker)
    thread, done = enlisted_elsewhere(gate, session)
    with pytest.raises(GpuBusy, match="could not be stopped"):
        with gate.exclusive():
            raise AssertionError("timed beside a running job")
    done.set()
    thread.join(LONG)
    assert worker.events == ["pause", "resume"] and gate._writer is None


def test_a_waiting_judges_own_worker_that_does_not_stop_still_gets_its_turn(monkeypatch):
    """A judge that waits for the gate stops its own worker; where some process of it does not
    stop, the judge still times once the gate is free (its own worker runs in its own window
    anyway) and resumes what did stop: never an error out of the gate, never a worker left stopped."""
    from kernforge.sandbox import procs
    from kernforge.verifier.judge import Judge, JudgeOptions

    monkeypatch.setattr(procs, "freeze_many", lambda targets: [(set(), False) for _ in targets])
    gate = DeviceGate(2)
    judge = Judge(None, None, JudgeOptions(device="cuda:0"), gate=gate)
    worker = _Recorded()
    session = _bookkept(worker)
    inside, release = threading.Event(), threading.Event()

    def other_lane():
        with gate.shared():
            inside.set()
            release.wait(LONG)

    thread = run(other_lane)
    assert inside.wait(LONG)
    def our_lane():
        with judge._gpu_alone(session):
            worker.events.append("timed")

    ours = run(our_lane)
    until(lambda: gate._waiting_writers, "our judge waits")
    release.set()
    thread.join(LONG)
    ours.join(LONG)
    assert worker.events == ["pause", "resume", "timed"]
    assert session.stopped_seconds() >= 0 and session._stopped_at is None


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_timed_batch_past_its_limit_is_a_timeout_with_one_lane_and_unjudged_with_more(lanes):
    """On an H200 two lanes had honest seeds' short batches at tiny shapes run past their limit,
    for a cause not yet found (session 47): with more than one lane that is never a rejection."""
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import Judge, JudgeOptions
    from kernforge.verifier.judge_errors import GpuBusy
    from kernforge.verifier.verdict import Status

    judge = Judge(None, None, JudgeOptions(device="cuda:0", baselines=False), gate=DeviceGate(lanes))
    judge._ask_ref = lambda reply_type, msg, **kw: M.BatchTimed(op="time_batch", ok=True, done=False, window_ms=0.0,
                                                                 write_ms=0.0, write_floor_ms=0.0)
    judge._send = lambda session, msg: None
    ready = M.BatchReady(op="prepare_batch", ok=True, outputs=[], mode="graph")
    session = _Session()
    if lanes > 1:
        with pytest.raises(GpuBusy, match="2 lanes"):
            judge._run_timed(session, "long", ready, 64, [], 1 << 30, 4321.0, "timing")
    else:
        got = judge._run_timed(session, "long", ready, 64, [], 1 << 30, 4321.0, "timing")
        assert got.status is Status.TIMEOUT and "did not finish a timed batch of 64 calls" in got.reason


@pytest.mark.parametrize("quiet, cheat", [(False, False), (True, True)])
def test_a_batch_s_host_readings_decide_whether_its_worker_s_short_clock_is_a_lie(quiet, cheat):
    """The windows of an honest 512-call batch on an H100 whose cores torch.compile's workers
    filled: the worker said 1.8, 1.2 and 1.1 ms where the reference worker's host clock said 4.9,
    4.7 and 2.4 (wake-ups). With the reference worker's readings of a busy host that is no lie
    (clock.LOADED_MARGIN_S); the same figures on a host it saw quiet are one."""
    from types import SimpleNamespace

    from kernforge.tasks.loader import load_task
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import Judge, JudgeOptions

    judge = Judge(None, None, JudgeOptions(device="cuda:0", baselines=False, batches=3), gate=DeviceGate(1))
    task = load_task("fp8_quant_per_group")
    shape = task.shapes("cuda", hidden=False)[0]
    host = {"stall_max": 0.0, "runnable_max": 1.0 if quiet else 4096.0}
    samples = iter([(0.0018007, 0.0049445), (0.0011693, 0.0046683), (0.0011204, 0.0023913)])

    def one_batch(session, task, key, ready, calls, expected, arena_size, ceilings, ctx, placed=False):
        claimed, trusted = next(samples)
        timed = M.BatchTimed(op="time_batch", ok=True, done=True, window_ms=trusted * 1e3, write_ms=0.0, write_floor_ms=0.0,
                             steps={"go_to_done": trusted}, host=host)
        return timed, SimpleNamespace(max_abs_err=0.0, max_rel_err=0.0), claimed

    def ask_ref(reply_type, msg, **kw):
        return M.BatchPlanned(op="plan_batch", ok=True, sets=[])

    judge._ask_ref, judge._one_batch = ask_ref, one_batch
    ready = M.BatchReady(op="prepare_batch", ok=True, outputs=[], mode="graph")
    got = judge._time_prepared(_Session(), task, shape, False, 1, 512, 0, [("long", 512)], {"long": ready}, [], {},
                               1 << 30, "timing")
    called = getattr(got, "threat", None) == 8
    assert called is cheat, got
    if cheat:
        assert "on a quiet host" in got.reason


@pytest.mark.parametrize("answers", [False, True], ids=["silent harness", "harness answers"])
def test_a_harness_silent_through_its_calibration_is_nobodys_verdict_and_not_waited_on_for_long(answers):
    """The judge waits for the harness's calibration while it holds the GPU alone, before the
    candidate's module is loaded. A worker left stopped by a stop/resume race never answered, and
    the judge held every lane back for message_timeout_s (600 s; session 57's two lanes hung).
    It waits a bound of its own, and silence there leaves the attempt unjudged: nothing the
    candidate wrote had run."""
    from kernforge.sandbox.protocol import FailureKind, WorkerFailure
    from kernforge.verifier import messages as M
    from kernforge.verifier.judge import CALIBRATION_REPLY_S, Judge, JudgeOptions
    from kernforge.verifier.judge_errors import WorkerStalled

    judge = Judge(None, None, JudgeOptions(device="cuda:0", baselines=False), gate=DeviceGate(2))
    judge._ask_ref = lambda reply_type, msg, **kw: M.Calibrated(op="calibrate", ok=True, windows_ms=[0.01] * 7,
                                                                writes_ms=[0.001] * 7)
    judge._send = lambda session, msg: None
    waits: list[float] = []

    class Silent(_Session):
        def recv(self, timeout):
            waits.append(timeout)
            if answers:
                return {"op": "calibrate", "ok": True, "rounds": 7}
            raise WorkerFailure(FailureKind.TIMEOUT, f"no message within {timeout}s")

    session = Silent()
    if answers:
        judge._calibrate(session)
        assert judge._state.calibration["harness"] == "7 rounds" and judge._state.clock_cost_ms > 0
    else:
        with pytest.raises(WorkerStalled, match="did not answer its calibration"):
            judge._calibrate(session)
        assert session.events == ["close"]
    assert waits == [CALIBRATION_REPLY_S] and CALIBRATION_REPLY_S < judge.options.message_timeout_s / 5
