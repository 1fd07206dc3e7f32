"""The process backend's life cycle: trusted long-lived workers, broken specs, hidden paths,
closing with work in flight, and (on a GPU machine) pinned GPU pools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernforge.sandbox import FailureKind, Limits, ProcessBackend, SandboxError, WorkerFailure, WorkerSpec
from kernforge.sandbox.isolation import UNSHARE_VARIANTS, Mechanism

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from sandbox_helpers import (LIMITS, NEEDLE, TESTS, assert_connections_refused, leftovers,  # noqa: E402
                             mechanism_available, run_job, wait_until)

SPEC = WorkerSpec(env={"PYTHONPATH": str(TESTS)})


def test_trusted_long_lived_worker(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", NEEDLE)
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none")
    with ProcessBackend(spec, pool_size=1, refill=False) as backend:
        assert backend.wait_warm(120) == 1
        session = backend.session("sandbox_jobs.hostile:conversation", {}, Limits(wall_seconds=None))
        assert session.deadline == float("inf")
        for value in range(5):
            session.send({"op": "ask", "value": value})
            assert session.recv(30)["value"] == 2 * value
        assert backend.counts()["started"] == 1  # no twin warming up behind a trusted worker
        workdir = session.workdir
        session.close()
        assert leftovers(workdir, None) == []
        secrets = run_job(backend, "read_secrets", {"needle": NEEDLE})
        assert secrets.message == {"found": []} or all(not f.startswith("env") for f in secrets.message["found"])
        assert backend.counts()["started"] == 2  # started on demand


def test_the_pool_says_how_long_a_worker_took_to_start(monkeypatch):
    """What a run's log shows where a compile ahead found no worker to spare: whether the pool was
    too small, or its workers too slow to start, for the verdicts."""
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none")
    with ProcessBackend(spec, pool_size=2) as backend:
        assert backend.wait_warm(120) == 2
        counts = backend.counts()
        assert counts["ready"] == 2 and counts["start_ms"] > 0, counts


def test_a_pool_worker_starting_while_a_judge_times_stays_stopped_until_the_window_ends():
    """The pool tells the GPU's gate of each worker it starts (``starts``): a worker that starts
    while a judge holds the gate alone is stopped, its whole tree, before its warm-up can put
    anything on the GPU, and goes on to be warm once the hold ends; then the gate lets it be."""
    from kernforge.sandbox import procs
    from kernforge.verifier.gate import DeviceGate

    gate = DeviceGate(1)
    seen = []

    def starts(worker):
        seen.append(worker)
        return gate.warming(worker)

    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none")
    window = gate.exclusive()
    window.__enter__()
    try:
        with ProcessBackend(spec, pool_size=1, starts=starts) as backend:
            assert wait_until(lambda: bool(seen))
            pid = seen[0].proc.pid
            assert wait_until(lambda: getattr(procs.snapshot().get(pid), "state", "") in ("t", "T")), \
                "the starting worker ran on beside the window"
            assert backend.counts()["ready"] == 0
            window.__exit__(None, None, None)
            window = None
            assert backend.wait_warm(120) == 1
            assert not gate._enlisted, "a warm worker is stopped no more"
    finally:
        if window is not None:
            window.__exit__(None, None, None)


def test_a_judge_holding_the_gate_alone_gets_the_worker_its_pool_starts_meanwhile():
    """A verdict holding the whole GPU (or the audit's profiled record) waits for its pool's next
    worker with the gate held alone: that worker's start is not stopped by it."""
    from kernforge.verifier.gate import DeviceGate

    gate = DeviceGate(1)
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none")
    with gate.exclusive():
        with ProcessBackend(spec, pool_size=1, starts=gate.warming, start_timeout=60) as backend:
            with gate.enlisted(lambda: backend.session("sandbox_jobs.hostile:conversation", {}, LIMITS)) as session:
                session.send({"op": "ask", "value": 4})
                assert session.recv(60)["value"] == 8


def test_trusted_worker_process_group_is_killed():
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none")
    with ProcessBackend(spec, pool_size=0) as backend:
        outcome = run_job(backend, "fork_spray", {"attempts": 5})
        assert outcome.message["started"] == 5


def test_broken_warmup_is_reported_not_retried_forever():
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, warmup="sandbox_jobs.hostile:broken_warmup")
    with ProcessBackend(spec, pool_size=1) as backend:
        with pytest.raises(SandboxError, match="warm-up is broken on purpose"):
            backend.session("sandbox_jobs.hostile:echo", {}, LIMITS)
        started = backend.counts()["started"]
        assert started <= 2 * 3  # gave up after a few failures (at most two starts in flight)
        with pytest.raises(SandboxError, match="warm-up is broken on purpose"):
            backend.session("sandbox_jobs.hostile:echo", {}, LIMITS)
        assert backend.counts()["started"] == started


