"""Helpers shared by the sandbox tests: run a job, and prove nothing of it is left."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernforge.sandbox import Diagnostics, Limits, SandboxError, WorkerFailure
from kernforge.sandbox import isolation, procs

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NEEDLE = f"sk-kernforge-fake-{uuid.uuid4().hex}"
LIMITS = Limits(wall_seconds=30, cpu_seconds=60, memory_bytes=1 << 30, processes=64)
#: Variables that look like secrets; the pools' fixtures put NEEDLE in each before any worker starts.
SECRET_NAMES = ("OPENAI_API_KEY", "CUDA_API_KEY", "KERNFORGE_TOKEN", "MY_PASSWORD")


@dataclass
class Outcome:
    message: dict | None
    failure: WorkerFailure | None
    diagnostics: Diagnostics
    workdir: Path


def leftovers(workdir: Path, uid: int | None) -> list[int]:
    """Processes still running for a finished session: by its private HOME, and by its uid."""
    marker = f"HOME={workdir}".encode() + b"\0"
    found = set(procs.pids_of_uid(uid)) if uid is not None else set()
    for pid in procs.snapshot():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read():
                    found.add(pid)
        except OSError:
            pass
    return sorted(found)


def run_job(backend, job: str, payload: dict | None = None, limits: Limits = LIMITS, timeout: float = 60) -> Outcome:
    session = backend.session(f"sandbox_jobs.hostile:{job}", payload or {}, limits)
    workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
    message = failure = None
    try:
        message = session.recv(timeout)
    except WorkerFailure as e:
        failure = e
    finally:
        diagnostics = session.close()
    assert leftovers(workdir, uid) == [], "a process of the finished session is still running"
    assert not workdir.parent.exists(), "the private folder was not removed"
    return Outcome(message, failure, diagnostics, workdir)


def assert_next_job_ok(backend) -> None:
    token = uuid.uuid4().hex
    outcome = run_job(backend, "echo", {"token": token})
    assert outcome.failure is None, outcome.failure
    assert outcome.message["echo"] == {"token": token}
    assert outcome.message["home"] == str(outcome.workdir)


def parent_fds() -> int:
    """How many descriptors this process (the trusted parent) has open."""
    return len(os.listdir("/proc/self/fd"))


def _settle(backend) -> None:
    """The pool warm (each warm worker holds a few of the parent's descriptors) and, for the
    docker backend, the engine's idle connections closed: the Docker SDK keeps one per URL it
    called (a container's id is in its URLs), up to 25, which is a cache, not a leak."""
    backend.wait_warm(120)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.call("close")


@contextlib.contextmanager
def no_descriptor_leak(backend) -> Iterator[None]:
    """The parent has no more descriptors open after the block than before it."""
    _settle(backend)
    before = parent_fds()
    yield
    _settle(backend)
    assert wait_until(lambda: parent_fds() <= before, timeout=10), f"{parent_fds() - before} descriptors leaked"


def plant_secrets() -> pytest.MonkeyPatch:
    """NEEDLE in the parent's environment under every SECRET_NAMES (``undo()`` the patch after)."""
    patch = pytest.MonkeyPatch()
    for name in SECRET_NAMES:
        patch.setenv(name, NEEDLE)
    return patch


def mechanism_available(name: str) -> bool:
    try:
        return isolation.mechanism(name).name == name
    except SandboxError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (False); never a timing assert."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def assert_connections_refused(backend, hosts: tuple[str, ...] = ("127.0.0.1",), bind: str = "127.0.0.1") -> None:
    """A job's connection to a listener of this machine, at each of ``hosts``, is refused, and
    nothing ever reaches the listener."""
    with socket.socket() as listener:
        listener.bind((bind, 0))
        listener.listen(8)
        listener.setblocking(False)
        for host in hosts:
            outcome = run_job(backend, "connect", {"host": host, "port": listener.getsockname()[1]})
            assert outcome.message["outcome"].startswith("refused"), (host, outcome.message)
        with pytest.raises(BlockingIOError):
            listener.accept()


@contextlib.contextmanager
def world_writable_dir() -> Iterator[Path]:
    """A folder in the repository anyone may write to (only a read-only view can stop a job's
    write there), removed with what landed in it."""
    folder = REPO / f".sandbox-escape-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
