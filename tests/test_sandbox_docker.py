"""The docker backend (THREATS.md #9, #21): test_sandbox.py's hostile candidates re-run in a warm
pool of worker containers, plus what only containers have: their isolation as the job sees it,
hidden paths, the cgroup's OOM kill, nothing left behind when the parent dies, stale sweeping.

Needs a Docker engine and a current worker image (``kernforge sandbox build-image --from-host``);
tests/conftest.py skips the module otherwise (CI requires both).
"""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

import test_sandbox as hostile  # the process backend's hostile tests, re-run here on containers
from kernforge.sandbox import FailureKind, Limits, WorkerFailure, WorkerSpec
from kernforge.sandbox.docker_backend import (LABEL_BACKEND, LABEL_OWNER, LABEL_ROLE, DockerBackend, owner_id,
                                              sweep_stale)
from kernforge.sandbox.docker_worker import PRIVATE_PREFIX
from sandbox_helpers import (LIMITS, NEEDLE, REPO, TESTS, assert_connections_refused, assert_next_job_ok,
                             plant_secrets, run_job, wait_until, world_writable_dir)

pytestmark = pytest.mark.docker

# The same tests, collected here with this module's `pool` (a DockerBackend), the descriptor
# channel's included. Two of them assert process-backend specifics and have container versions
# below; one runs a process backend of its own; one writes a package into the host's
# site-packages, which a container sees only as its image was built.
REUSED = [name for name in dir(hostile) if name.startswith("test_")
          and name not in ("test_killing_the_parent_fails", "test_writes_outside_workdir_do_not_land",
                           "test_descriptors_in_a_trusted_worker",
                           "test_a_job_reads_the_bytecode_compiled_beside_the_sources_and_cannot_plant_its_own")]
globals().update({name: getattr(hostile, name) for name in REUSED})


def containers(backend_id: str) -> list[dict]:
    import docker

    client = docker.from_env()
    try:
        return client.api.containers(all=True, filters={"label": f"{LABEL_BACKEND}={backend_id}"})
    finally:
        client.close()


@pytest.fixture(scope="module")
def pool():
    patch = plant_secrets()
    backend = DockerBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}), pool_size=2)
    yield backend
    backend.close()
    patch.undo()
    assert containers(backend.backend_id) == [], "closing the backend left containers behind"


# ---- container versions of two process-backend tests -------------------------------------------
def test_killing_the_parent_fails(pool):
    """The supervisor is pid 1 of the container: the job's SIGKILL to it is dropped by the kernel,
    and the trusted parent is not even in its pid namespace."""
    outcome = run_job(pool, "kill_parent", {"trusted_pid": os.getpid()})
    assert outcome.failure is None, outcome.failure
    assert outcome.message["trusted"] == "No such process"
    assert_next_job_ok(pool)


def test_writes_outside_workdir_do_not_land(pool):
    with world_writable_dir() as open_dir:
        targets = [open_dir / "a.txt", TESTS / "escape.txt", REPO / "escape.txt",
                   Path(f"/tmp/kf-escape-{uuid.uuid4().hex}"), Path(f"/dev/shm/kf-escape-{uuid.uuid4().hex}")]
        outcome = run_job(pool, "write_outside", {"paths": [str(p) for p in targets]})
        # The bound code folder is read-only; the rest of the host is not there at all.
        assert outcome.message[str(TESTS / "escape.txt")] == "Read-only file system"
        assert outcome.message[str(open_dir / "a.txt")] == "No such file or directory"
        assert [p for p in targets if p.exists()] == []
    assert_next_job_ok(pool)


