"""Helpers shared by the sandbox tests: run a job, and prove nothing of it is left."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from kernforge.sandbox import Diagnostics, Limits, WorkerFailure
from kernforge.sandbox import procs

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NEEDLE = f"sk-kernforge-fake-{uuid.uuid4().hex}"
LIMITS = Limits(wall_seconds=30, cpu_seconds=60, memory_bytes=1 << 30, processes=64)


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


