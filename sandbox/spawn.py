"""Starting one worker process and tearing it down again (the parent's side).

A worker owns a private folder ``kf-sbx-*`` (mode 0711, the parent's) holding ``work/`` (the
worker's cwd, HOME and TMPDIR, owned by its uid). Its stdout and stderr are pipes the parent
reads into bounded memory (``OutputRings``). Four descriptors join it to the parent: the job channel (two
pipes, fds 3 and 4 in the worker), a control socket to its supervisor (fd 5), which carries
the job process's exact wait status and whose closing tells the supervisor to kill everything,
and the descriptor channel (a Unix socket pair, fd 6 in the job process).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import procs, uids
from .env import worker_env
from .isolation import (TMPFS_BYTES, Mechanism, bwrap_command, checkout_metadata, mount_plan, other_roots,
                        package_extras, python_paths, toolkit_paths)
from .protocol import RESERVED_KEY, FrameBuffer, HomeSeed, SandboxError, WorkerSpec

STDERR_IN_ERRORS = 3000
#: Private folders are named kf-sbx-<parent pid>-*, so those of a parent that died can be found.
PRIVATE_PREFIX = "kf-sbx-"
#: Nice value of workers while they warm up and wait (root parents only).
WARM_NICE = 10


class Worker:
    """One started worker process, warm or busy."""

    def __init__(self, spec: WorkerSpec, mech: Mechanism, drop_uid: bool, seed: HomeSeed | None = None):
        """``seed``: files written into the worker's home before its process starts (HomeSeed)."""
        self.spec, self.mech, self.seed = spec, mech, seed
        self.private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))
        self.workdir = self.private / "work"
        self.lease: uids.Lease | None = None
        self._paused: set[int] = set()
        self.proc: subprocess.Popen | None = None
        self.frames = FrameBuffer()
        self.ready_info: dict[str, Any] | None = None
        self.started = time.monotonic()
        self.chan_r = self.chan_w = -1
        self.ctl: socket.socket | None = None
        self.fds_sock: socket.socket | None = None
        self.outputs: OutputRings | None = None
        self._cleaned = False
        try:
            self._start(drop_uid)
        except BaseException:
            self.cleanup()
            raise

    def _start(self, drop_uid: bool) -> None:
        os.chmod(self.private, 0o711)
        self.workdir.mkdir(mode=0o700)
        if drop_uid:
            self.lease = uids.lease()
            os.chown(self.workdir, self.lease.uid, self.lease.gid)
        if self.seed is not None:
            self.seed.plant(self.workdir, self.lease.uid if self.lease else None, self.lease.gid if self.lease else None)
        env = worker_env(self.spec, self.workdir, os.environ)
        to_worker_r, self.chan_w = os.pipe()
        self.chan_r, from_worker_w = os.pipe()
        self.ctl, ctl_child = socket.socketpair()
        self.fds_sock, fds_child = socket.socketpair()
        child_fds = (to_worker_r, from_worker_w, ctl_child.fileno(), fds_child.fileno())
        strict = self.spec.isolation != "none"
        needed = (python_paths() + tuple(p for p in env.get("PYTHONPATH", "").split(":") if os.path.isabs(p))
                  + toolkit_paths(env))
        hidden = ((os.path.expanduser("~"),) + tuple(self.spec.hidden_paths) + checkout_metadata(needed)
                  + package_extras() + other_roots()) if strict else ()
        plan = mount_plan(str(self.workdir), needed, hidden, drop_uid) if self.mech.mountns else []
        config = {
            "fds": list(child_fds), "workdir": str(self.workdir), "preload": list(self.spec.preload),
            "warmup": self.spec.warmup, "strict": strict, "pidns": self.mech.pidns,
            "uid": self.lease.uid if self.lease else None, "gid": self.lease.gid if self.lease else None,
            "groups": list(uids.device_groups()) if self.lease and self.spec.device != "cpu" else [],
            "fork": self.spec.fork,
            "plan": [op.to_dict() for op in plan] if self.mech.name == "namespaces" and plan else None,
            "tmpfs_bytes": TMPFS_BYTES,
            # Only root can raise the priority again when the worker gets its job (boost()).
            "nice": WARM_NICE if os.geteuid() == 0 else 0,
        }
        if self.mech.name == "bwrap":
            prefix = bwrap_command(self.mech, plan, str(self.workdir))
        elif self.mech.name == "namespaces":
            prefix = list(self.mech.command) + ["--"]
        else:
            prefix = []
        cmd = list(self.spec.profiler) + prefix + [sys.executable, "-m", "kernforge.sandbox.worker", json.dumps(config)]
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, env=env,
                                         cwd=self.workdir, pass_fds=child_fds, start_new_session=True)
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (to_worker_r, from_worker_w, out_w, err_w):
                os.close(fd)
            ctl_child.close()
            fds_child.close()
        self.outputs = OutputRings({"stdout": out_r, "stderr": err_r})
        os.set_blocking(self.chan_w, False)
        self.fds_sock.setblocking(False)

    # ---- start-up --------------------------------------------------------------------------------
    def fileno(self) -> int:
        return self.chan_r

    def poll_ready(self) -> bool:
        """Read what the worker sent; True once it said ready. SandboxError if it died or sent
        anything else (no candidate code has run yet, so this is a broken spec or machine)."""
        if self.ready_info is not None:
            return True
        return read_ready_frame(self)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.poll_ready_within(deadline - time.monotonic()):
            if time.monotonic() >= deadline:
                self.kill()
                raise SandboxError(f"worker not ready after {timeout:.0f}s: {self.startup_error()}")

    def poll_ready_within(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.chan_r], [], [], max(0.0, timeout))
        return self.poll_ready() if readable else False

    def startup_error(self) -> str:
        code = self.proc.poll() if self.proc else None
        tail = self.tail("stderr", STDERR_IN_ERRORS).strip() or "(no output)"
        return f"exit status {code}; stderr:\n{tail}"

    def boost(self) -> None:
        """Back to normal CPU priority: the worker has its job now."""
        if self.proc is not None and os.geteuid() == 0 and self.proc.returncode is None:
            procs.renice_tree(self.proc.pid, 0)

    def freeze_target(self) -> tuple[int, int | None] | None:
        """What ``pause`` stops: the job's root and its uid (procs.freeze_many), None once it exited."""
        if self.proc is not None and self.proc.returncode is None:
            return self.proc.pid, self.lease.uid if self.lease is not None else None
        return None

    def warming_root(self) -> int | None:
        """The root of what stops the worker while it warms up (verifier/gate.py ``warming``;
        session.pause_all stops it, ``resume`` lets it go): its process tree, not its uid, since
        before its job only trusted start-up code runs in it, and not yet under the uid it drops
        to. None once it exited."""
        if self.proc is not None and self.proc.returncode is None:
            return self.proc.pid
        return None

    def stopped(self, pids: set[int]) -> None:
        """``pids`` were stopped for this job (procs.freeze_many): ``resume`` lets them go on."""
        self._paused |= pids

    def resume(self) -> None:
        procs.thaw(self._paused)
        self._paused = set()

    def idle_alive(self) -> bool:
        """A warm worker sends nothing until it has a job: anything readable means it died."""
        readable, _, _ = select.select([self.chan_r], [], [], 0)
        return not readable and self.proc is not None and self.proc.poll() is None

    # ---- teardown --------------------------------------------------------------------------------
    def tail(self, stream: str, limit: int) -> str:
        return self.outputs.tail(stream, limit) if self.outputs is not None else ""

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker (and a profiler above it) to exit."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        """SIGKILL the whole tree now (idempotent); the supervisor's namespace dies with it.
        Descriptors stay open (another thread may be waiting on them) until ``cleanup``."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            procs.kill_tree(self.proc.pid, pgid=self.proc.pid)
        else:
            # Reaped already: its pid may be reused, but its process group cannot be while any
            # member (a straggler of a trusted worker) is alive.
            procs.kill_group(self.proc.pid)

    def cleanup(self) -> None:
        """Kill everything, wait for it, and remove the private folder (idempotent)."""
        if self._cleaned:
            return
        self._cleaned = True
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                procs.kill_tree(self.proc.pid, pgid=self.proc.pid)
        for fd in (self.chan_r, self.chan_w):
            if fd >= 0:
                os.close(fd)
        self.chan_r = self.chan_w = -1
        for sock in (self.ctl, self.fds_sock):
            if sock is not None:
                sock.close()
        self.ctl = self.fds_sock = None
        if self.outputs is not None:
            self.outputs.close()
        if self.lease is not None:
            uids.release(self.lease, clean=procs.sweep_uid(self.lease.uid))
            self.lease = None
        remove_tree(self.private)