# ---- what the job sees of its container --------------------------------------------------------
def test_job_sees_a_locked_down_container(pool, tmp_path):
    secret = tmp_path / "archive.db"
    secret.write_text("not for candidates")
    with pool.session("sandbox_jobs.container:probe", {"paths": [str(secret), str(REPO / "cli.py"), str(TESTS)]},
                      LIMITS) as session:
        seen = session.recv(30)
    assert seen["uid"] != 0 and seen["gid"] != 0
    assert seen["cap_eff"] == seen["cap_bnd"] == "0000000000000000"
    assert seen["no_new_privs"] == "1"
    assert seen["root_write"] == "Read-only file system"
    assert seen["interfaces"] == ["lo"]
    assert seen["ppid"] == 1 and "kernforge.sandbox.docker_entry" in seen["init"]
    assert seen["seen"] == {str(secret): False, str(REPO / "cli.py"): False, str(TESTS): True}


def test_rendezvous_files_are_gone_before_any_job(pool):
    """The entry point joined every channel (FIFOs, control socket, descriptor socket) and their
    files were removed before the job existed: a candidate finds nothing in chan/ to open."""
    with pool.session("sandbox_jobs.hostile:conversation", {}, LIMITS) as session:
        chan = session.worker.private / "chan"
        assert list(chan.iterdir()) == []
        assert session.worker.fds_sock is not None
    names = [str(chan / name) for name in ("to_worker", "from_worker", "control", "fds")]
    with pool.session("sandbox_jobs.container:probe", {"paths": names}, LIMITS) as session:
        seen = session.recv(30)
    assert seen["seen"] == {name: False for name in names}


def test_container_configuration(pool):
    with pool.session("sandbox_jobs.hostile:conversation", {}, LIMITS) as session:
        info = pool.engine.call("inspect_container", session.worker.container_id)
    assert NEEDLE not in str(info), "a key of the parent reached what the engine stores"
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["AutoRemove"]
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == pool.plan.memory_bytes and host["PidsLimit"] == pool.plan.pids
    assert info["Config"]["Labels"][LABEL_BACKEND] == pool.backend_id


def test_hidden_path_under_a_bound_folder_is_covered():
    hidden = TESTS / "tasks"
    with DockerBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}, hidden_paths=(str(hidden),)), pool_size=1) as backend:
        some_task = sorted(hidden.glob("*.py"))[0]
        outcome = run_job(backend, "read_hidden", {"paths": [str(some_task), str(TESTS / "candidates.py")]})
        assert outcome.message[str(some_task)].startswith("error:")
        assert "ModelNew" in outcome.message[str(TESTS / "candidates.py")]
    assert containers(backend.backend_id) == []


def test_container_memory_cap_is_an_out_of_memory_failure():
    """Past the container's cgroup cap the kernel kills the job; the session says why."""
    with DockerBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}), pool_size=1, memory_bytes=64 << 20) as backend:
        outcome = run_job(backend, "allocate_forever", limits=Limits(wall_seconds=60, memory_bytes=16 << 30))
        assert outcome.failure.kind is FailureKind.OUT_OF_MEMORY
        assert "memory cap" in outcome.failure.reason
        assert_next_job_ok(backend)


# ---- nothing left behind -----------------------------------------------------------------------
PARENT = """
import sys, time
sys.path.insert(0, {tests!r})
from kernforge.sandbox import Limits, WorkerSpec
from kernforge.sandbox.docker_backend import DockerBackend
backend = DockerBackend(WorkerSpec(env={{"PYTHONPATH": {tests!r}}}), pool_size=2)
session = backend.session("sandbox_jobs.hostile:fork_spray", {{"attempts": 5}}, Limits(wall_seconds=600))
session.recv(120)
backend.wait_warm(120)
print(backend.backend_id, flush=True)
time.sleep(600)
"""


