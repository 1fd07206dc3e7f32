"""One worker container, started ahead of time and torn down again (the parent's side).

A worker owns a private folder ``kf-dkr-<parent pid>-*`` (mode 0711, the parent's), bound into
its container at the same absolute path, so files the job writes are where the parent (and the
trusted reference worker) read them:

* ``work/``: the job's cwd, HOME and TMPDIR, owned by the worker's uid;
* ``io/``: ``stdout`` and ``stderr``, made by the parent, which reads them through descriptors
  it opened itself (a candidate that swaps the names for links reaches nothing);
* ``chan/``: the job channel (two FIFOs), the control socket and the descriptor channel's socket;
  the parent removes them once the container's entry point (docker_entry.py) has opened them,
  before any job exists.

Everything the parent needs to police the container comes from the host: the container's init
process (the worker's supervisor) is found in /proc and held through a pidfd, so killing it is
immune to pid reuse and takes the whole pid namespace with it; its memory cgroup says when the
kernel's OOM killer struck. Where the container's processes are not visible (a parent in another
pid namespace than the engine) the engine's API does the killing and memory is capped only by
the container's cgroup.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

from . import procs, uids
from .protocol import FrameBuffer, SandboxError
from .spawn import STDERR_IN_ERRORS, read_ready_frame, remove_tree

PRIVATE_PREFIX = "kf-dkr-"
log = logging.getLogger(__name__)
#: The files in ``chan/`` through which the entry point joins the parent, removed once it has.
RENDEZVOUS = ("to_worker", "from_worker", "control", "fds")
#: How long teardown waits for a killed container's processes to be gone.
EXIT_WAIT_SECONDS = 20.0


@dataclass(frozen=True)
class ContainerPlan:
    """Everything about a worker container that is the same for every worker of a backend."""

    image: str
    python: str
    #: "src:dst:mode" binds besides the worker's private folder (host Python, driver libraries...)
    binds: tuple[str, ...]
    #: environment shared by every worker (the private folder's variables are added per worker)
    env: dict[str, str]
    labels: dict[str, str]
    memory_bytes: int
    pids: int
    tmpfs_bytes: int
    #: root parent: each worker gets a uid of its own (uids.py); otherwise the parent's uid
    lease_uids: bool
    #: the worker config the in-container supervisor gets (preload, warmup, strict...)
    worker: dict[str, Any]
    device_requests: tuple[dict, ...] = ()
    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    #: folders and files (container paths, inside a bind) the worker must not see: an empty
    #: read-only tmpfs covers a folder, /dev/null a file
    hidden_dirs: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()


class Engine:
    """The Docker SDK client shared by a backend's threads, one API call at a time."""

    def __init__(self, client) -> None:
        self.client = client
        self.api = client.api
        self.lock = threading.Lock()

    def call(self, name: str, *args, **kwargs):
        with self.lock:
            return getattr(self.api, name)(*args, **kwargs)