def test_missing_preload_is_reported():
    with ProcessBackend(WorkerSpec(preload=("no_such_module_kf",)), pool_size=1) as backend:
        with pytest.raises(SandboxError, match="no_such_module_kf"):
            backend.wait_warm(120)


@pytest.mark.parametrize("env", [{"OPENAI_API_KEY": "x"}, {"CUDA_TOKEN": "x"}, {"LD_PRELOAD": "/x.so"},
                                 {"HOME": "/root"}, {"CUDA_VISIBLE_DEVICES": "1"}])
def test_spec_env_is_checked(env):
    with pytest.raises(SandboxError):
        ProcessBackend(WorkerSpec(env=env), pool_size=0)


def test_unknown_isolation_is_refused():
    with pytest.raises(SandboxError):
        WorkerSpec(isolation="paranoid")


def test_close_with_busy_and_warm_workers_leaves_nothing():
    backend = ProcessBackend(SPEC, pool_size=2)
    backend.wait_warm(120)
    session = backend.session("sandbox_jobs.hostile:fork_spray", {"attempts": 5}, LIMITS)
    session.recv(30)
    uid = session.worker.lease.uid if session.worker.lease else None
    private_dirs = [session.workdir.parent] + [w.private for w in list(backend._ready) + backend._starting]
    backend.close()
    assert leftovers(session.workdir, uid) == []
    assert [d for d in private_dirs if d.exists()] == []
    with pytest.raises(SandboxError):
        session.recv(1)
    with pytest.raises(SandboxError):
        backend.session("sandbox_jobs.hostile:echo", {}, LIMITS)


@pytest.mark.parametrize("isolation", ["strict", "bwrap", "namespaces"])
def test_hidden_paths_look_empty(tmp_path, isolation):
    """Under /tmp (pytest's tmp_path) too, with either mechanism: the H200 has no bwrap, so the
    worker's own mount(2) plan must hide them as well as bwrap does."""
    if isolation != "strict" and not mechanism_available(isolation):
        pytest.skip(f"no {isolation} here")
    secret_dir = tmp_path / "hidden_tests"
    secret_dir.mkdir()
    (secret_dir / "shapes.txt").write_text("hidden shape 4097")
    secret_file = tmp_path / "kernforge.db"
    secret_file.write_text("archive rows")
    for p in (tmp_path, secret_dir):  # readable by anyone: only hiding can protect them
        p.chmod(0o755)
    secret_file.chmod(0o644)
    (secret_dir / "shapes.txt").chmod(0o644)
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, hidden_paths=(str(secret_dir), str(secret_file)),
                      isolation=isolation)
    with ProcessBackend(spec, pool_size=0) as backend:
        if not backend.mechanism.mountns:
            pytest.skip("no mount namespace on this machine")
        outcome = run_job(backend, "read_hidden", {"paths": [str(secret_dir / "shapes.txt"), str(secret_file)]})
    assert "hidden shape" not in str(outcome.message) and "archive rows" not in str(outcome.message)


def test_session_raises_classified_failure_on_send_to_dead_worker():
    with ProcessBackend(SPEC, pool_size=0) as backend:
        session = backend.session("sandbox_jobs.hostile:segfault", {}, LIMITS)
        with pytest.raises(WorkerFailure) as info:
            for _ in range(10_000):  # until the pipe breaks or the crash is noticed
                session.send({"pad": "x" * 4096}, timeout=30)
        session.close()
    assert info.value.kind is FailureKind.CRASHED


# ---- GPU pools (run on the H200: python -m pytest -m gpu) -----------------------------------------
@pytest.mark.gpu
def test_gpu_pool_pins_its_device_and_runs_a_kernel():
    spec = WorkerSpec(device="0", preload=("torch", "triton"), warmup="sandbox_jobs.gpu:warm",
                      env={"PYTHONPATH": str(TESTS)})
    with ProcessBackend(spec, pool_size=1) as backend:
        backend.wait_warm(300)
        with backend.session("sandbox_jobs.gpu:add_one", {"n": 1000}, Limits(wall_seconds=120)) as session:
            reply = session.recv(120)
    assert reply["ok"] and reply["visible"] == "0" and reply["device_count"] == 1
    assert reply["uid"] != 0 or os.geteuid() != 0 or not backend.drop_uid


@pytest.mark.gpu
def test_gpu_worker_crash_does_not_poison_the_next():
    spec = WorkerSpec(device="0", preload=("torch", "triton"), warmup="sandbox_jobs.gpu:warm",
                      env={"PYTHONPATH": str(TESTS)})
    with ProcessBackend(spec, pool_size=1) as backend:
        outcome = run_job(backend, "segfault", timeout=120)
        assert outcome.failure.kind is FailureKind.CRASHED
        with backend.session("sandbox_jobs.gpu:add_one", {"n": 10}, Limits(wall_seconds=120)) as session:
            assert session.recv(120)["ok"]


