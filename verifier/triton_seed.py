"""The Triton cache a candidate's worker warms up with, built once per pool instead of once per worker.

Every worker has a private Triton cache (``$HOME/.triton``), and its trusted warm-up launches one
trivial kernel (harness.py) so that Triton's own modules are built before any candidate code runs:
the driver's C module and the kernel's launcher, each built with the host's C compiler, and the
kernel itself. On a loaded GPU host (Inductor compiles on every core, the warm-up niced) a start
took 9.6 s and the pool of six ran dry (H100, session 62). The same files come out of every
warm-up: they are keyed by what they are built from (their source, the platform, the compiler's
options), never by the folder they lie in.

``TritonSeed`` is the sandbox's HomeSeed for that cache: the first warm worker's cache is read
before it is given a job, and each later worker's home gets a copy before its process starts, so
its warm-up finds them built. Trust: a worker's home holds, at that moment, only what trusted code
wrote there (its warm-up; no candidate code has run in it, and its uid's earlier processes were
swept before the uid was leased again). Only regular files are read, never through a link, at
most ``MAX_FILES`` and ``MAX_BYTES`` in all, one level of key folders deep. Each worker gets its
own copy, owned by its uid: a candidate that rewrites its copy rewrites its own cache, as it could
before, and never another worker's. A kernel's group file names its members by absolute path (the
first worker's): in each copy they name that worker's own files, and a group that names anything
else is left out (its kernel is then compiled in the warm-up, as before).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: the cache folder in a worker's home (sandbox/env.py ``worker_env``: TRITON_CACHE_DIR)
CACHE = ".triton"
#: a warm-up's cache holds a handful of files; anything larger is not one, and is not taken
MAX_FILES = 64
MAX_BYTES = 64 << 20
#: where a kernel's group file names its members
_GROUP_PREFIX = "__grp__"


class TritonSeed:
    """A pool's seed for its workers' Triton caches (sandbox HomeSeed): see the module docstring."""

    def __init__(self) -> None:
        #: ``<key>/<leaf>`` -> bytes; a group file's member paths as bare names (``_portable``)
        self.files: dict[str, bytes] | None = None
        self._lock = threading.Lock()

    def harvest(self, home: Path) -> None:
        with self._lock:
            if self.files is not None:
                return
            try:
                files = _read(Path(home) / CACHE)
            except FileNotFoundError:  # a warm-up that built nothing (no GPU): nothing to take
                return
            except OSError as err:  # a seed is a saving, never a reason a worker fails
                log.warning("no Triton cache seed from %s: %s", home, err)
                return
            if files:
                self.files = files

    def plant(self, home: Path, uid: int | None, gid: int | None) -> None:
        with self._lock:
            files = self.files
        if not files:
            return
        root = Path(home) / CACHE
        keys: dict[str, list[tuple[str, bytes]]] = {}
        for name, body in files.items():
            key, leaf = name.split("/")
            keys.setdefault(key, []).append((leaf, body))
        # every step through a descriptor of the folder above: nothing is followed through a link,
        # nothing chowned by its path (the home is the worker's uid's)
        opened: list[int] = []
        try:
            home_fd = _open_dir(str(home), None, opened)
            root_fd = _make_dir(CACHE, home_fd, uid, gid, opened)
            for key, leaves in keys.items():
                key_fd = _make_dir(key, root_fd, uid, gid, opened)
                for leaf, body in leaves:
                    if leaf.startswith(_GROUP_PREFIX):
                        body = _placed(body, root / key)
                    _write(leaf, key_fd, body, uid, gid)
        except OSError as err:  # the worker then builds what is missing itself, as without a seed
            log.warning("Triton cache seed not written into %s: %s", home, err)
        finally:
            for fd in opened:
                os.close(fd)


def _read(root: Path) -> dict[str, bytes]:
    """Every regular file one key folder deep under ``root`` (never through a link), within
    ``MAX_FILES`` and ``MAX_BYTES``; {} where there is more than that or anything else."""
    files: dict[str, bytes] = {}
    size = 0
    if not stat.S_ISDIR(os.lstat(root).st_mode):
        return {}
    for key in sorted(os.listdir(root)):
        folder = root / key
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return {}
        for leaf in sorted(os.listdir(folder)):
            fd = os.open(folder / leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode) or len(files) >= MAX_FILES or size + info.st_size > MAX_BYTES:
                    return {}
                body = f.read(MAX_BYTES - size + 1)
            size += len(body)
            if size > MAX_BYTES:
                return {}
            if leaf.startswith(_GROUP_PREFIX):
                body = _portable(body, folder)
                if body is None:
                    continue  # a group naming files elsewhere: its kernel compiles in each warm-up
            files[f"{key}/{leaf}"] = body
    return files


def _portable(body: bytes, folder: Path) -> bytes | None:
    """A group file with its members named by leaf, each a file of ``folder``; None where it
    names anything else."""
    try:
        group = json.loads(body)
        paths = group["child_paths"]
        leaves = {child: Path(path).name for child, path in paths.items()}
        if not all(Path(path).parent == folder for path in paths.values()):
            return None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    group["child_paths"] = leaves
    return json.dumps(group).encode()


def _placed(body: bytes, folder: Path) -> bytes:
    """A portable group file (``_portable``) naming its members in ``folder``, as Triton reads it."""
    group = json.loads(body)
    group["child_paths"] = {child: str(folder / leaf) for child, leaf in group["child_paths"].items()}
    return json.dumps(group).encode()


def _open_dir(name: str, parent: int | None, opened: list[int]) -> int:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    opened.append(fd)
    return fd


def _make_dir(name: str, parent: int, uid: int | None, gid: int | None, opened: list[int]) -> int:
    """A new folder ``name`` in ``parent`` (never one that is there already), owned by ``uid``."""
    os.mkdir(name, 0o700, dir_fd=parent)
    fd = _open_dir(name, parent, opened)
    if uid is not None:
        os.fchown(fd, uid, gid if gid is not None else -1)
    return fd


def _write(name: str, folder: int, body: bytes, uid: int | None, gid: int | None) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
        if uid is not None:
            os.fchown(f.fileno(), uid, gid if gid is not None else -1)