class DockerWorker:
    """One started worker container, warm or busy. Offers what ProcessSession uses of a worker."""

    def __init__(self, plan: ContainerPlan, engine: Engine):
        self.plan, self.engine = plan, engine
        self.private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))
        self.workdir = self.private / "work"
        #: what the job can fill on the host's disk: its folder, and its stdout and stderr files, which
        #: a container writes there (the process backend keeps them in a ring in memory)
        self.disk_folders = (self.workdir, self.private / "io")
        self.lease: uids.Lease | None = None
        self._paused: set[int] = set()
        self.frames = FrameBuffer()
        self.ready_info: dict[str, Any] | None = None
        self.started = time.monotonic()
        self.container_id: str | None = None
        #: the container's init process as this machine's /proc numbers it (None: not visible)
        self.host_pid: int | None = None
        self.chan_r = self.chan_w = -1
        self.ctl: socket.socket | None = None
        self.fds_sock: socket.socket | None = None
        self._placeholder = -1
        self._listener: socket.socket | None = None
        self._fds_listener: socket.socket | None = None
        self._pidfd = -1
        self._oom_file: str | None = None
        self._oom_before = 0
        self._outputs: dict[str, int] = {}
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._cleaned = False
        self._cleaned_up = threading.Event()
        self._token = secrets.token_hex(16)
        try:
            self._start()
        except BaseException:
            self.cleanup()
            raise

    # ---- start-up --------------------------------------------------------------------------------
    def _start(self) -> None:
        os.chmod(self.private, 0o711)
        if self.plan.lease_uids:
            self.lease = uids.lease()
        uid = self.lease.uid if self.lease else os.getuid()
        gid = self.lease.gid if self.lease else os.getgid()
        self.workdir.mkdir(mode=0o700)
        io, chan = self.private / "io", self.private / "chan"
        io.mkdir(mode=0o755)
        chan.mkdir(mode=0o755)
        for name in ("stdout", "stderr"):
            path = io / name
            # Writable, not readable, by the worker's uid; the parent reads through its own fd.
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.chmod(path, 0o622 if uid != os.getuid() else 0o600)
            self._outputs[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        for name in ("to_worker", "from_worker"):
            os.mkfifo(chan / name, 0o600)
        self.chan_r = os.open(chan / "from_worker", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # A writer that keeps the worker's reads from seeing end-of-file until the real one opens.
        self._placeholder = os.open(chan / "to_worker", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._listener, self._fds_listener = _listen(chan / "control"), _listen(chan / "fds")
        if uid != os.getuid():
            os.chown(self.workdir, uid, gid)
            for name in RENDEZVOUS:
                os.chown(chan / name, uid, gid)
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._epoll.register(self._fds_listener.fileno(), select.EPOLLIN)
        self._epoll.register(self.chan_r, select.EPOLLIN)
        self.container_id = self._create(uid, gid)
        self.engine.call("start", self.container_id)
        self._find_host_process()

    def _create(self, uid: int, gid: int) -> str:
        plan = self.plan
        private = str(self.private)
        if ":" in private:
            raise SandboxError(f"the private folder {private} contains ':', which a bind cannot name")
        home = str(self.workdir)
        env = dict(plan.env, HOME=home, TMPDIR=home, TEMP=home, TMP=home, XDG_CACHE_HOME=f"{home}/.cache",
                   TRITON_CACHE_DIR=f"{home}/.triton", TORCH_EXTENSIONS_DIR=f"{home}/.torch_extensions",
                   TORCHINDUCTOR_CACHE_DIR=f"{home}/.inductor", CUDA_CACHE_PATH=f"{home}/.nv")
        worker = dict(plan.worker, workdir=home)
        config = {"io": f"{private}/io", "chan": f"{private}/chan", "token": self._token, "worker": worker}
        binds = [f"{private}:{private}:rw"] + list(plan.binds)
        binds += [f"/dev/null:{p}:ro" for p in plan.hidden_files]
        tmpfs = {"/tmp": f"rw,nosuid,nodev,size={plan.tmpfs_bytes},mode=1777",
                 "/var/tmp": f"rw,nosuid,nodev,size={plan.tmpfs_bytes},mode=1777"}
        tmpfs.update({p: "ro,nosuid,nodev,size=4096,mode=755" for p in plan.hidden_dirs})
        api = self.engine.api
        host_config = api.create_host_config(
            binds=binds, tmpfs=tmpfs, read_only=True, network_mode="none", ipc_mode="private",
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=plan.memory_bytes, memswap_limit=plan.memory_bytes, pids_limit=plan.pids,
            shm_size=plan.tmpfs_bytes, auto_remove=True, init=False, oom_score_adj=500,
            log_config={"Type": "none", "Config": {}},
            ulimits=[{"Name": "core", "Soft": 0, "Hard": 0}],
            devices=list(plan.devices) or None, device_requests=list(plan.device_requests) or None,
            group_add=list(plan.group_add) or None)
        created = self.engine.call(
            "create_container", plan.image, command=[json.dumps(config)],
            entrypoint=[plan.python, "-m", "kernforge.sandbox.docker_entry"], user=f"{uid}:{gid}",
            environment=env, working_dir=home, labels=plan.labels, hostname="kernforge-sandbox",
            host_config=host_config, network_disabled=True)
        return created["Id"]

    def _find_host_process(self) -> None:
        """The container's init in this machine's /proc, held through a pidfd; None if it is not
        visible here (or already gone: then the channel says so)."""
        try:
            state = self.engine.call("inspect_container", self.container_id)["State"]
        except (NotFound, APIError):
            return  # auto-removed already: it died at once, and the channel says so
        pid = int(state.get("Pid") or 0)
        if pid <= 0 or not hasattr(os, "pidfd_open"):
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                cgroups = f.read()
            signal.pidfd_send_signal(pidfd, 0)
        except OSError:
            os.close(pidfd)
            return
        if self.container_id not in cgroups:
            os.close(pidfd)  # another pid namespace: that number is someone else here
            return
        self._pidfd, self.host_pid = pidfd, pid
        self._epoll.register(pidfd, select.EPOLLIN)
        self._oom_file = _oom_counter(cgroups, self.container_id)
        self._oom_before = _read_oom_kills(self._oom_file)

    def fileno(self) -> int:
        """One descriptor that turns readable when anything happens: the entry point connects,
        the worker writes, or the container's init exits."""
        return self._epoll.fileno()

    def poll_ready(self) -> bool:
        """Advance start-up; True once the worker said ready. SandboxError if the container died
        or sent anything else (no candidate code has run yet: a broken image or spec)."""
        if self.ready_info is not None:
            return True
        if self.ctl is None:
            self._accept()
            if self.ctl is None:
                if self._exited():
                    raise SandboxError(f"worker container exited while starting: {self.startup_error()}")
                return False
        if not _readable(self.chan_r):
            if self._exited():
                raise SandboxError(f"worker container exited while starting: {self.startup_error()}")
            return False
        return read_ready_frame(self)

    def _accept(self) -> None:
        """Take the entry point's two connections (the descriptor channel, then the control
        socket) as each proves itself with the token; then open the real writer of the job
        channel and remove the rendezvous files."""
        if self.fds_sock is None:
            self.fds_sock = self._take(self._fds_listener)
            if self.fds_sock is None:
                return
            self.fds_sock.setblocking(False)
            self._close_listener(self._fds_listener)
            self._fds_listener = None
        conn = self._take(self._listener)
        if conn is None:
            return
        conn.setblocking(True)
        chan = self.private / "chan"
        self.chan_w = os.open(chan / "to_worker", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.close(self._placeholder)
        self._placeholder = -1
        self._close_listener(self._listener)
        self._listener = None
        for name in RENDEZVOUS:
            os.unlink(chan / name)
        self.ctl = conn

    def _take(self, listener: socket.socket | None) -> socket.socket | None:
        """The first connection waiting on ``listener`` that sends the token (None: none yet)."""
        assert listener is not None
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return None
            conn.settimeout(5.0)
            try:
                token = b""
                while len(token) < len(self._token):
                    chunk = conn.recv(len(self._token) - len(token))
                    if not chunk:
                        break
                    token += chunk
            except OSError:
                token = b""
            if token == self._token.encode():
                return conn
            conn.close()  # not our entry point: keep waiting for it

    def _close_listener(self, listener: socket.socket | None) -> None:
        assert listener is not None
        self._epoll.unregister(listener.fileno())
        listener.close()

    def startup_error(self) -> str:
        tail = self.tail("stderr", STDERR_IN_ERRORS).strip() or "(no output)"
        return f"container {(self.container_id or '?')[:12]}; stderr:\n{tail}"

    def boost(self) -> None:
        """Back to normal CPU priority: the worker has its job now (root parents only)."""
        if self.host_pid is not None and os.geteuid() == 0 and self.plan.worker.get("nice"):
            procs.renice_tree(self.host_pid, 0)

    def freeze_target(self) -> tuple[int, int | None] | None:
        """What ``pause`` stops: the job's root on the host and its uid (procs.freeze_many), None once it exited."""
        if self.host_pid is not None and not self._exited():
            return self.host_pid, self.lease.uid if self.lease is not None else None
        return None

    def stopped(self, pids: set[int]) -> None:
        """``pids`` were stopped for this job (procs.freeze_many): ``resume`` lets them go on."""
        self._paused |= pids

    def resume(self) -> None:
        procs.thaw(self._paused)
        self._paused = set()

    def idle_alive(self) -> bool:
        """A warm worker sends nothing until it has a job: anything readable means it died."""
        return not _readable(self.chan_r) and not self._exited()

    def alive(self) -> bool:
        return not self._exited()

    def oom_killed(self) -> bool:
        """The kernel's OOM killer acted in this container's memory cgroup since it started."""
        return self._oom_file is not None and _read_oom_kills(self._oom_file) > self._oom_before

    def _exited(self) -> bool:
        with self._lock:
            return self._pidfd >= 0 and _readable(self._pidfd)

    # ---- teardown --------------------------------------------------------------------------------
    def tail(self, stream: str, limit: int) -> str:
        fd = self._outputs.get(stream, -1)
        if fd < 0:
            return ""
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, limit, max(0, size - limit))
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return f"[... {size - limit} earlier bytes dropped ...]\n{text}" if size > limit else text

    def kill(self) -> None:
        """SIGKILL the container's init now (idempotent): its pid namespace, and so every process
        of the job, dies with it. Descriptors stay open until ``cleanup``."""
        with self._lock:
            if self._pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
        if self.container_id is not None:
            self._api_quietly("kill")

    def cleanup(self) -> None:
        """Kill the container, wait for its processes, release everything (idempotent). The
        engine removes the container itself (auto-remove); the backend sweeps what it missed."""
        with self._lock:
            first = not self._cleaned
            self._cleaned = True
        if not first:
            self._cleaned_up.wait(EXIT_WAIT_SECONDS + 30)  # another thread is at it: done means done
            return
        try:
            self._teardown()
        finally:
            self._cleaned_up.set()

    def _teardown(self) -> None:
        self.kill()
        if self._pidfd >= 0:
            select.select([self._pidfd], [], [], EXIT_WAIT_SECONDS)
        elif self.container_id is not None:
            # The API's kill only sends the signal: wait until the container is really gone.
            self._api_quietly("remove_container", force=True)
            self._api_quietly("wait", timeout=EXIT_WAIT_SECONDS, condition="removed")
        with self._lock:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
        for fd in [self.chan_r, self.chan_w, self._placeholder] + list(self._outputs.values()):
            if fd >= 0:
                os.close(fd)
        self.chan_r = self.chan_w = self._placeholder = -1
        self._outputs.clear()
        for sock in (self.ctl, self.fds_sock, self._listener, self._fds_listener):
            if sock is not None:
                sock.close()
        self.ctl = self.fds_sock = self._listener = self._fds_listener = None
        self._epoll.close()
        if self.lease is not None:
            uids.release(self.lease, clean=procs.sweep_uid(self.lease.uid))
            self.lease = None
        remove_tree(self.private)
        if self.private.exists():
            raise SandboxError(f"cannot remove {self.private}: {sorted(str(p) for p in self.private.rglob('*'))[:10]}")

    def _api_quietly(self, name: str, **kwargs) -> None:
        try:
            call_quietly(self.engine, name, self.container_id, **kwargs)
        except OSError as e:  # the engine did not answer in time: the backend's sweep removes it later
            log.warning("docker %s %s: %s", name, self.container_id[:12], e)


def call_quietly(engine: Engine, name: str, container_id: str, **kwargs) -> bool:
    """The engine's ``name`` on a container that may be gone: False if it is (404, e.g. auto-removed)
    or the call does not apply (409: not running, or removal already under way); SandboxError for
    any other refusal."""
    try:
        engine.call(name, container_id, **kwargs)
    except NotFound:
        return False
    except APIError as e:
        if e.status_code in (404, 409):
            return False
        raise SandboxError(f"docker {name} {container_id[:12]}: {e.explanation or e}") from None
    return True


def _listen(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    listener.setblocking(False)
    return listener


def _readable(fd: int) -> bool:
    if fd < 0:
        return False
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _oom_counter(cgroups: str, container_id: str) -> str | None:
    """The file counting OOM kills in the container's memory cgroup (v2 or v1), if readable."""
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue
        if controllers == "":
            candidate = f"/sys/fs/cgroup{path}/memory.events"
        elif "memory" in controllers.split(","):
            candidate = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
        else:
            continue
        if os.path.exists(candidate):
            return candidate
    return None


def _read_oom_kills(path: str | None) -> int:
    if path is None:
        return 0
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