#: bytes of each of a worker's output streams kept (the newest); the rest is read and dropped
RING_BYTES = 1 << 20


class OutputRings:
    """A worker's stdout and stderr, read from pipes as they come and kept in memory, the newest
    ``RING_BYTES`` of each: what the worker prints never lands on the trusted side's disk, and a
    flood of it costs the parent one read loop, not gigabytes (diagnostics only, never evidence)."""

    def __init__(self, fds: dict[str, int]):
        self._fds = dict(fds)
        self._kept = {name: bytearray() for name in fds}
        self._total = {name: 0 for name in fds}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="kernforge-worker-output", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        open_fds = {fd: name for name, fd in self._fds.items()}
        while open_fds:
            try:
                ready, _, _ = select.select(list(open_fds), [], [], 1.0)
            except (OSError, ValueError):
                return  # closed under us (cleanup)
            for fd in ready:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    data = b""
                name = open_fds[fd]
                if not data:
                    del open_fds[fd]
                    continue
                with self._lock:
                    kept = self._kept[name]
                    kept += data
                    self._total[name] += len(data)
                    if len(kept) > RING_BYTES:
                        del kept[:len(kept) - RING_BYTES]

    def tail(self, stream: str, limit: int) -> str:
        """The last ``limit`` bytes of ``stream`` as text, saying how much came before."""
        self._thread.join(0.05)  # a worker that just ended: let the reader take its last bytes
        with self._lock:
            data, total = bytes(self._kept.get(stream, b"")[-limit:]), self._total.get(stream, 0)
        text = data.decode("utf-8", errors="replace")
        return f"[... {total - len(data)} earlier bytes dropped ...]\n{text}" if total > len(data) else text

    def close(self) -> None:
        self._thread.join(2.0)  # the worker is gone: its pipes end, and the reader with them
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}


