"""The worker protocol: framing, limits, failure classes and the backend interface.

The sandbox knows nothing about kernels. A *job* is an entry point named ``"module:function"``
plus a JSON payload; the worker imports the module and calls ``function(channel, payload)``.
The job talks to the trusted parent through ``channel`` (a dedicated pair of pipes, never
stdout/stderr, which are captured and kept as diagnostics) with JSON messages, so the parent can
reveal data (seeds) only when it is needed and time each phase with its own clock. A second,
optional channel carries file descriptors (a Unix socket, SCM_RIGHTS): the trusted side can share
memory with the worker (a memfd, exported device memory) without copying it through JSON.

Everything that comes back from a worker is untrusted: the untrusted candidate shares the
worker's process and may write to the channel too. The parent validates every frame (size,
JSON, a dict) and raises ``WorkerFailure(PROTOCOL_VIOLATION)`` otherwise; the meaning of the
messages is checked by whoever reads them. Descriptor messages are checked the same way (see
fdframes.FdReader), and no descriptor a worker sends stays open in the parent unless it is
handed to the caller.

Only the standard library is imported here (and fdframes.py, which imports only it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import struct
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from .fdframes import MAX_FDS_PER_MESSAGE, MAX_TAG_CHARS, FdReader, encode_fd_frame, fd_list, send_fd_frame

#: A frame is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an object).
HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024

#: File descriptors the job channel uses inside the worker: parent->worker and worker->parent.
WORKER_READ_FD = 3
WORKER_WRITE_FD = 4

#: The descriptor channel inside the job process: a Unix stream socket to the parent, carrying
#: messages of a short tag and 0..MAX_FDS_PER_MESSAGE descriptors (framing: fdframes.py).
WORKER_FDS_FD = 6

#: Frames carrying this key belong to the sandbox itself (ready, job, exit); a job must not use it.
#: The parent never returns such frames from ``recv``.
RESERVED_KEY = "__sandbox__"

#: ``WorkerSpec.isolation`` values: "strict" picks the strongest mechanism this machine offers;
#: "bwrap" and "namespaces" demand one (SandboxError if unavailable); "none" is for trusted workers.
ISOLATION_LEVELS = ("strict", "bwrap", "namespaces", "none")


class SandboxError(Exception):
    """The sandbox itself could not do what was asked (bad configuration, cannot start)."""


class FailureKind(str, Enum):
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OUT_OF_MEMORY = "out_of_memory"
    RESOURCE_LIMIT = "resource_limit"
    PROTOCOL_VIOLATION = "protocol_violation"
    EXITED_EARLY = "exited_early"


@dataclass(frozen=True)
class Diagnostics:
    """What the worker printed (truncated) and how it ended. For people, never for verdicts."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: str | None = None
    wall_seconds: float = 0.0
    peak_rss_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class WorkerFailure(Exception):
    """The worker ended or misbehaved before the job finished; ``kind`` classifies it."""

    def __init__(self, kind: FailureKind, reason: str, diagnostics: Diagnostics | None = None):
        super().__init__(f"{kind.value}: {reason}")
        self.kind = kind
        self.reason = reason
        self.diagnostics = diagnostics or Diagnostics()


