"""Worker side: build the file-system view in a fresh mount namespace without bubblewrap.

Run by the worker's supervisor (root inside its namespaces, before any untrusted code exists)
when the ``namespaces`` mechanism is used: it carries out the same mount plan bwrap would get as
arguments (private temp dirs, hidden folders, folders bound back), then remounts every other
mount read-only. Standard library only (mount(2) through ctypes).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from typing import Iterable

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOSYMFOLLOW, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x100, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000

#: Per-mount options that must be kept on a remount (the kernel refuses to drop locked ones).
OPTION_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
                "nosymfollow": MS_NOSYMFOLLOW}
#: Left as they are: kernel interfaces and device nodes (GPUs must stay usable).
KEEP_WRITABLE_UNDER = ("/proc", "/dev", "/sys")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mountpoints() -> list[tuple[str, str]]:
    """(mount point, per-mount options) for every mount, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            found.append((_unescape(fields[4]), fields[5]))
    return found


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def apply_plan(plan: Iterable[dict], tmpfs_bytes: int) -> list[str]:
    """Carry out ``plan`` (MountOp dicts, in order), then make everything else read-only.
    Returns warnings for mounts that could not be made read-only; raises OSError when a step
    of the plan itself fails (the worker must not start with a view it did not ask for)."""
    plan = list(plan)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Bind sources are opened before any tmpfs can cover them (the private /dev covers /dev/null,
    # which hides files); the bind then goes through the fd.
    sources = {op["path"]: os.open(op["path"], os.O_PATH | os.O_CLOEXEC) for op in plan if op["kind"] == "bind"}
    null = os.open("/dev/null", os.O_PATH | os.O_CLOEXEC)
    writable, covered = set(), []
    for op in plan:
        path = op["path"]
        if op["kind"] == "tmpfs":
            if not os.path.exists(path) and any(_under(path, c) for c in covered):
                # hidden by an earlier tmpfs of ours: make the mount point there, as bwrap does
                os.makedirs(path, 0o755, exist_ok=True)
            covered.append(path)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={op['mode']:o},size={tmpfs_bytes}")
        elif op["kind"] == "bind":
            fd = sources[path]
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, 0o755, exist_ok=True)
            elif not os.path.exists(path):
                os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        elif op["kind"] == "hide_file":
            mount(f"/proc/self/fd/{null}", path, None, MS_BIND)
        elif op["kind"] == "link":
            os.symlink(op["target"], path)
        else:
            raise OSError(errno.EINVAL, f"unknown mount step {op['kind']!r}")
        if op.get("writable"):
            writable.add(path)
    for fd in (*sources.values(), null):
        os.close(fd)
    return remount_read_only(writable)


def remount_read_only(writable: set[str]) -> list[str]:
    warnings = []
    for point, options in mountpoints():
        if point in writable or any(_under(point, top) for top in KEEP_WRITABLE_UNDER):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options.split(","):
            flags |= OPTION_FLAGS.get(option, 0)
        try:
            mount(None, point, None, flags)
        except OSError as e:
            # A mount point hidden under one of our tmpfs no longer resolves: nothing to protect.
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                warnings.append(f"{point} stays writable: {os.strerror(e.errno)}")
    return warnings
