"""One job in one worker, seen from the trusted parent: send, recv, send_fds, recv_fds, close.

Every byte from the worker is untrusted. Frames are checked (size, JSON, an object) as they
arrive, descriptor messages as fdframes.FdReader says; anything else ends the session with
PROTOCOL_VIOLATION. When the job process ends, its supervisor's report (exact wait status, CPU
time) and the worker's last sandbox frame are combined into one FailureKind with a reason. Any
failure kills the worker at once: a session that raised is over.
"""

from __future__ import annotations

import errno
import json
import math
import os
import select
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import procs
from .fdframes import FdReader, encode_fd_frame, fd_list, send_fd_frame
from .protocol import RESERVED_KEY, Diagnostics, FailureKind, Limits, SandboxError, WorkerFailure, encode
from .spawn import Worker, folder_usage, free_space

#: After the job process ended: how long to wait for its last bytes and its supervisor's report.
GRACE_SECONDS = 5.0
#: how long a profiled worker may take to exit at the end of its session (its profiler writes
#: the report then)
PROFILER_EXIT_S = 120.0
#: Longest single wait inside recv/send, so failures recorded by the monitor thread are seen.
POLL_SECONDS = 1.0
#: a job's folder is walked at least this often, whatever its file system's free space says
#: (``ProcessSession._check_disk``); a walk stops once past a limit, so it stays cheap
DISK_WALK_S = 5.0
#: Held through every stop of jobs (``_freeze``) and every resume: two lanes' judges may stop and
#: resume one job at the same time (verifier/gate.py: a judge stops its own worker while it waits
#: for the gate, and the lane timing meanwhile resumes every worker it found enlisted). A resume
#: that ran while a stop was still finding the job's processes thawed none of them and marked the
#: job running; the stop then stopped them for good, and its judge waited on its own stopped
#: worker while holding the gate alone: two lanes on an H100 made no verdict (session 57).
_STOPS = threading.Lock()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(final: Mapping[str, Any] | None, report: Mapping[str, Any] | None, limits: Limits) -> tuple[FailureKind, str]:
    """Why a job process ended without the message the parent waited for."""
    if final is not None and final.get("status") == "returned":
        return FailureKind.EXITED_EARLY, "the job returned without sending the message the parent waited for"
    if final is not None and final.get("status") == "raised":
        kind, text = str(final.get("type"))[:100], str(final.get("message"))[:500]
        if kind == "MemoryError":
            return FailureKind.OUT_OF_MEMORY, f"the job raised MemoryError: {text}"
        if final.get("errno") == errno.EFBIG:
            return FailureKind.RESOURCE_LIMIT, f"file size limit of {limits.file_bytes} bytes reached ({kind}: {text})"
        if final.get("errno") == errno.EAGAIN:
            return FailureKind.RESOURCE_LIMIT, f"the job hit a resource limit ({kind}: {text}), e.g. the process limit of {limits.processes}"
        if kind == "SystemExit":
            return FailureKind.EXITED_EARLY, f"the job called sys.exit({final.get('code')!r})"
        return FailureKind.EXITED_EARLY, f"the job raised {kind}: {text}"
    if report and "signal" in report:
        number = int(report["signal"])
        name = _signal_name(number)
        if number == signal.SIGXCPU:
            return FailureKind.RESOURCE_LIMIT, f"CPU time limit of {limits.cpu_seconds}s reached ({name})"
        if number == signal.SIGXFSZ:
            return FailureKind.RESOURCE_LIMIT, f"file size limit of {limits.file_bytes} bytes reached ({name})"
        if number == signal.SIGKILL and float(report.get("cpu_seconds", 0)) >= limits.cpu_seconds:
            return FailureKind.RESOURCE_LIMIT, f"CPU time limit of {limits.cpu_seconds}s reached (SIGKILL at the hard limit)"
        hint = " (not sent by the sandbox: possibly the kernel's OOM killer)" if number == signal.SIGKILL else ""
        return FailureKind.CRASHED, f"the worker was killed by {name}{hint}"
    if report and "exit_code" in report:
        return FailureKind.EXITED_EARLY, f"the worker exited with code {report['exit_code']} before finishing (os._exit or similar)"
    return FailureKind.EXITED_EARLY, "the worker's supervisor disappeared (killed from inside the sandbox?)"


