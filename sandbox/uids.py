"""A private uid per live worker, when the parent runs as root.

Root ignores RLIMIT_NPROC and can read anything, so a root parent never lets candidate code run
as root: each live worker gets a uid (and a gid of the same number) of its own from a range no
account uses. Its own uid makes RLIMIT_NPROC a per-worker fork limit, keeps it out of root's
files and of /proc/<pid>/environ of every other process, and lets the parent find and kill
every process it left behind. Leases are held with flock on files in a root-only folder, so two
kernforge processes on one machine never hand out the same uid, and a crashed parent's leases
free themselves.
"""

from __future__ import annotations

import fcntl
import functools
import glob
import os
import pwd
import grp
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .isolation import Mechanism, closed_ancestors, python_paths, unreadable_for_others

UID_BASE = int(os.environ.get("KERNFORGE_SANDBOX_UID_BASE", "50000"))
UID_COUNT = 1000


@dataclass(frozen=True)
class Lease:
    uid: int
    gid: int
    fd: int


_lock = threading.Lock()
_in_use: set[int] = set()
_quarantined: set[int] = set()


def _lock_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / "kernforge-sandbox-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    if info.st_uid != 0 or info.st_mode & 0o077 or not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{folder} must be a folder owned by root with mode 0700")
    return folder


def _unused_id(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return False
        except KeyError:
            pass
    return True


def lease() -> Lease:
    """A uid no live worker (of any kernforge process) holds; OSError if the range is spent."""
    folder = _lock_dir()
    with _lock:
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            if uid in _in_use or uid in _quarantined or not _unused_id(uid):
                continue
            fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if procs.pids_of_uid(uid):
                # Something still runs as this uid (another tool's, or a leftover): leave it be.
                os.close(fd)
                continue
            _in_use.add(uid)
            return Lease(uid, uid, fd)
    raise OSError(f"all {UID_COUNT} sandbox uids from {UID_BASE} are in use")


def release(held: Lease, clean: bool) -> None:
    """Give the uid back; one that still has processes (``clean`` False) is never reused here."""
    with _lock:
        _in_use.discard(held.uid)
        if not clean:
            _quarantined.add(held.uid)
    os.close(held.fd)


def _can_setuid() -> bool:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                effective = int(line.split()[1], 16)
                return bool(effective & (1 << 6)) and bool(effective & (1 << 7))  # CAP_SETGID, CAP_SETUID
    return False


@functools.lru_cache(maxsize=None)
def device_groups() -> tuple[int, ...]:
    """Groups of GPU device nodes that other users cannot open (e.g. ``video``, ``render``):
    a dropped worker keeps them as supplementary groups so it can still use its GPU."""
    gids = set()
    for node in glob.glob("/dev/nvidia*") + glob.glob("/dev/dri/*"):
        try:
            info = os.stat(node)
        except OSError:
            continue
        if info.st_mode & 0o006 != 0o006:
            gids.add(info.st_gid)
    return tuple(sorted(gids))


def uid_drop_status(mech: Mechanism) -> tuple[bool, str]:
    """Whether workers under ``mech`` run as private uids, and why not if they do not."""
    if os.geteuid() != 0:
        return False, f"parent is uid {os.geteuid()}, so workers keep that uid (with no capabilities)"
    if not _can_setuid():
        return False, "parent is root without CAP_SETUID/CAP_SETGID: workers keep uid 0 (with no capabilities)"
    paths = python_paths()
    if not mech.mountns:
        closed = sorted({a for p in paths for a in closed_ancestors(p)})
        if closed:
            return False, f"workers run as ROOT: {', '.join(closed)} closed to other users and no mount namespace to open it"
    bad = unreadable_for_others(paths)
    if bad:
        return False, f"workers run as ROOT: {', '.join(bad)} not readable by other users"
    try:
        _lock_dir()
    except OSError as e:
        return False, f"workers run as ROOT: {e}"
    return True, f"workers drop to private uids {UID_BASE}-{UID_BASE + UID_COUNT - 1}, one per worker"
