"""The audit's profiled worker started ahead (verifier/profiled.py): it starts as the audit's
second verdict begins, the Nsight Compute record takes it, and nothing leaves it running.
Stand-in backends on the CPU; the GPU runs are in tests/test_verifier_gpu.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kernforge.sandbox import SandboxError
from kernforge.tasks.loader import load_task
from kernforge.verifier import ncu, profiled
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import Judge, JudgeOptions
from kernforge.verifier.verdict import Accepted

TASKS = Path(__file__).parent / "tasks"


class _Backend:
    """A profiled backend as the judge sees it: made with the profiler's command, closed once;
    asked to wait until its worker is warm, it notes whether ``gate`` was held alone then."""

    def __init__(self, prefix: tuple[str, ...]):
        self.prefix = prefix
        self.closed = threading.Event()
        self.gate: DeviceGate | None = None
        self.waited_with_the_gate: list[bool] = []

    def wait_warm(self, timeout: float | None = None) -> int:
        self.waited_with_the_gate.append(self.gate is not None and self.gate._writer is not None)
        return 1

    def close(self) -> None:
        self.closed.set()


class _Maker:
    """Makes stand-in profiled backends, each told of ``gate`` (the judge's, where set)."""

    def __init__(self, fail: bool = False):
        self.made: list[_Backend] = []
        self.fail = fail
        self.gate: DeviceGate | None = None

    def __call__(self, prefix: tuple[str, ...]) -> _Backend:
        if self.fail:
            raise SandboxError("the profiler cannot run here")
        self.made.append(_Backend(prefix))
        self.made[-1].gate = self.gate
        return self.made[-1]


@pytest.fixture(autouse=True)
def host_lock(monkeypatch, tmp_path):
    """This test's own host-wide Nsight Compute lock file."""
    monkeypatch.setattr(ncu, "lock_path", lambda: tmp_path / "ncu.lock")


def test_one_worker_waits_and_is_handed_over_once(monkeypatch):
    monkeypatch.setattr(ncu, "command", lambda exe, log: (exe, str(log)))
    ahead, make = profiled.Ahead(), _Maker()
    ahead.start(make, "/usr/bin/ncu")
    ahead.start(make, "/usr/bin/ncu")  # one is waiting: no second
    assert len(make.made) == 1 and ahead.waiting
    worker = ahead.take()
    assert worker is not None and worker.backend is make.made[0] and ahead.take() is None
    # its log is named in the profiler's command, inside a folder of its own that the discard removes
    assert make.made[0].prefix == ("/usr/bin/ncu", str(worker.log)) and worker.log.parent.is_dir()
    worker.log.write_text("==PROF== Disconnected")
    assert worker.read_log() == "==PROF== Disconnected"
    assert ncu.try_lock() is None, "a worker started ahead holds the host's lock"
    worker.discard()
    assert make.made[0].closed.is_set() and not worker.log.parent.exists()
    held = ncu.try_lock()
    assert held is not None, "let go with its discard"
    ahead.start(make, "/usr/bin/ncu")
    assert len(make.made) == 1 and not ahead.waiting, "none starts while another holds the lock"
    ncu.unlock(held)


def test_a_worker_that_cannot_start_is_left_to_the_record_and_none_starts_after_close(monkeypatch):
    monkeypatch.setattr(ncu, "command", lambda exe, log: (exe,))
    ahead = profiled.Ahead()
    ahead.start(_Maker(fail=True), "/usr/bin/ncu")
    assert not ahead.waiting
    make = _Maker()
    ahead.start(make, "/usr/bin/ncu")
    ahead.close()
    assert make.made[0].closed.is_set() and not ahead.waiting
    ahead.start(make, "/usr/bin/ncu")
    assert len(make.made) == 1 and not ahead.waiting


class _Audited(Judge):
    """A judge on a GPU whose verdicts and profiled calls are stand-ins: what is left is the
    profiled worker's life around them."""

    def __init__(self, make: _Maker):
        self.on_gpu, self.options, self.gate, self.profiled = True, JudgeOptions(), DeviceGate(), make
        self._ref, self._profiling, self._ref_pending, self._closing = None, None, False, False
        self._ahead = profiled.Ahead()
        self._phases, self._env, self._memory_share, self.calls = {}, {}, 1.0, []

    def check_fits(self, task):
        return 0

    def _verify_held(self, source, task, alone, free=False):
        self.calls.append(("verdict", len(self.profiled.made)))  # how many profiled workers exist as it runs
        return Accepted(shapes=())

    def environment(self):
        return {}

    def _shape_sizes(self, task, shapes, init_seed, **_):
        return {s.params: {"input_bytes": 1 << 20, "output_bytes": 1 << 20} for s in shapes}

    def _arena_layout(self, sizes, checked, plan, **_):
        return {}

    def _profiled_calls(self, backend, source, task, shape, init_seed, layout, laps, compiled=None):
        self.calls.append(("profiled", backend))
        self.compiled = compiled
        return ""


@pytest.fixture
def audited(monkeypatch):
    """A stand-in judge where ncu is installed, its maker of profiled backends, and a task."""
    monkeypatch.setattr(ncu, "available", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "command", lambda exe, log: (exe,))
    make = _Maker()
    judge = _Audited(make)
    make.gate = judge.gate
    return judge, make, load_task(TASKS / "tiny_norm")


def test_an_audits_second_verdict_starts_the_profiled_worker_and_its_record_takes_it(audited):
    judge, make, task = audited
    judge.verify("source", task, audit=True)
    assert judge.calls == [("verdict", 1)], "started before the second verdict ran"
    record = judge.profile("source", task)
    assert judge.calls[-1] == ("profiled", make.made[0]) and len(make.made) == 1
    assert make.made[0].waited_with_the_gate == [False], "its start is waited for before the gate is taken"
    assert make.made[0].closed.is_set() and not judge._ahead.waiting
    assert "ncu.close" in record.seconds  # it made no record (an empty log): that is the record's note
    assert not record.ran and "recorded no kernel" in record.note


def test_a_record_with_no_worker_started_ahead_waits_for_its_own_before_it_takes_the_gate(audited):
    judge, make, task = audited
    judge.profile("source", task)
    assert len(make.made) == 1 and make.made[0].waited_with_the_gate == [False]


def test_the_profiled_worker_is_given_the_kernels_compiled_ahead(audited):
    """An audit's record takes the source's kernels compiled ahead to its worker's session, as a
    verdict does (verifier/triton_ahead.py); without them, it is given none."""
    judge, make, task = audited
    files = {"k/__grp__x.json": "e30="}
    judge.profile("source", task, compiled=files)
    assert judge.compiled == files
    judge.profile("source", task)
    assert judge.compiled is None


def test_a_worker_no_record_took_is_closed_by_the_next_verdict_or_with_the_judge(audited):
    judge, make, task = audited
    judge.verify("source", task, audit=True)  # its audit failed: no record was made
    judge.verify("source", task)
    assert make.made[0].closed.is_set() and judge.calls == [("verdict", 1), ("verdict", 1)]
    judge.verify("source", task, audit=True)
    judge.close()
    assert len(make.made) == 2 and make.made[1].closed.is_set()
    judge.verify("source", task, audit=True)  # closed: nothing starts any more
    assert len(make.made) == 2


def test_no_profiled_worker_starts_ahead_where_ncu_is_missing(monkeypatch):
    monkeypatch.setattr(ncu, "available", lambda: None)
    make = _Maker()
    judge = _Audited(make)
    judge.verify("source", load_task(TASKS / "tiny_norm"), audit=True)
    assert make.made == []


def test_two_lanes_audits_wait_for_the_hosts_ncu_lock_outside_the_gate(monkeypatch):
    """Two judges sharing a GPU's gate, each with an audit in its second verdict. Only the first
    starts a worker ahead, under the host's ncu lock; the second's record waits for that lock
    without the gate, so the first's record can take the gate and finish, and then the second's
    starts its own worker. (Before, each started a worker under ncu at once; inside ncu one waited
    for the other, whose record waited for the gate the first held: no verdict for minutes.)"""
    monkeypatch.setattr(ncu, "available", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "command", lambda exe, log: (exe,))
    task = load_task(TASKS / "tiny_norm")
    gate = DeviceGate(2)
    first, second = _Audited(_Maker()), _Audited(_Maker())
    first.gate = second.gate = gate
    first.verify("source", task, audit=True)
    second.verify("source", task, audit=True)
    assert len(first.profiled.made) == 1 and second.profiled.made == [], "one worker under ncu per host"
    waiting = threading.Thread(target=second.profile, args=("source", task), daemon=True)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and second.calls[-1][0] == "verdict", "its record waits for the lock"
    taken = threading.Event()

    def gate_alone() -> None:
        with gate.exclusive():
            taken.set()

    other = threading.Thread(target=gate_alone, daemon=True)
    other.start()
    assert taken.wait(10), "the second's record waits for the lock without holding the gate"
    first.profile("source", task)
    waiting.join(10)
    assert not waiting.is_alive(), "the first's record let the lock go"
    assert first.calls[-1] == ("profiled", first.profiled.made[0])
    assert len(second.profiled.made) == 1 and second.calls[-1] == ("profiled", second.profiled.made[0])
    assert ncu.try_lock() is not None, "nothing holds the lock now"


def test_a_profiled_worker_warms_up_while_a_judge_holds_the_gate_alone():
    """The audit's worker under Nsight Compute is never stopped while it warms up (a tree of
    ncu's stopped and let go around a judge's windows hung in its warm-up on an H100): the
    backend open_judge makes for it starts a worker that becomes warm while another judge's
    timed phase holds the GPU's gate alone. Here the profiler is ``env`` and the device a name
    only (no GPU): what is shown is the gate's part."""
    from kernforge.loop.evaluate import open_judge

    with open_judge("cuda:0", pool_size=1) as judge, judge.gate.exclusive():
        backend = judge.profiled(("env",))
        try:
            assert backend.wait_warm(60) == 1
        finally:
            backend.close()