class _End:
    """The moment a request gives up: its own timeout from when it began, or the session's
    deadline, whichever comes first; what the job spent stopped since the request began is not
    counted against either (a lane timing beside it stopped it, verifier/gate.py)."""

    def __init__(self, session: "ProcessSession", own: float, stopped: float):
        self.session, self.own, self.stopped = session, own, stopped
        self.at, self.per_call = own, True

    def moved(self) -> "_End":
        deadline = self.session._deadline_now()
        own = self.own + self.session.stopped_seconds() - self.stopped
        self.at, self.per_call = min(deadline, own), own < deadline
        return self


class ProcessSession:
    """The parent's end of one job (the Session protocol). Not thread-safe for concurrent recv."""

    def __init__(self, worker: Worker, entry: str, payload: Mapping[str, Any], limits: Limits,
                 on_close: Callable[["ProcessSession"], None] | None = None):
        self.worker, self.limits = worker, limits
        self.workdir: Path = worker.workdir
        self.started = time.monotonic()
        self.deadline = math.inf if limits.wall_seconds is None else self.started + limits.wall_seconds
        #: seconds the job spent stopped by ``pause`` (another lane timing), and when the stop in
        #: progress began: none of it counts against the job's deadline or a request's timeout
        self._stopped_s = 0.0
        self._stopped_at: float | None = None
        self.peak_rss = 0
        self._on_close = on_close
        self._lock = threading.Lock()
        self._failure: WorkerFailure | None = None
        self._final: dict[str, Any] | None = None
        self._report: dict[str, Any] | None = None
        self._report_buf = b""
        self._eof = False
        self._fd_reader = FdReader()
        self._closed: Diagnostics | None = None
        #: the worker's processes before its job began (its sandbox's, its supervisor, the job)
        self._own = self._tree()
        #: free bytes and inodes of the folder's file system as the job began; when did the
        #: folder's own usage last get walked (``_check_disk``)
        self._disk_free = free_space(self.workdir)
        self._disk_walked = -math.inf
        self.send({RESERVED_KEY: "job", "entry": entry, "payload": dict(payload), "limits": limits.to_dict()})
        worker.boost()

    # ---- the Session protocol --------------------------------------------------------------------
    def send(self, message: Mapping[str, Any], timeout: float | None = None) -> None:
        data = memoryview(encode(message))
        end = self._end(timeout)
        while data:
            end = end.moved()
            self._raise_if_over()
            try:
                data = data[os.write(self.worker.chan_w, data):]
                continue
            except BlockingIOError:
                pass
            except BrokenPipeError:
                self._finish(closed_channel=True)
            remaining = end.at - time.monotonic()
            if remaining <= 0:
                self._timeout(timeout if end.per_call else None)
            self._select([], min(remaining, POLL_SECONDS), write=[self.worker.chan_w])

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        end = self._end(timeout)
        while True:
            end = end.moved()
            self._raise_if_over()
            message = self._pop()
            if message is not None:
                return message
            if self._eof or (self._report is not None and not self._readable(0)):
                self._finish()
            remaining = end.at - time.monotonic()
            if remaining <= 0:
                self._timeout(timeout if end.per_call else None)
            self._read(min(remaining, POLL_SECONDS))

    def send_fds(self, fds: Sequence[int], tag: str = "", timeout: float | None = None) -> None:
        """One descriptor message to the job (Channel.recv_fds); ``fds`` stay the caller's."""
        data, numbers = memoryview(encode_fd_frame(tag)), fd_list(fds)
        end = self._end(timeout)
        attached = False
        while data:
            end = end.moved()
            self._raise_if_over()
            sock = self._fd_socket()
            try:
                # The descriptors go with the first bytes that go: a refused sendmsg sent nothing.
                sent = sock.send(data, socket.MSG_NOSIGNAL) if attached else send_fd_frame(sock, data, numbers)
                attached = True
                data = data[sent:]
                continue
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                self._fd_channel_ended()
            except OSError:
                self._raise_if_over()  # closed under us by Backend.close() from another thread
                raise
            remaining = end.at - time.monotonic()
            if remaining <= 0:
                self._timeout(timeout if end.per_call else None)
            self._select([], min(remaining, POLL_SECONDS), write=[sock.fileno()])

    def recv_fds(self, timeout: float | None = None) -> tuple[str, list[int]]:
        """The next descriptor message from the job (Channel.send_fds): its tag and descriptors,
        which the caller owns from here."""
        end = self._end(timeout)
        while True:
            end = end.moved()
            self._raise_if_over()
            try:
                message = self._fd_reader.pop()
            except ValueError as e:
                self._protocol_violation(e)
            if message is not None:
                return message
            sock = self._fd_socket()
            if self._report is not None and not self._select([sock.fileno()], 0):
                self._fd_channel_ended()  # the job process is over and sent nothing more
            remaining = end.at - time.monotonic()
            if remaining <= 0:
                self._timeout(timeout if end.per_call else None)
            self._read_fds(sock, min(remaining, POLL_SECONDS))

    def strays(self) -> list[str]:
        """Processes alive in the worker's tree now that were not there when its job began (each
        as ``pid command``, the command as the process names itself, cut short): what the job
        started and left running. Zombies are left out (they run nothing), unless threads of theirs
        still run (a main thread that called pthread_exit leaves one). Read by the parent from
        /proc, which the job cannot touch; empty where the worker's processes are not visible."""
        root = self._root()
        if root is None:
            return []
        snapshot = procs.snapshot()
        found = []
        for pid in procs.descendants(root, snapshot):
            if pid in self._own or pid not in snapshot or (snapshot[pid].state == "Z" and procs.threads(pid) <= 1):
                continue  # a zombie whose only thread is gone; one whose main thread left while others run is alive
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read(400).replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue  # gone meanwhile
            if snapshot[pid].state == "Z":
                command = f"(its main thread gone, {procs.threads(pid) - 1} threads of it still running)"
            found.append(f"{pid} {' '.join(command.split())[:160] or '?'}")
        return found

    def _root(self) -> int | None:
        """The top of the worker's process tree in this machine's /proc (a container's init for
        the docker backend), or None where it is not visible."""
        host_pid = getattr(self.worker, "host_pid", None)
        if host_pid is not None:
            return host_pid
        proc = getattr(self.worker, "proc", None)
        return proc.pid if proc is not None else None

    def _tree(self) -> set[int]:
        root = self._root()
        return set(procs.descendants(root, procs.snapshot())) if root is not None else set()

    def pause(self) -> None:
        _freeze([self])

    def stoppable(self) -> bool:
        """Whether ``pause`` can stop the job: the parent sees its processes (a container's it does
        not where the engine runs in another pid namespace) and it has not ended."""
        return self.worker.freeze_target() is not None

    def _begin_stop(self) -> bool:
        """The stop's start noted; False where the job is stopped already."""
        with self._lock:
            if self._stopped_at is not None:
                return False
            self._stopped_at = time.monotonic()
            return True

    def resume(self) -> None:
        with _STOPS:  # never inside a stop of this job still finding its processes
            with self._lock:
                if self._stopped_at is None:
                    return  # not stopped (another's resume came first)
            self.worker.resume()
            with self._lock:
                stopped = time.monotonic() - self._stopped_at
                self._stopped_at = None
                self._stopped_s += stopped
                self.deadline += stopped

    def stopped_seconds(self) -> float:
        """Seconds the job has spent stopped by ``pause`` so far, the stop in progress included."""
        with self._lock:
            now = 0.0 if self._stopped_at is None else time.monotonic() - self._stopped_at
            return self._stopped_s + now

    def _deadline_now(self) -> float:
        """The wall deadline, pushed back by the stop in progress."""
        with self._lock:
            return self.deadline + (0.0 if self._stopped_at is None else time.monotonic() - self._stopped_at)

    def close(self) -> Diagnostics:
        with self._lock:
            if self._closed is not None:
                return self._closed
            if self._failure is None:
                self._failure = WorkerFailure(FailureKind.EXITED_EARLY, "the session was closed")
        self._collect_report(0)
        spec = getattr(self.worker, "spec", None)  # a container has no profiler
        if spec is not None and spec.profiler:  # its report is written as the worker exits
            self.worker.wait_exit(PROFILER_EXIT_S)
        self.worker.kill()
        diagnostics = self._partial_diagnostics()
        self._fd_reader.close()  # descriptors of a message that never completed
        self.worker.cleanup()
        self._closed = diagnostics
        if self._on_close is not None:
            self._on_close(self)
        return diagnostics

    def __enter__(self) -> "ProcessSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- called by the monitor thread ------------------------------------------------------------
    def check(self, now: float, rss: int) -> None:
        """Enforce the wall deadline, the memory limit and the folder's limits from outside the worker."""
        self.peak_rss = max(self.peak_rss, rss)
        if rss > self.limits.memory_bytes:
            self.fail(FailureKind.OUT_OF_MEMORY,
                      f"host memory of the worker's processes reached {rss >> 20} MiB (limit {self.limits.memory_bytes >> 20} MiB)")
        elif now >= self._deadline_now():
            self.fail(FailureKind.TIMEOUT, f"wall-clock limit of {self.limits.wall_seconds}s reached")
        else:
            self._check_disk(now)

    def _check_disk(self, now: float) -> None:
        """The worker's folder lies on the host's disk: a file's size is capped (RLIMIT_FSIZE), their
        number and sum are not (red team: 9 GiB in one accepted verdict, 300k files in 5 s). The file
        system's free space is read at every poll (one call); once it has lost half a limit since the
        job began, by anyone, the folder itself is walked, at most once a second. It is walked every
        ``DISK_WALK_S`` whatever the free space says: space another process frees meanwhile (a
        test's folders deleted, an image's layers) hides a job's writes from that sum, and in CI a
        job's 48 MiB most likely went unseen so until its wall-clock limit (session 65)."""
        if self._disk_free is None or now - self._disk_walked < 1.0:
            return
        free = free_space(self.workdir)
        if free is None:
            return
        limits = self.limits
        if (self._disk_free[0] - free[0] < limits.disk_bytes // 2 and self._disk_free[1] - free[1] < limits.disk_entries // 2
                and now - self._disk_walked < DISK_WALK_S):
            return
        self._disk_walked = now
        size = entries = 0
        for folder in getattr(self.worker, "disk_folders", (self.workdir,)):  # a container's output files too
            more = folder_usage(folder, limits.disk_bytes, limits.disk_entries)
            size, entries = size + more[0], entries + more[1]
        if size > limits.disk_bytes or entries > limits.disk_entries:
            self.fail(FailureKind.RESOURCE_LIMIT,
                      f"its folder on the host's disk holds {size >> 20} MiB in {entries} files and folders "
                      f"(limits {limits.disk_bytes >> 20} MiB and {limits.disk_entries})")

    def fail(self, kind: FailureKind, reason: str) -> None:
        """Record the first failure and kill the worker's whole tree."""
        with self._lock:
            if self._failure is not None or self._closed is not None:
                return
            self._failure = WorkerFailure(kind, reason, self._partial_diagnostics())
        self.worker.kill()

    @property
    def failed(self) -> bool:
        return self._failure is not None

    # ---- internals -------------------------------------------------------------------------------
    def _partial_diagnostics(self) -> Diagnostics:
        report = self._report or {}
        return Diagnostics(stdout=self.worker.tail("stdout", self.limits.output_bytes),
                           stderr=self.worker.tail("stderr", self.limits.output_bytes),
                           exit_code=report.get("exit_code"),
                           signal=_signal_name(report["signal"]) if "signal" in report else None,
                           wall_seconds=time.monotonic() - self.started,
                           peak_rss_bytes=max(self.peak_rss, int(report.get("maxrss_bytes", 0))))

    def _raise_if_over(self) -> None:
        if self._closed is not None:
            raise SandboxError("the session is closed")
        if self._failure is not None:
            raise self._failure

    def _end(self, timeout: float | None) -> "_End":
        """When a call with this ``timeout`` must give up: that, or the session's deadline; both
        pushed back by the time the job spends stopped meanwhile (``_End.moved``)."""
        return _End(self, time.monotonic() + timeout if timeout is not None else math.inf, self.stopped_seconds())

    def _timeout(self, per_call: float | None) -> None:
        if per_call is not None:
            self.fail(FailureKind.TIMEOUT, f"no message within {per_call}s")
        else:
            self.fail(FailureKind.TIMEOUT, f"wall-clock limit of {self.limits.wall_seconds}s reached")
        self._raise_if_over()

    def _pop(self) -> dict[str, Any] | None:
        while True:
            try:
                message = self.worker.frames.pop()
            except ValueError as e:
                self.fail(FailureKind.PROTOCOL_VIOLATION, str(e))
                self._raise_if_over()
            if message is None or RESERVED_KEY not in message:
                return message
            if message.get(RESERVED_KEY) == "exit" and self._final is None:
                self._final = message
            # Any other reserved frame from the job is ignored: only the sandbox may send them.

    def _select(self, watch: list[int], timeout: float, write: list[int] | None = None) -> list[int]:
        """Wait until a descriptor in ``watch`` is readable (or one in ``write`` writable); the
        readable ones."""
        try:
            readable, _, _ = select.select(watch, write or [], [], max(0.0, timeout))
        except (OSError, ValueError):
            self._raise_if_over()  # closed under us by Backend.close() from another thread
            raise
        return readable

    def _readable(self, timeout: float) -> bool:
        return bool(self._select([self.worker.chan_r], timeout))

    def _read(self, timeout: float) -> None:
        watch = [self.worker.chan_r]
        if self._report is None and self.worker.ctl is not None:
            watch.append(self.worker.ctl.fileno())
        readable = self._select(watch, timeout)
        if self.worker.chan_r in readable:
            chunk = os.read(self.worker.chan_r, min(self.worker.frames.wanted(), 1 << 20))
            if chunk:
                self.worker.frames.feed(chunk)
            else:
                self._eof = True
        if len(watch) > 1 and watch[1] in readable:
            self._collect_report(0)

    def _collect_report(self, timeout: float) -> None:
        """Read the supervisor's one-line report of how the job process ended, if it is there."""
        ctl = self.worker.ctl
        deadline = time.monotonic() + timeout
        while self._report is None and ctl is not None:
            readable, _, _ = select.select([ctl], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return
            chunk = ctl.recv(4096)
            self._report_buf += chunk
            if b"\n" in self._report_buf or not chunk or len(self._report_buf) > 65536:
                try:
                    report = json.loads(self._report_buf.split(b"\n", 1)[0] or b"{}")
                except ValueError:
                    report = {}
                report = report if isinstance(report, dict) else {}
                # Only numbers under the keys the supervisor writes are kept.
                self._report = {k: v for k, v in report.items()
                                if k in ("exit_code", "signal", "cpu_seconds", "maxrss_bytes")
                                and isinstance(v, (int, float)) and not isinstance(v, bool)}

    def _finish(self, closed_channel: bool = False) -> None:
        """The job process is over and its frames are drained: fail with its class."""
        self._collect_report(GRACE_SECONDS)
        if self._report is None and self._final is None and closed_channel:
            self.fail(FailureKind.PROTOCOL_VIOLATION, "the worker closed its end of the job channel")
        kind, reason = classify(self._final, self._report, self.limits)
        self.fail(kind, reason)
        self._raise_if_over()

    # ---- the descriptor channel ------------------------------------------------------------------
    def _fd_socket(self) -> socket.socket:
        sock = self.worker.fds_sock
        if sock is None:
            self._raise_if_over()  # cleaned up by Backend.close() from another thread
            raise SandboxError("the worker has no descriptor channel")
        return sock

    def _read_fds(self, sock: socket.socket, timeout: float) -> None:
        """Wait up to ``timeout`` and take one read of the descriptor channel (and the
        supervisor's report, if it comes meanwhile)."""
        watch = [sock.fileno()]
        if self._report is None and self.worker.ctl is not None:
            watch.append(self.worker.ctl.fileno())
        readable = self._select(watch, timeout)
        if watch[0] in readable:
            try:
                if not self._fd_reader.receive(sock):
                    self._fd_channel_ended()
            except BlockingIOError:
                pass
            except ConnectionResetError:
                self._fd_channel_ended()
            except ValueError as e:
                self._protocol_violation(e)
            except OSError:
                self._raise_if_over()  # closed under us by Backend.close() from another thread
                raise
        if len(watch) > 1 and watch[1] in readable:
            self._collect_report(0)

    def _protocol_violation(self, error: ValueError) -> None:
        self.fail(FailureKind.PROTOCOL_VIOLATION, f"descriptor channel: {error}")
        self._raise_if_over()

    def _fd_channel_ended(self) -> None:
        """The descriptor channel closed, or the job process ended, with no message for us: the
        session is over. Classify how the job ended (its exit frame is on the job channel, the
        supervisor's report on the control socket), or, if it is still running after a grace
        period, call it a protocol violation: the job closed its end of the channel."""
        deadline = time.monotonic() + GRACE_SECONDS
        while True:
            self._raise_if_over()
            while self._pop() is not None:
                pass  # the session fails below whatever comes: only the sandbox's exit frame counts
            if self._eof or (self._report is not None and not self._readable(0)):
                self._finish()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(FailureKind.PROTOCOL_VIOLATION, "the job closed its end of the descriptor channel")
                self._raise_if_over()
            self._read(min(remaining, POLL_SECONDS))


def pause_all(sessions: Sequence[Any]) -> None:
    """``pause`` of every one of ``sessions``, the jobs of this module's sessions found and stopped
    together (procs.freeze_many: one pass over /proc per round for all of them). NotStopped where
    a job's processes did not all stop (those that did stay stopped until their ``resume``)."""
    for session in sessions:
        if isinstance(session, Worker):  # warming up (verifier/gate.py ``warming``): trusted code, a quick stop
            root = session.warming_root()
            if root is not None:
                session.stopped(procs.stop_trusted_tree(root))
        elif not isinstance(session, ProcessSession):
            session.pause()
    _freeze([s for s in sessions if isinstance(s, ProcessSession)])


def _freeze(sessions: Sequence[ProcessSession]) -> None:
    """Stop ``sessions``' jobs. A job already stopped is left as it is; one that has ended, or
    whose processes the parent cannot see, is not counted as stopped (its time is its own)."""
    with _STOPS:  # a resume waits until every process found is stopped and noted (``_STOPS``)
        batch = []
        for session in sessions:
            where = session.worker.freeze_target()
            if where is not None and session._begin_stop():
                batch.append((session, where))
        stuck = []
        for (session, where), (pids, settled) in zip(batch, procs.freeze_many([where for _, where in batch])):
            session.worker.stopped(pids)
            if not settled:
                stuck.append(f"the job of pid {where[0]}")
    if stuck:
        raise procs.NotStopped(f"processes of {', '.join(stuck)} still ran after every round of stopping")