def folder_usage(folder: Path, stop_bytes: int, stop_entries: int) -> tuple[int, int]:
    """Bytes allocated and entries below ``folder``, walked without recursion; the walk stops
    once either passes its ``stop_`` value (it is over a limit then: the exact figure is moot)."""
    size = entries = 0
    stack = [str(folder)]
    while stack and size <= stop_bytes and entries <= stop_entries:
        try:
            with os.scandir(stack.pop()) as found:
                for entry in found:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    size += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return size, entries


def free_space(folder: Path) -> tuple[int, int] | None:
    """Bytes and inodes free to an unprivileged writer on ``folder``'s file system, or None."""
    try:
        got = os.statvfs(folder)
    except OSError:
        return None
    return got.f_bavail * got.f_frsize, got.f_favail


def remove_stale_private_dirs(prefix: str = PRIVATE_PREFIX) -> list[Path]:
    """Remove the private folders (``<prefix><parent pid>-*``) of parents that no longer exist
    (killed before they could clean up; their workers died with them). Returns what was removed.
    Never raises: a folder that cannot be removed stays, and the next start tries again."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = folder.name[len(prefix):].split("-", 1)[0]
        try:
            if not pid.isdigit() or os.path.exists(f"/proc/{pid}") or not folder.is_dir() or folder.is_symlink():
                continue
            if folder.stat().st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if remove_tree(folder):
            removed.append(folder)
    return removed


def remove_tree(folder: Path) -> bool:
    """Remove ``folder`` and everything below it; whether it is gone. Never raises.

    A candidate shapes what its worker leaves: folders without write or search permission, and
    trees thousands of levels deep (``py_compile`` with a long ``cfile`` makes one). shutil.rmtree
    recurses once per level (a RecursionError past ~1,000, which escaped a verdict and then every
    later judge's start), and a path that deep is longer than the kernel takes. So this walks down
    with one directory descriptor open at a time, naming each entry relative to it, and climbs back
    through ``..``. Every process of the worker is dead by then (``Worker.cleanup``): nothing moves
    the tree while it is walked, and nothing is followed through a symbolic link."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            os.unlink(folder)  # a file or a link where the folder was
            return True
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700)
        top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        _empty(top)
    except OSError:
        pass
    finally:
        os.close(top)
    try:
        os.rmdir(folder)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _empty(top: int) -> None:
    """Remove everything inside the directory ``top`` (a descriptor, left open), depth first,
    without recursion; what cannot be removed is left."""
    names: list[str] = []  # the path from top down to where the walk is
    stuck: set[tuple[str, ...]] = set()  # folders that could not be entered or removed
    here = os.dup(top)
    try:
        while True:
            sub = None
            with os.scandir(here) as entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            os.unlink(entry.name, dir_fd=here)
                        elif sub is None and (*names, entry.name) not in stuck:
                            sub = entry.name
                    except OSError:
                        pass
            if sub is not None:
                try:
                    os.chmod(sub, 0o700, dir_fd=here)  # a job may leave it without read, write or search
                    below = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
                except OSError:
                    stuck.add((*names, sub))
                    continue
                os.close(here)
                here, names = below, names + [sub]
                continue
            if not names:
                return
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
            os.close(here)
            here, name, names = up, names[-1], names[:-1]
            try:
                os.rmdir(name, dir_fd=here)
            except OSError:
                stuck.add((*names, name))
    finally:
        os.close(here)


def read_ready_frame(worker: Any) -> bool:
    """Read what a starting worker sent on its channel; True once it said ready. Shared by the
    process and docker workers (each has ``chan_r``, ``frames``, ``kill``, ``startup_error``)."""
    chunk = os.read(worker.chan_r, 65536)
    if not chunk:
        worker.kill()
        raise SandboxError(f"worker failed to start: {worker.startup_error()}")
    worker.frames.feed(chunk)
    try:
        frame = worker.frames.pop()
    except ValueError as e:
        worker.kill()
        raise SandboxError(f"worker sent garbage while starting: {e}") from None
    if frame is None:
        return False
    if frame.get(RESERVED_KEY) != "ready":
        worker.kill()
        raise SandboxError(f"worker sent {str(frame)[:200]} instead of 'ready'")
    worker.ready_info = frame
    return True