@pytest.mark.parametrize("flags", UNSHARE_VARIANTS, ids=lambda f: "+".join(x.strip("-") for x in f))
def test_every_unshare_fallback_isolates(flags, monkeypatch):
    """Hosts without bwrap (the H200) use the strongest unshare variant they allow: each one must
    still keep the network and the parent's secrets out, and leave nothing behind."""
    monkeypatch.setenv("OPENAI_API_KEY", NEEDLE)
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    command = ("unshare",) + user + flags
    if not shutil.which("unshare") or subprocess.run(list(command) + ["true"], capture_output=True).returncode:
        pytest.skip(f"{' '.join(command)} does not work here")
    mech = Mechanism("namespaces", " ".join(command), netns=True, pidns="--pid" in flags, mountns="--mount" in flags,
                     command=command)
    with ProcessBackend(SPEC, pool_size=2, mechanism=mech) as backend:
        assert_connections_refused(backend)
        assert run_job(backend, "read_secrets", {"needle": NEEDLE}).message == {"found": []}
        spray = run_job(backend, "fork_spray", {"attempts": 10})  # leftovers are checked inside
        assert spray.message["started"] == 10


def test_unserialisable_payload_does_not_leak_the_worker():
    with ProcessBackend(SPEC, pool_size=1) as backend:
        backend.wait_warm(120)
        private = backend._ready[0].private
        with pytest.raises(TypeError):
            backend.session("sandbox_jobs.hostile:echo", {"x": object()}, LIMITS)
        assert not private.exists() and backend.counts()["busy"] == 0
        assert run_job(backend, "echo", {"ok": 1}).message["echo"] == {"ok": 1}


PARENT_SCRIPT = """
import json, os, sys
from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
from kernforge.sandbox.isolation import Mechanism
with ProcessBackend(WorkerSpec(env={"PYTHONPATH": sys.argv[1]}), pool_size=0, mechanism=Mechanism("none", "")) as backend:
    with backend.session("sandbox_jobs.hostile:read_secrets", {"needle": os.environ["OPENAI_API_KEY"]},
                         Limits(wall_seconds=60)) as s:
        print(json.dumps(s.recv(60)))
"""


def test_parent_environ_unreadable_without_pid_namespace():
    """With no namespaces at all, a worker runs as the parent's own user and sees it in /proc: a
    key in the parent's initial environment must still be out of its reach (the parent makes
    itself non-dumpable). Simulated as root with every capability dropped, like a plain user."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to simulate an unprivileged parent")
    drop_all = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"]
    env = dict(os.environ, OPENAI_API_KEY=NEEDLE)
    done = subprocess.run(drop_all + [sys.executable, "-c", PARENT_SCRIPT, str(TESTS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"found": []}


ORPHAN_SCRIPT = """
import sys, time
from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
backend = ProcessBackend(WorkerSpec(env={"PYTHONPATH": sys.argv[1]}, isolation=sys.argv[2]), pool_size=1)
session = backend.session("sandbox_jobs.hostile:" + sys.argv[3], {"attempts": 5}, Limits(wall_seconds=None))
session.send({"op": "ask", "value": 1})
session.recv(60)
backend.wait_warm(120)
for worker in [session.worker] + list(backend._ready):
    print(worker.workdir, worker.lease.uid if worker.lease else "", flush=True)
print("end", flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("isolation, job", [("strict", "fork_spray"), ("namespaces", "fork_spray"), ("none", "conversation")])
def test_workers_die_with_a_killed_parent(isolation, job):
    """The judge's process is SIGKILLed mid-session (no cleanup code runs): its busy and warm
    workers, and everything they started, must go too. (A trusted worker's job is trusted: it
    does not detach children, which only a pid namespace would catch.)"""
    if isolation == "namespaces" and not mechanism_available("namespaces"):
        pytest.skip("no unshare here")
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, str(TESTS), isolation, job],
                              stdout=subprocess.PIPE, text=True)
    workers = []
    try:
        for line in parent.stdout:
            if line.strip() == "end":
                break
            workdir, _, uid = line.strip().partition(" ")
            workers.append((Path(workdir), int(uid) if uid else None))
        assert len(workers) == 2, "the parent did not start its session and its warm worker"
        assert all(leftovers(*w) for w in workers)  # alive before the kill
    finally:
        parent.kill()
        parent.wait()
    # Generous: the supervisor notices within about a second.
    wait_until(lambda: not any(leftovers(*w) for w in workers), timeout=30)
    assert [w for w in workers if leftovers(*w)] == []
    assert all(workdir.parent.exists() for workdir, _ in workers)  # nobody was left to clean up...
    ProcessBackend(SPEC, pool_size=0).close()
    assert [w for w, _ in workers if w.parent.exists()] == []  # ...until the next backend starts
