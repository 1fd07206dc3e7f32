"""Hostile candidates against the process backend (THREATS.md #9, #21).

Each test runs one hostile job (tests/sandbox_jobs/hostile.py) in a shared warm pool and checks
three things: the parent gets a classified failure or a result within the limits it set; nothing
leaks (no key, no connection, no file outside the workdir, no process left); and the next job in
the same pool runs normally. Every namespace mechanism this machine offers is exercised.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from kernforge.sandbox import FailureKind, Limits, ProcessBackend, WorkerFailure, WorkerSpec

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from sandbox_helpers import (LIMITS, NEEDLE, REPO, TESTS, assert_connections_refused, assert_next_job_ok,  # noqa: E402
                             leftovers, mechanism_available, plant_secrets, run_job, world_writable_dir)


def _mechanisms() -> list[str]:
    found = [m for m in ("bwrap", "namespaces") if mechanism_available(m)]
    return found or ["strict"]


@pytest.fixture(scope="module", params=_mechanisms())
def pool(request):
    patch = plant_secrets()  # secrets sit in the parent's environment before any worker starts
    backend = ProcessBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation=request.param), pool_size=2)
    yield backend
    backend.close()
    patch.undo()


def nproc_enforced(backend) -> bool:
    return os.geteuid() != 0 or backend.drop_uid


def only_once(backend) -> None:
    """Resource limits act the same under every mechanism: their slow tests run under the first
    (and under the docker backend, which re-runs these tests in test_sandbox_docker.py)."""
    first = _mechanisms()[0]
    if backend.name == "process" and backend.spec.isolation != first:
        pytest.skip(f"mechanism-independent and slow: covered under {first}")


# ---- results and the workdir ------------------------------------------------------------------
def test_honest_job_gets_private_dir_and_unprivileged_uid(pool):
    outcome = run_job(pool, "echo", {"x": [1, 2.5, "three"]})
    assert outcome.message["echo"] == {"x": [1, 2.5, "three"]}
    assert outcome.message["cwd"] == str(outcome.workdir)
    if os.geteuid() == 0 and pool.drop_uid:
        assert outcome.message["uid"] != 0


def test_files_pass_through_workdir_at_same_path(pool):
    with pool.session("sandbox_jobs.hostile:read_back", {}, LIMITS) as session:
        (session.workdir / "from_parent.txt").write_text("hello")
        session.send({"workdir": str(session.workdir)})
        assert session.recv(30) == {"read": "hello"}
        assert (session.workdir / "from_worker.txt").read_text() == "HELLO"


def test_conversation(pool):
    with pool.session("sandbox_jobs.hostile:conversation", {}, LIMITS) as session:
        for value in (1, 21, -4):
            session.send({"op": "ask", "value": value})
            assert session.recv(30) == {"op": "answer", "value": 2 * value}
        session.send({"op": "stop"})
        assert session.recv(30) == {"op": "stopped"}


# ---- hostile jobs -----------------------------------------------------------------------------
def test_infinite_loop_times_out(pool):
    only_once(pool)
    outcome = run_job(pool, "loop_forever", limits=Limits(wall_seconds=2, cpu_seconds=60))
    assert outcome.failure.kind is FailureKind.TIMEOUT
    assert "wall-clock" in outcome.failure.reason
    assert_next_job_ok(pool)


def test_recv_timeout_kills_the_job(pool):
    session = pool.session("sandbox_jobs.hostile:loop_forever", {}, LIMITS)
    with pytest.raises(WorkerFailure) as info:
        session.recv(timeout=1)
    assert info.value.kind is FailureKind.TIMEOUT and "within 1" in info.value.reason
    with pytest.raises(WorkerFailure):
        session.recv(timeout=1)  # a failed session stays failed
    session.close()
    assert_next_job_ok(pool)


@pytest.mark.parametrize("ignore", [False, True], ids=["sigxcpu", "ignored-sigxcpu"])
def test_cpu_limit(pool, ignore):
    only_once(pool)
    outcome = run_job(pool, "burn_cpu_and_ignore_sigxcpu", {"ignore": ignore}, Limits(wall_seconds=60, cpu_seconds=1))
    assert outcome.failure.kind is FailureKind.RESOURCE_LIMIT
    assert "CPU time limit" in outcome.failure.reason
    assert_next_job_ok(pool)


def test_memory_hog_is_stopped(pool):
    limit = 256 << 20
    outcome = run_job(pool, "allocate_forever", limits=Limits(wall_seconds=60, memory_bytes=limit))
    assert outcome.failure.kind is FailureKind.OUT_OF_MEMORY
    assert outcome.diagnostics.peak_rss_bytes > limit
    assert_next_job_ok(pool)


def test_fork_spray_is_limited_and_reaped(pool):
    outcome = run_job(pool, "fork_spray", {"attempts": 200}, Limits(wall_seconds=30, processes=24))
    assert outcome.failure is None
    if nproc_enforced(pool):
        assert outcome.message["failed"] > 0 and outcome.message["started"] < 24
    assert_next_job_ok(pool)


def test_fork_bomb_is_contained(pool):
    only_once(pool)
    if not nproc_enforced(pool):
        pytest.skip("root without a private uid: RLIMIT_NPROC would not hold a fork bomb")
    session = pool.session("sandbox_jobs.hostile:fork_bomb", {}, Limits(wall_seconds=3, processes=24))
    workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
    assert session.recv(30) == {"bombing": True}
    with pytest.raises(WorkerFailure) as info:
        session.recv(60)
    session.close()
    assert info.value.kind is FailureKind.TIMEOUT
    assert leftovers(workdir, uid) == []
    assert_next_job_ok(pool)


def test_segfault_is_crashed_with_signal_name(pool):
    outcome = run_job(pool, "segfault")
    assert outcome.failure.kind is FailureKind.CRASHED
    assert "SIGSEGV" in outcome.failure.reason and outcome.diagnostics.signal == "SIGSEGV"
    assert_next_job_ok(pool)


@pytest.mark.parametrize("job, payload, expected", [
    ("hard_exit", {"code": 0}, "exited with code 0"),
    ("hard_exit", {"code": 7}, "exited with code 7"),
    ("soft_exit", {"code": 3}, "sys.exit(3)"),
    ("raise_error", {}, "ValueError: candidate blew up"),
])
def test_early_exits_are_classified(pool, job, payload, expected):
    outcome = run_job(pool, job, payload)
    assert outcome.failure.kind is FailureKind.EXITED_EARLY
    assert expected in outcome.failure.reason
    assert_next_job_ok(pool)


def test_last_message_before_exit_is_delivered(pool):
    with pool.session("sandbox_jobs.hostile:send_then_exit", {}, LIMITS) as session:
        assert session.recv(30) == {"last": "words"}
        with pytest.raises(WorkerFailure) as info:
            session.recv(30)
    assert info.value.kind is FailureKind.EXITED_EARLY
    assert_next_job_ok(pool)


def test_output_flood_is_truncated(pool):
    limits = Limits(wall_seconds=60, output_bytes=4096)
    outcome = run_job(pool, "flood", {"megabytes": 16}, limits)
    assert outcome.message == {"flooded": True}
    for text, end in ((outcome.diagnostics.stdout, "END-OF-STDOUT"), (outcome.diagnostics.stderr, "END-OF-STDERR")):
        assert text.rstrip().endswith(end)
        assert len(text) < 4096 + 200 and "earlier bytes dropped" in text
    assert_next_job_ok(pool)


def test_endless_output_hits_file_size_limit(pool):
    outcome = run_job(pool, "flood_forever", limits=Limits(wall_seconds=60, file_bytes=8 << 20))
    assert outcome.failure.kind is FailureKind.RESOURCE_LIMIT
    assert "file size limit" in outcome.failure.reason
    assert_next_job_ok(pool)


def test_killing_the_parent_fails(pool):
    outcome = run_job(pool, "kill_parent", {"trusted_pid": os.getpid()})
    if outcome.message is not None:
        assert outcome.message["trusted"] != "could signal"
    else:  # it managed to kill its own supervisor (same uid): the sandbox still ends cleanly
        assert outcome.failure.kind in (FailureKind.CRASHED, FailureKind.EXITED_EARLY)
    if pool.drop_uid:
        assert outcome.message["ppid"] == "Operation not permitted"
    assert_next_job_ok(pool)


def test_no_secret_reaches_the_worker(pool):
    outcome = run_job(pool, "read_secrets", {"needle": NEEDLE})
    assert outcome.message == {"found": []}
    assert NEEDLE not in outcome.diagnostics.stdout + outcome.diagnostics.stderr
    assert_next_job_ok(pool)


def test_no_network(pool):
    if not pool.mechanism.netns:
        pytest.skip("no network namespace on this machine")
    assert_connections_refused(pool)
    assert_next_job_ok(pool)


def test_writes_outside_workdir_do_not_land(pool):
    if not pool.mechanism.mountns:
        pytest.skip("no mount namespace on this machine")
    with world_writable_dir() as open_dir:
        targets = [open_dir / "a.txt", REPO / "escape.txt", Path(f"/tmp/kf-escape-{uuid.uuid4().hex}"),
                   Path(f"/dev/shm/kf-escape-{uuid.uuid4().hex}")]
        outcome = run_job(pool, "write_outside", {"paths": [str(p) for p in targets]})
        assert outcome.message[str(open_dir / "a.txt")] == "Read-only file system"
        assert [p for p in targets if p.exists()] == []
    assert_next_job_ok(pool)


@pytest.mark.parametrize("kind", ["oversized", "not_json", "not_object"])
def test_bad_frames_are_protocol_violations(pool, kind):
    outcome = run_job(pool, "bad_frame", {"kind": kind})
    assert outcome.failure.kind is FailureKind.PROTOCOL_VIOLATION
    assert_next_job_ok(pool)


def test_parent_exception_inside_session_kills_worker(pool):
    with pytest.raises(RuntimeError):
        with pool.session("sandbox_jobs.hostile:fork_spray", {"attempts": 5}, LIMITS) as session:
            workdir = session.workdir
            uid = session.worker.lease.uid if session.worker.lease else None
            session.recv(30)
            raise RuntimeError("the judge's own code failed")
    assert leftovers(workdir, uid) == []
    assert not workdir.exists()
    assert_next_job_ok(pool)


def test_pool_refills(pool):
    assert pool.wait_warm(timeout=120) == pool.pool_size