@dataclass(frozen=True)
class Limits:
    """Resource limits for one session. ``None`` for wall_seconds means no overall deadline
    (trusted, long-lived workers); per-``recv`` timeouts still apply."""

    wall_seconds: float | None = 300.0
    cpu_seconds: int = 900
    #: host memory of the worker's whole process tree (resident set), not GPU memory
    memory_bytes: int = 16 * 1024**3
    file_bytes: int = 4 * 1024**3
    processes: int = 2048
    #: bytes of stdout and of stderr kept as diagnostics
    output_bytes: int = 64 * 1024
    #: what the worker's folder (its home and temp dir, on the host's disk) may hold: bytes, and
    #: files and folders (a disk or its inodes filled while a run writes its archive end the run)
    disk_bytes: int = 8 * 1024**3
    disk_entries: int = 100_000

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def capped(self, wall_seconds: float | None) -> "Limits":
        """These limits with the wall deadline at most ``wall_seconds`` (None or inf: unchanged)."""
        if wall_seconds is None or not math.isfinite(wall_seconds):
            return self
        if self.wall_seconds is not None and self.wall_seconds <= wall_seconds:
            return self
        return dataclasses.replace(self, wall_seconds=wall_seconds)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Limits":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class WorkerSpec:
    """How pool workers are made before any job arrives."""

    #: "cpu" (Triton interpreter) or a GPU index as a string ("0", "1", ...)
    device: str = "cpu"
    #: modules imported while warming up (e.g. torch, triton)
    preload: tuple[str, ...] = ()
    #: "module:function" called with no arguments after preload, before any job (trusted code:
    #: create the CUDA context, capture original functions before a candidate can patch them)
    warmup: str | None = None
    #: extra environment variables (names must pass the allow-list; secrets never do)
    env: Mapping[str, str] = field(default_factory=dict)
    #: "strict" (everything the OS allows) or "none" (trusted workers: env scrub and process
    #: group only); see ISOLATION_LEVELS
    isolation: str = "strict"
    #: files or folders the worker must not see (the archive, hidden task data); they appear empty
    #: to it. The parent's home folder is always hidden under strict isolation.
    hidden_paths: tuple[str, ...] = ()
    #: a trusted command the worker runs under, outside its isolation (Nsight Compute): the
    #: worker's parent, whose report lies where nothing in the sandbox can reach it; a
    #: profiled worker's session ends by waiting for the worker to exit, so the report is whole
    profiler: tuple[str, ...] = ()
    #: a folder for the compiler caches (Triton, Inductor) of a trusted worker, kept across its
    #: workers and runs: its compiles are made once. Only for isolation "none": what a cache
    #: holds is code the next reader runs, so no candidate may write (or read) it
    trusted_cache: str | None = None
    #: whether the job (strict isolation) may start processes (fork, and vfork with exec: how
    #: subprocess, posix_spawn and compilers start programs); threads run either way. A child
    #: works beside the job, beyond every trace of it (sandbox/seccomp.py); a GPU worker's builds
    #: (nvcc, ptxas) need it
    fork: bool = True

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_LEVELS:
            raise SandboxError(f"isolation must be one of {ISOLATION_LEVELS}, not {self.isolation!r}")
        if self.trusted_cache is not None and self.isolation != "none":
            raise SandboxError("trusted_cache is for trusted workers (isolation 'none') only: a candidate could poison it")
        if self.device != "cpu" and not self.device.isdigit():
            raise SandboxError(f"device must be 'cpu' or a GPU index such as '0', not {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["preload"], data["hidden_paths"], data["env"] = list(self.preload), list(self.hidden_paths), dict(self.env)
        data["profiler"] = list(self.profiler)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkerSpec":
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for key in ("preload", "hidden_paths", "profiler"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def encode(message: Mapping[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=True).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse one frame body; raises ValueError on anything but a JSON object."""
    value = json.loads(body.decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"frame is a {type(value).__name__}, not an object")
    return value


class FrameBuffer:
    """Incremental decoder for bytes read from an untrusted peer.

    ``feed`` accepts whatever arrived; ``pop`` returns the next complete message or None. A
    header announcing more than MAX_FRAME_BYTES, or a body that is not a JSON object, raises
    ValueError at once, so at most one frame (plus one read) is ever buffered.
    """

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._data += chunk

    def wanted(self) -> int:
        """Bytes still missing for the frame being received (at least 1)."""
        if len(self._data) < HEADER.size:
            return HEADER.size - len(self._data)
        (length,) = HEADER.unpack_from(self._data)
        return max(1, HEADER.size + length - len(self._data))

    def pop(self) -> dict[str, Any] | None:
        if len(self._data) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._data)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame header announces {length} bytes (limit {MAX_FRAME_BYTES})")
        if len(self._data) < HEADER.size + length:
            return None
        body = bytes(self._data[HEADER.size : HEADER.size + length])
        del self._data[: HEADER.size + length]
        try:
            return decode_body(body)
        except UnicodeDecodeError as e:
            raise ValueError(f"frame is not UTF-8: {e}") from None
        except RecursionError:
            raise ValueError("frame nests JSON too deeply") from None

    def pending(self) -> int:
        return len(self._data)


class Channel:
    """The worker's end of the job channel and of the descriptor channel (blocking). Used by job
    entry points. It owns the descriptor channel's socket (``fds_fd``) once it has used it."""

    def __init__(self, read_fd: int = WORKER_READ_FD, write_fd: int = WORKER_WRITE_FD,
                 fds_fd: int = WORKER_FDS_FD):
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._fds_fd = fds_fd
        self._fds_sock: socket.socket | None = None
        self._fds_reader = FdReader()

    def send(self, message: Mapping[str, Any]) -> None:
        data = encode(message)
        view = memoryview(data)
        while view:
            written = os.write(self._write_fd, view)
            view = view[written:]

    def recv(self) -> dict[str, Any]:
        header = self._read_exact(HEADER.size)
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes from the parent")
        return decode_body(self._read_exact(length))

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self._read_fd, n)
            if not chunk:
                raise EOFError("parent closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def send_fds(self, fds: Sequence[int], tag: str = "") -> None:
        """Send ``fds`` and ``tag`` (at most MAX_TAG_CHARS) as one descriptor message. The parent
        gets copies: ``fds`` stay open here."""
        frame, numbers = encode_fd_frame(tag), fd_list(fds)
        sock = self._fd_socket()
        sent = send_fd_frame(sock, frame, numbers)
        if sent < len(frame):
            sock.sendall(frame[sent:], socket.MSG_NOSIGNAL)

    def recv_fds(self) -> tuple[str, list[int]]:
        """The next descriptor message from the parent: its tag and descriptors (the job's to
        close). EOFError when the parent closed the channel."""
        sock = self._fd_socket()
        while True:
            message = self._fds_reader.pop()
            if message is not None:
                return message
            if not self._fds_reader.receive(sock):
                raise EOFError("parent closed the descriptor channel")

    def _fd_socket(self) -> socket.socket:
        # Wrapped on first use: a job that never passes descriptors never touches the socket.
        if self._fds_sock is None:
            self._fds_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=self._fds_fd)
            self._fds_sock.setblocking(True)
        return self._fds_sock


class Session(Protocol):
    """The parent's end of one job in one worker. Use as a context manager; closing kills the
    worker's whole process tree and removes its private directory. A WorkerFailure ends the
    session: the worker is killed when it is raised, and every later call raises it again."""

    #: the worker's private directory as the parent sees it (the job may write files there;
    #: the worker sees it at the same absolute path). The worker may run as another uid: files
    #: the parent writes there are readable by it, but folders it must write into it makes itself.
    workdir: Path

    def send(self, message: Mapping[str, Any]) -> None: ...

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Next message; raises WorkerFailure (TIMEOUT when ``timeout`` or the session's wall
        deadline passes, or the class of the worker's death)."""
        ...

    def send_fds(self, fds: Sequence[int], tag: str = "", timeout: float | None = None) -> None:
        """Send ``fds`` with ``tag`` as one descriptor message (at most MAX_FDS_PER_MESSAGE and
        MAX_TAG_CHARS, else ValueError). The worker gets copies: the caller's stay open. Raises
        WorkerFailure as ``send`` does."""
        ...

    def recv_fds(self, timeout: float | None = None) -> tuple[str, list[int]]:
        """Next descriptor message: its tag and descriptors, which the caller now owns and must
        close. Raises WorkerFailure as ``recv`` does, PROTOCOL_VIOLATION for a malformed message
        (whose descriptors are closed) or a job that closed its end of the descriptor channel."""
        ...

    def strays(self) -> list[str]:
        """Processes the job started that are still running (``pid command``), read from outside
        the worker; empty where its processes cannot be seen."""
        ...

    def pause(self) -> None:
        """Stop every process of the job (SIGSTOP to its uid's, or its tree's) until ``resume``:
        while another lane times, every other lane's job is stopped, and a stopped job launches
        nothing into that window (verifier/gate.py). Work it queued on the GPU before still runs:
        the reference worker waits for the GPU to be quiet before it times (refworker.py)."""
        ...

    def resume(self) -> None:
        """Let the processes ``pause`` stopped go on."""
        ...

    def stoppable(self) -> bool:
        """Whether ``pause`` can stop the job (the parent sees its processes, and it has not ended)."""
        ...

    def stopped_seconds(self) -> float:
        """Seconds the job has spent stopped by ``pause``, the stop in progress included: none of
        it counts against its wall deadline or a request's timeout (it is not the job's time)."""
        ...

    def close(self) -> Diagnostics: ...

    def __enter__(self) -> "Session": ...

    def __exit__(self, *exc: object) -> None: ...


class Backend(Protocol):
    """Where workers run: the process backend (default) or the docker backend."""

    name: str

    def session(self, entry: str, payload: Mapping[str, Any], limits: Limits) -> Session:
        """Hand the job to a warm worker (starting one if none is ready) and return its session."""
        ...

    def close(self) -> None:
        """Stop every worker, warm or busy; leave no process or directory behind."""
        ...


class HomeSeed(Protocol):
    """Files every new worker of a pool finds in its home folder before it starts: what a worker's
    trusted warm-up would otherwise build there again (ProcessBackend's ``seed``). It is taken from
    a worker that is warm and has run no job (``harvest``), and written into each later worker's
    home before its process exists (``plant``), owned by that worker's uid."""

    def harvest(self, home: Path) -> None:
        """Take the seed from ``home``, the home of a worker that is warm and has had no job (once
        a seed is taken, later calls do nothing)."""
        ...

    def plant(self, home: Path, uid: int | None, gid: int | None) -> None:
        """Write the seed (if one is taken) into ``home``, a new worker's, owned by ``uid``/``gid``
        where they are given."""
        ...
