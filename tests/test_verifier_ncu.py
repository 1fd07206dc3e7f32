"""The audit's Nsight Compute record (verifier/ncu.py), the profiler prefix of a worker, and the
batch clock's calibrated fixed cost: their pure parts on the CPU (the GPU runs are in
tests/test_verifier_gpu.py)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from kernforge.sandbox import Limits, ProcessBackend, SandboxError, WorkerSpec
from kernforge.tasks.loader import load_task
from kernforge.verifier import ncu
from kernforge.verifier.profiled import Ahead
from kernforge.verifier.audit import Audit, with_profile
from kernforge.verifier.defences import clock
from kernforge.verifier.verdict import Accepted, ShapeResult

TASKS = Path(__file__).parent / "tasks"

TESTS = Path(__file__).resolve().parent
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i: int, name: str, value: str, unit: str = "nsecond") -> str:
    return (f'"{i}","4242","python3","127.0.0.1","{name}","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def _log(*rows: str) -> str:
    return "\n".join(["==PROF== Connected to process 4242 (/usr/bin/python3.12)", HEADER, *rows,
                      "==PROF== Disconnected from process 4242"])


def _profile(*launches: tuple[str, float], calls: int = 2) -> ncu.Profile:
    return ncu.Profile(True, "", tuple(ncu.Launch(n, us) for n, us in launches), calls, {"T": 8, "H": 64})


def test_parse_reads_names_and_units_and_skips_notes():
    text = _log(_row(0, "_rms_kernel", "12,480"), _row(1, "void at::native::reduce_kernel<512, 1>(...)", "3.5", "usecond"),
                '"broken","row"')
    launches = ncu.parse(text)
    assert launches == [ncu.Launch("_rms_kernel", 12.48), ncu.Launch("void at::native::reduce_kernel<512, 1>(...)", 3.5)]
    assert ncu.parse("==ERROR== ERR_NVGPUCTRPERM - no permission") == []


def test_own_kernels_match_as_whole_words():
    assert ncu.is_own("void rms_kernel<256>(float*, int)", ["rms_kernel"])
    assert ncu.is_own("_rms_kernel", ["_rms_kernel"])
    assert not ncu.is_own("rms_kernel_v2", ["rms_kernel"])
    assert not ncu.is_own("void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor>", ["rms_kernel"])


def test_honest_record_passes_and_bookkeeping_is_not_compute():
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, 1>>"
    profile = _profile(("_rms_kernel", 10.0), (fill, 1.0), ("_rms_kernel", 10.0), (fill, 1.0))
    assert profile.per_call_us == 11.0
    assert ncu.judge(profile, ["_rms_kernel"], allow_torch_ops=False, trusted_us=12.0) is None


def test_torch_compute_in_the_record_fails_where_the_task_forbids_it():
    mul = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, MulFunctor>>"
    profile = _profile(("_rms_kernel", 1.0), (mul, 9.0))
    why = ncu.judge(profile, ["_rms_kernel"], allow_torch_ops=False, trusted_us=10.0)
    assert "torch or library kernels" in why and "#16" in why
    assert ncu.judge(profile, ["_rms_kernel"], allow_torch_ops=True, trusted_us=10.0) is None


def test_ghost_kernels_and_an_empty_record_fail():
    why = ncu.judge(_profile(("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", 5.0)), ["_rms_kernel"], True, 10.0)
    assert "none of the candidate's kernels" in why and "#17" in why
    assert "no kernel" in ncu.judge(_profile(), ["_rms_kernel"], True, 10.0)


def test_more_device_time_than_the_trusted_clock_fails():
    profile = _profile(("_rms_kernel", 40.0), ("_rms_kernel", 40.0))  # 40 us per call
    assert "trusted clock missed work" in ncu.judge(profile, ["_rms_kernel"], False, trusted_us=20.0)
    assert ncu.judge(profile, ["_rms_kernel"], False, trusted_us=30.0) is None  # within TIME_RATIO


def _passed_audit(time_us: float) -> Audit:
    shape = ShapeResult(shape={"T": 8, "H": 64}, hidden=False, dtype="bfloat16", timing="graph", time_us=time_us)
    return Audit(True, "accepted again", 10.0, time_us, Accepted(shapes=(shape,)), {"ratio": 1.0})


def test_with_profile_reads_the_record_against_the_audited_time():
    task = load_task(TESTS / "tasks" / "tiny_norm")
    source = "import triton\n@triton.jit\ndef _rms_kernel(x):\n    pass\n"
    ok = with_profile(_passed_audit(30.0), _profile(("_rms_kernel", 40.0), ("_rms_kernel", 40.0)), source, task)
    assert ok.passed and "Nsight Compute saw 2 launches" in ok.reason and ok.details["ncu"]["per_call_us"] == 40.0
    bad = with_profile(_passed_audit(10.0), _profile(("_rms_kernel", 40.0), ("_rms_kernel", 40.0)), source, task)
    assert not bad.passed and bad.reason.startswith("the Nsight Compute record fails it")
    none = with_profile(_passed_audit(10.0), ncu.Profile(False, "no Nsight Compute record: ncu is not installed"), source, task)
    assert none.passed and "ncu is not installed" in none.reason and none.details["ncu"]["ran"] is False


def test_fixed_cost_is_the_least_round_and_needs_enough_rounds():
    assert clock.fixed_cost([0.40, 0.31, 0.55, 0.33], [0.01, 0.01, 0.02, 0.01]) == pytest.approx(0.30)
    assert clock.fixed_cost([0.4, 0.3], [0.0, 0.0]) == 0.0  # too few rounds: nothing taken off
    assert clock.fixed_cost([0.01, 0.2, 0.3], [0.05, 0.0, 0.0]) == 0.0  # never negative


def test_profiler_prefix_is_the_workers_parent_and_its_report_is_whole(tmp_path):
    """The profiler wraps the worker outside its isolation; the session waits for it to exit,
    so a report it writes only then is complete (killing it at close would lose it)."""
    log = tmp_path / "report.txt"
    script = tmp_path / "profiler.sh"
    script.write_text('#!/bin/sh\nlog=$1; shift\n"$@"; rc=$?\nsleep 1\necho "worker exited $rc" > "$log"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none", profiler=(str(script), str(log)))
    with ProcessBackend(spec, pool_size=1, refill=False) as backend:
        session = backend.session("sandbox_jobs.hostile:conversation", {}, Limits(wall_seconds=None))
        session.send({"op": "ask", "value": 3})
        assert session.recv(60)["value"] == 6
        session.send({"op": "stop"})
        assert session.recv(30)["op"] == "stopped"
        session.close()
    assert log.read_text().strip() == "worker exited 0"


def test_docker_refuses_a_profiler():
    pytest.importorskip("docker")
    from kernforge.sandbox.docker_backend import DockerBackend

    with pytest.raises(SandboxError, match="process sandbox only"):
        DockerBackend(WorkerSpec(profiler=(sys.executable,)))


def test_one_nsight_compute_session_per_host_at_a_time(tmp_path, monkeypatch):
    """While one judge holds the profiler, another's attempt to take it does not succeed."""
    import fcntl
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with ncu.exclusive():
        lock = next(tmp_path.glob("kernforge-ncu-*.lock"))
        with open(lock, "a") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as other:  # released on exit
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.timeout(120)  # the old judge never ended the worker: this test would wait for ever
def test_closing_the_judge_ends_an_audits_profiled_worker_still_running(monkeypatch):
    """An audit's Nsight Compute worker runs in the verifying thread; a run abandoned by SIGTERM
    closes its judges from another thread, and the profiled worker must end with them (else the
    process waits for it at exit: on the H200 a stopped run lived on for minutes)."""
    import threading

    from kernforge.verifier.gate import DeviceGate
    from kernforge.verifier.judge import Judge, JudgeOptions

    started = threading.Event()

    class Backend:
        def __init__(self):
            self.closed = threading.Event()

        def close(self):
            self.closed.set()

    backends: list[Backend] = []

    def profiled(prefix):
        backends.append(Backend())
        return backends[-1]

    class Audited(Judge):
        def __init__(self):
            self.on_gpu, self.options, self.gate, self.profiled = True, JudgeOptions(), DeviceGate(), profiled
            self._ref, self._profiling, self._ref_pending, self._closing = None, None, False, False
            self._ahead = Ahead()

        def _shape_sizes(self, task, shapes, init_seed, **_):
            return {s.params: {"input_bytes": 1 << 20, "output_bytes": 1 << 20} for s in shapes}

        def _arena_layout(self, sizes, checked, plan, **_):
            return {}

        def _profiled_calls(self, backend, source, task, shape, init_seed, layout, laps, compiled=None):
            laps.lap("ncu.start")
            started.set()
            backend.closed.wait()  # a profiled worker blocked in its calls until its backend is closed
            return "the sandbox backend was closed"

    monkeypatch.setattr(ncu, "available", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(ncu, "command", lambda exe, log: (exe,))
    judge, got = Audited(), []
    auditing = threading.Thread(target=lambda: got.append(judge.profile("source", load_task(TASKS / "tiny_norm"))))
    auditing.start()
    started.wait()
    judge.close()
    auditing.join()
    assert backends and all(b.closed.is_set() for b in backends)
    assert got and not got[0].ran and "the sandbox backend was closed" in got[0].note
    # where the profiled run's time went travels with the record, though it made none
    assert {"ncu.wait", "ncu.start", "ncu.close"} <= set(got[0].to_dict()["seconds"])