def test_killed_parent_leaves_no_container():
    """SIGKILL the parent while one container runs a job with children and two wait warm: every
    supervisor sees its control socket close, kills its container, and the engine removes it."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(tests=str(TESTS))], stdout=subprocess.PIPE, text=True)
    try:
        backend_id = parent.stdout.readline().strip()
        assert backend_id, "the parent did not start its pool"
        assert len(containers(backend_id)) == 3
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert wait_until(lambda: containers(backend_id) == []), containers(backend_id)
    sweep_stale_engine()
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"{PRIVATE_PREFIX}{parent.pid}-*")) == []


def sweep_stale_engine() -> int:
    import docker

    from kernforge.sandbox.docker_worker import Engine

    client = docker.from_env()
    try:
        return sweep_stale(Engine(client))
    finally:
        client.close()


def test_stale_containers_and_folders_are_swept_on_start(pool):
    """A container and a private folder of an owner that no longer exists (a parent killed between
    creating and starting a container) go when the next backend starts."""
    dead_owner = owner_id().rsplit("/", 2)[0] + "/999999999/1"
    created = pool.engine.call("create_container", pool.image.id, command=["true"],
                               labels={LABEL_ROLE: "worker", LABEL_OWNER: dead_owner, LABEL_BACKEND: "stale-test"})
    folder = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}999999999-"))
    (folder / "work").mkdir()
    assert len(containers("stale-test")) == 1
    with DockerBackend(WorkerSpec(), pool_size=0):
        pass
    assert containers("stale-test") == [], created
    assert not folder.exists()


def test_connection_to_the_host_is_refused(pool):
    """Not even the host's loopback: the container has a network namespace of its own."""
    assert_connections_refused(pool, hosts=("127.0.0.1", socket.gethostbyname(socket.gethostname())), bind="0.0.0.0")


def test_image_from_other_sources_runs_this_kernforge(monkeypatch):
    """An image built from other kernforge sources gets this kernforge's worker packages bound over
    its copy (never a protocol mismatch); the built-in tasks' hidden shapes stay out of sight."""
    from kernforge.sandbox import docker_image

    monkeypatch.setattr(docker_image, "source_digest", lambda: "not-the-image-sources")
    with DockerBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}), pool_size=1) as backend:
        assert backend.image.stale
        builtin = f"{docker_image.IMAGE_PACKAGE}/tasks/builtin"
        with backend.session("sandbox_jobs.container:probe", {"paths": [builtin, f"{builtin}/rms_norm/meta.py"],
                                                              "read": [f"{docker_image.IMAGE_PACKAGE}/sandbox/worker.py"]},
                             LIMITS) as session:
            seen = session.recv(30)
    assert seen["seen"] == {builtin: True, f"{builtin}/rms_norm/meta.py": False}
    assert seen["read"][f"{docker_image.IMAGE_PACKAGE}/sandbox/worker.py"] == (REPO / "sandbox" / "worker.py").read_text()


@pytest.mark.gpu
def test_gpu_worker_gets_exactly_one_gpu_and_runs_triton():
    """A GPU worker container sees one GPU (device 0 inside) and runs a Triton kernel on it, with
    or without the NVIDIA container runtime."""
    spec = WorkerSpec(device="0", preload=("torch", "triton", "sandbox_jobs.gpu"), warmup="sandbox_jobs.gpu:warm",
                      env={"PYTHONPATH": str(TESTS)})
    with DockerBackend(spec, pool_size=1) as backend:
        limits = Limits(wall_seconds=300)
        with backend.session("sandbox_jobs.container:probe", {"cuda": True}, limits) as session:
            seen = session.recv(300)
        assert seen["cuda_devices"] == 1 and seen["visible"] == "0", (backend.gpu_detail, seen)
        with backend.session("sandbox_jobs.gpu:add_one", {"n": 4096}, limits) as session:
            reply = session.recv(300)
        assert reply["ok"], reply


def test_a_containers_output_counts_against_its_disk_limits(pool):
    """A container's stdout and stderr are files on the host's disk (the process backend keeps
    them in a ring in memory): a job that prints without end is stopped by the same limits as
    one that fills its folder (red team: 8 GiB past the limit, from reading the code)."""
    limits = Limits(**{**LIMITS.to_dict(), "disk_bytes": 16 << 20, "disk_entries": 1000})
    with pool.session("sandbox_jobs.hostile:flood_forever", {}, limits) as session:
        with pytest.raises(WorkerFailure) as ended:
            session.recv(120)
    assert ended.value.kind is FailureKind.RESOURCE_LIMIT and "on the host's disk holds" in ended.value.reason, ended.value
