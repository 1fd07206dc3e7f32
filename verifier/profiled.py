"""The audit's profiled worker (verifier/ncu.py), and one started ahead of its use.

A profiled worker is a candidate worker whose parent is Nsight Compute, in a backend of its own
(its log is named in the profiler's command, so each worker has its folder). Its start is the
slow part of the record: on an H100 a worker under ncu took 6.7-8.9 s to be ready (Python, torch
and a CUDA context under the profiler: 7.8 s for a bare ``import torch`` and a first tensor, 5.3 s
without ncu), against 1.6-5 s for the profiled calls and 0.3 s to close.

So an audit starts it as its second verdict begins (``Ahead.start``), and the record takes it
(``Ahead.take``) when that verdict is done, and waits for it to be warm before it takes the gate
(judge.py ``_await_warm``), as it does for a worker it starts itself. Until then it runs only the harness's trusted
warm-up, as every pooled worker does while verdicts run beside it: no candidate code, and nothing
inside the profiled range. Unlike theirs, its warm-up is never stopped while a judge times
(gate.py ``warming``): a worker under ncu whose tree was stopped and let go around the windows
never became ready (loop/evaluate.py ``open_judge`` says what was measured). The candidate's source reaches it only in the record's session, which
holds the GPU alone as before. A worker started ahead that no record took (the second verdict
failed) is closed by the next verdict, or with the judge.

It starts only with the host's Nsight Compute lock (ncu.exclusive) free, and holds it until it
is discarded: two lanes (or two GPUs' judges) each with a worker under ncu warming up at once
waited on each other inside ncu, one of them holding the gate its own record needed (session 47:
a two-lane run on an H100 made no verdict in 184 s). A record without a worker started ahead
takes that lock before the gate, never after it.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from kernforge.sandbox.protocol import Backend, SandboxError

from . import ncu

#: makes a one-worker backend whose workers run under the given profiler command
Make = Callable[[tuple[str, ...]], Backend]


@dataclass
class ProfiledWorker:
    """A backend whose worker runs under ncu, and the folder ncu writes its log to."""

    backend: Backend
    folder: tempfile.TemporaryDirectory
    #: the host's Nsight Compute lock, held from its start ahead until its discard (None: the
    #: record holds the lock itself)
    lock: IO[str] | None = None

    @property
    def log(self) -> Path:
        return Path(self.folder.name) / "ncu.csv"

    def read_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def close(self) -> None:
        """End the worker (ncu writes its log as it exits); the folder stays for ``read_log``."""
        self.backend.close()

    def discard(self) -> None:
        try:
            self.backend.close()
            self.folder.cleanup()
        finally:
            if self.lock is not None:
                ncu.unlock(self.lock)
                self.lock = None


def start(make: Make, exe: str, lock: IO[str] | None = None) -> ProfiledWorker:
    """A profiled worker starting now (its backend warms it up in the background); ``lock``: the
    host's ncu lock it holds until discarded."""
    folder = tempfile.TemporaryDirectory(prefix="kf-ncu-")
    try:
        backend = make(ncu.command(exe, Path(folder.name) / "ncu.csv"))
    except BaseException:
        folder.cleanup()
        raise
    return ProfiledWorker(backend, folder, lock)


class Ahead:
    """At most one profiled worker started before a record needs it. Thread-safe: the judge's
    ``close`` may discard it from another thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: ProfiledWorker | None = None
        self._closed = False

    def start(self, make: Make, exe: str) -> None:
        """Start one unless one is waiting, or the host's ncu lock is taken (another judge
        profiles, or has a worker started ahead). A worker that cannot start is left to the
        record, which starts its own and says why it could not."""
        with self._lock:
            if self._worker is not None or self._closed:
                return
            held = ncu.try_lock()
            if held is None:
                return
            try:
                self._worker = start(make, exe, held)
            except (SandboxError, OSError):
                ncu.unlock(held)
                self._worker = None

    def take(self) -> ProfiledWorker | None:
        """The waiting worker, now the caller's to close; None when there is none."""
        with self._lock:
            worker, self._worker = self._worker, None
            return worker

    def discard(self) -> None:
        """Close the waiting worker, if any."""
        worker = self.take()
        if worker is not None:
            worker.discard()

    def close(self) -> None:
        """Discard the waiting worker; none starts after this."""
        with self._lock:
            self._closed = True
        self.discard()

    @property
    def waiting(self) -> bool:
        with self._lock:
            return self._worker is not None
