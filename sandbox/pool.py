"""ProcessBackend: a warm pool of pre-started workers for one device, refilled in the background.

One pool per GPU (its workers see only that GPU) and one for the CPU. A single thread per pool
starts every worker (bwrap's --die-with-parent is tied to the thread that started it, so that
thread lives as long as the pool), notices when one is warm or dies idle, and polices busy
sessions: the wall deadline and the memory of each worker's whole process tree.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import select
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping

from . import procs
from .env import worker_env
from .isolation import Mechanism, make_undumpable
from .isolation import mechanism as choose_mechanism
from .protocol import FailureKind, HomeSeed, Limits, SandboxError, WorkerFailure, WorkerSpec
from .session import ProcessSession
from .spawn import Worker, remove_stale_private_dirs
from .uids import uid_drop_status

#: How often busy sessions are checked (memory, deadline). A job can overshoot its memory limit
#: by what it allocates in this time. Trusted (long-lived) workers are checked less often.
MONITOR_SECONDS = 0.1
TRUSTED_MONITOR_SECONDS = 0.5
#: A pool that fails to start this many workers in a row stops trying and reports why.
MAX_START_FAILURES = 3
#: the last workers' start times kept (counts()'s median)
START_TIMES_KEPT = 16

log = logging.getLogger(__name__)
_live_backends: "weakref.WeakSet[ProcessBackend]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for backend in list(_live_backends):
        backend.close()


class ProcessBackend:
    """The default Backend: workers are local processes isolated as ``spec.isolation`` says.

    ``pool_size`` workers are kept warm (started, preloaded, warmed up, waiting for a job). With
    ``refill=False`` they are started once and later sessions start a worker on demand: right for
    one long-lived trusted worker, which must not have a twin warming up behind it.
    """

    name = "process"
    #: the session type handed out; the docker backend substitutes its own
    session_class = ProcessSession

    def __init__(self, spec: WorkerSpec, pool_size: int = 1, *, refill: bool = True,
                 start_timeout: float = 600.0, mechanism: Mechanism | None = None,
                 starts: Callable[[Worker], Callable[[], None]] | None = None, seed: HomeSeed | None = None):
        """``starts``: told of each worker as it is started, it returns what to call once that
        worker is warm or gone (on a GPU, the gate's ``warming``: a warm-up is stopped while a
        judge times). ``seed``: taken from the first worker to be warm, before it has a job, and
        written into the home of every worker started after (HomeSeed)."""
        if pool_size < 0:
            raise SandboxError("pool_size must be >= 0")
        worker_env(spec, Path("/nonexistent"), os.environ)  # refuse a bad spec now, not in the pool thread
        self.spec, self.pool_size, self.refill, self.start_timeout = spec, pool_size, refill, start_timeout
        #: how workers are isolated (``mechanism`` overrides the choice made from spec.isolation)
        self.mechanism = mechanism or choose_mechanism(spec.isolation)
        #: file-system steps that could not be applied (mounts left writable), as workers report them
        self.warnings: set[str] = set()
        self.drop_uid = spec.isolation != "none" and uid_drop_status(self.mechanism)[0]
        if spec.isolation != "none" and not self.mechanism.pidns:
            make_undumpable()
        self.started_workers = 0
        #: how long the last workers took from their start to ready (seconds)
        self._start_s: collections.deque[float] = collections.deque(maxlen=START_TIMES_KEPT)
        self._cond = threading.Condition()
        self._ready: collections.deque[Worker] = collections.deque()
        self._starting: list[Worker] = []
        self._busy: set[ProcessSession] = set()
        self._starts = starts
        self._seed = seed
        #: the last ready workers' own account of their start (``start_steps`` of the ready frame)
        self._start_steps: collections.deque[dict[str, float]] = collections.deque(maxlen=START_TIMES_KEPT)
        #: per starting worker, what ``starts`` returned
        self._warmed: dict[int, Callable[[], None]] = {}
        self._initial_left = pool_size
        self._waiters = 0
        self._failures = 0
        self._broken: SandboxError | None = None
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        remove_stale_private_dirs()
        self._thread = threading.Thread(target=self._run, name=f"kernforge-sandbox-{spec.device}", daemon=True)
        self._thread.start()
        _live_backends.add(self)

    # ---- the Backend protocol --------------------------------------------------------------------
    def session(self, entry: str, payload: Mapping[str, Any], limits: Limits) -> ProcessSession:
        """Hand the job to a warm worker (waiting for one being started if none is ready)."""
        for _ in range(MAX_START_FAILURES):
            worker = self._take()
            try:
                session = self.session_class(worker, entry, payload, limits, on_close=self._forget)
            except WorkerFailure:
                worker.cleanup()  # it died between warm-up and now: take the next one
                continue
            except BaseException:
                worker.cleanup()  # e.g. a payload that is not JSON: the worker must not leak
                raise
            with self._cond:
                self._busy.add(session)
            return session
        raise SandboxError("warm workers keep dying before they can take a job")

    def close(self) -> None:
        """Stop every worker, warm or busy; leave no process or folder behind."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._wake()
        self._thread.join()
        with self._cond:
            workers = list(self._ready) + self._starting
            busy = list(self._busy)
            self._ready.clear()
            self._starting.clear()
        for session in busy:
            session.fail(FailureKind.EXITED_EARLY, "the sandbox backend was closed")
            session.close()
        for worker in workers:
            self._warm_done(worker)
            worker.cleanup()
        os.close(self._wake_r)
        os.close(self._wake_w)
        _live_backends.discard(self)

    def __enter__(self) -> "ProcessBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- extras ----------------------------------------------------------------------------------
    def wait_warm(self, timeout: float | None = None) -> int:
        """Block until ``pool_size`` workers are warm (or ``timeout``); the number warm now."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < self.pool_size and not self._broken and not self._closed:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if self._broken:
                raise self._broken
            return len(self._ready)

    def counts(self) -> dict[str, int]:
        """Workers ready, starting and busy, started in all, and the median start of the last ones
        to become ready (``start_ms``; 0 before any did)."""
        with self._cond:
            starts = sorted(self._start_s)
            return {"ready": len(self._ready), "starting": len(self._starting), "busy": len(self._busy),
                    "started": self.started_workers, "start_ms": round(1000 * starts[len(starts) // 2]) if starts else 0}

    def start_steps(self) -> dict[str, float]:
        """Where the last ready workers' starts went, by their own account: the median seconds of
        each step they named (the preload's imports, then what the warm-up says of itself)."""
        with self._cond:
            kept = list(self._start_steps)
        names = sorted({name for steps in kept for name in steps})
        return {name: sorted(s.get(name, 0.0) for s in kept)[len(kept) // 2] for name in names}

    # ---- internals -------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _take(self) -> Worker:
        with self._cond:
            self._waiters += 1
            self._wake()
            try:
                end = time.monotonic() + self.start_timeout
                while not self._ready:
                    if self._closed:
                        raise SandboxError("the backend is closed")
                    if self._broken:
                        raise self._broken
                    if not self._cond.wait(end - time.monotonic()) and time.monotonic() >= end:
                        raise SandboxError(f"no worker became ready within {self.start_timeout}s")
                worker = self._ready.popleft()
            finally:
                self._waiters -= 1
        self._wake()
        return worker

    def _forget(self, session: ProcessSession) -> None:
        with self._cond:
            self._busy.discard(session)

    def _wanted(self) -> int:
        base = self.pool_size if self.refill else self._initial_left
        have = len(self._ready) + len(self._starting)
        return 0 if self._broken else max(0, base + self._waiters - have)

    def _new_worker(self) -> Worker:
        """Start one worker (the docker backend starts a container instead)."""
        return Worker(self.spec, self.mechanism, self.drop_uid, seed=self._seed)

    def _spawn(self) -> None:
        try:
            worker = self._new_worker()
        except (OSError, SandboxError) as e:
            self._record_failure(SandboxError(f"cannot start a worker: {e}"))
            return
        if self._starts is not None:
            self._warmed[id(worker)] = self._starts(worker)
        with self._cond:
            self.started_workers += 1
            if not self.refill:
                self._initial_left = max(0, self._initial_left - 1)
            self._starting.append(worker)

    def _warm_done(self, worker: Worker) -> None:
        """The worker is warm or gone: ``starts``' hold on it ends."""
        done = self._warmed.pop(id(worker), None)
        if done is not None:
            done()

    def _record_failure(self, error: SandboxError) -> None:
        with self._cond:
            self._failures += 1
            if self._failures >= MAX_START_FAILURES:
                self._broken = error
                self._cond.notify_all()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # surfaced to every caller, never swallowed
            log.exception("sandbox pool thread failed")
            with self._cond:
                self._broken = SandboxError(f"the sandbox pool thread failed: {type(e).__name__}: {e}")
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                to_start = self._wanted()
            for _ in range(to_start):
                self._spawn()
            with self._cond:
                starting, idle, busy = list(self._starting), list(self._ready), list(self._busy)
            if busy or starting:
                timeout = MONITOR_SECONDS if self.spec.isolation != "none" or starting else TRUSTED_MONITOR_SECONDS
            else:
                timeout = 5.0
            readable, _, _ = select.select([self._wake_r] + starting, [], [], timeout)
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
            for worker in starting:
                self._check_starting(worker, worker in readable)
            for worker in idle:
                if not worker.idle_alive():
                    with self._cond:
                        # A session may have taken it since `idle` was read: then its output is
                        # the job's, not a death, and the session owns it.
                        dead = worker in self._ready
                        if dead:
                            self._ready.remove(worker)
                    if dead:
                        worker.cleanup()
            if busy:
                self._monitor(busy)

    def _check_starting(self, worker: Worker, readable: bool) -> None:
        try:
            ready = worker.poll_ready() if readable else False
            if not ready and time.monotonic() - worker.started > self.start_timeout:
                worker.kill()
                raise SandboxError(f"worker not ready after {self.start_timeout}s: {worker.startup_error()}")
        except SandboxError as e:
            with self._cond:
                self._starting.remove(worker)
            self._warm_done(worker)
            worker.cleanup()
            self._record_failure(e)
            return
        if ready:
            self._warm_done(worker)
            if self._seed is not None:  # warm, and no job yet: what is in its home is the warm-up's
                self._seed.harvest(worker.workdir)
            steps = worker.ready_info.get("start_steps")
            said = set(map(str, worker.ready_info.get("mount_warnings") or []))
            filtered = str(worker.ready_info.get("seccomp", "installed"))
            if self.spec.isolation != "none" and filtered != "installed":
                said.add(f"system call filter {filtered}")
            fresh = said - self.warnings
            for warning in sorted(fresh):
                log.warning("sandbox worker: %s", warning)
            with self._cond:
                self.warnings |= fresh
                self._starting.remove(worker)
                self._ready.append(worker)
                self._start_s.append(time.monotonic() - worker.started)
                if isinstance(steps, dict):
                    self._start_steps.append({str(k): float(v) for k, v in steps.items() if isinstance(v, (int, float))})
                self._failures = 0
                self._cond.notify_all()

    def _monitor(self, busy: list[ProcessSession]) -> None:
        snapshot = procs.snapshot()
        now = time.monotonic()
        for session in busy:
            proc = session.worker.proc
            if proc is not None and proc.returncode is None and not session.failed:
                session.check(now, procs.tree_rss(proc.pid, snapshot))
