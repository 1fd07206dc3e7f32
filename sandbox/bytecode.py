"""Bytecode for the packages a candidate's worker imports, compiled once by trusted code.

An environment installed without bytecode (uv's default; the H200's torch: no ``.pyc`` for its
2,141 modules, with ``PYTHONDONTWRITEBYTECODE=1``) makes every Python process compile what it
imports from source. Trusted workers keep theirs in the trusted cache (env.trusted_cache_env). A
candidate's worker may write none anywhere (a module's bytecode is code the next process to
import it runs), so every one of them compiled torch, Triton and NumPy again: some 1,050 modules,
2 s of a worker's start on one core of the CI machine (bench/bytecode_probe.py), on the path of
every worker started while a verdict waits (the audit's Nsight Compute worker, a pool refilled
after a kill).

``compile_missing`` writes the missing bytecode beside the sources, as ``pip install`` does by
default, in a trusted process (``python -m compileall``) when a judge opens. Only the folders of
packages the judge's own process imported whose bytecode is missing, only where the judge's user
may write, never the kernforge package (its built-in tasks hold hidden shapes) nor a path the
caller excludes (the tasks' hidden files). py_compile writes each file under a temporary name and
renames it, so a worker that starts meanwhile reads a whole file or compiles from source as
before. No candidate can write there: a strict worker's view of the file system is read-only
outside its own folder (isolation.py), and a worker of another uid may not write the judge's
files.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterable, Sequence

#: the packages whose bytecode is checked: what a candidate's worker preloads and what they import
PACKAGES = ("torch", "triton", "numpy")
#: a compile of the missing bytecode that takes longer is stopped (what it wrote stays: every file is whole)
COMPILE_TIMEOUT_S = 600.0
#: the kernforge package, never compiled here (its built-in tasks hold hidden shapes)
KERNFORGE_ROOT = Path(__file__).resolve().parents[1]

_started = False
_lock = threading.Lock()


def beside(source: str | Path) -> Path:
    """Where Python looks for ``source``'s bytecode when no pycache prefix is set."""
    path = Path(source)
    return path.parent / "__pycache__" / f"{path.stem}.{sys.implementation.cache_tag}.pyc"


def _root(source: Path, search: Sequence[Path]) -> Path | None:
    """The top-level package folder (or single-file module) ``source`` belongs to, under the
    first entry of ``search`` that holds it."""
    for entry in search:
        try:
            rel = source.relative_to(entry)
        except ValueError:
            continue
        return entry / rel.parts[0]
    return None


def missing_roots(sources: Iterable[str | Path], search: Sequence[str | Path], exclude: Sequence[str | Path] = ()) -> list[Path]:
    """The top-level folders (or modules) of ``sources`` with a ``.py`` file whose bytecode is
    missing beside it, that the current user may write; none that is or holds a path of
    ``exclude``. One inside an excluded folder is kept: a virtual environment inside a kernforge
    checkout (uv's ``.venv``) is no part of kernforge's package."""
    entries = sorted({Path(p).resolve() for p in search if p}, key=lambda p: -len(p.parts))  # the deepest entry first
    kept = [Path(p).resolve() for p in exclude]
    roots: set[Path] = set()
    for item in sources:
        source = Path(item)
        if source.suffix != ".py" or beside(source).exists():
            continue
        root = _root(source.resolve(), entries)
        if root is None or any(root == k or root in k.parents for k in kept):
            continue
        folder = root if root.is_dir() else root.parent
        if os.access(folder, os.W_OK):
            roots.add(root)
    return sorted(roots)


def imported_sources(packages: Sequence[str] | None = None) -> list[str]:
    """The source files of ``packages`` (PACKAGES by default) and their submodules this process
    imported; the packages are imported first (a worker preloads them; so has the judge's process,
    usually)."""
    prefixes = tuple(PACKAGES if packages is None else packages)
    for name in prefixes:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    out = []
    for name, module in list(sys.modules.items()):
        if name.split(".", 1)[0] not in prefixes:
            continue
        path = getattr(module, "__file__", None)
        # torch.ops and torch.classes name files that do not exist ("_ops.py")
        if path and path.endswith(tuple(importlib.machinery.SOURCE_SUFFIXES)) and os.path.isabs(path) and os.path.isfile(path):
            out.append(path)
    return out


def describe() -> tuple[bool, str]:
    """For ``kernforge doctor``: whether every candidate worker reads the bytecode of what it
    imports, or compiles it from source at its start; and what a judge does about it."""
    sources = imported_sources()
    lacking = [s for s in sources if not beside(s).exists()]
    names = ", ".join(PACKAGES)
    if not lacking:
        return True, f"present beside all {len(sources)} modules of {names} a worker imports"
    roots = missing_roots(lacking, sys.path, [KERNFORGE_ROOT])
    if roots:
        return True, (f"{len(lacking)} of the {len(sources)} modules of {names} a worker imports have none: a judge "
                      f"compiles it beside them when it opens ({', '.join(str(r) for r in roots)})")
    return False, (f"{len(lacking)} of the {len(sources)} modules of {names} a worker imports have none, and their "
                   "folders are not writable here: every candidate worker compiles them from source at its start "
                   "(bench/bytecode_probe.py); install with bytecode (pip's default, uv's --compile-bytecode)")


def command(roots: Sequence[Path], exclude: Sequence[str | Path], processes: int) -> list[str]:
    """``compileall`` over ``roots``, leaving out any path of ``exclude`` inside one of them."""
    cmd = [sys.executable, "-m", "compileall", "-q", "-j", str(processes)]
    inside = [k for k in (Path(p).resolve() for p in exclude) if any(k == r or r in k.parents for r in roots)]
    if inside:
        cmd += ["-x", "|".join(re.escape(str(k)) for k in inside)]
    return cmd + [str(r) for r in roots]


def compile_missing(exclude: Sequence[str | Path] = (), *, processes: int | None = None,
                    timeout_s: float = COMPILE_TIMEOUT_S) -> list[Path]:
    """Compile the missing bytecode of the packages this process imported (PACKAGES), beside their
    sources; the roots compiled (none where nothing is missing). Blocks until done."""
    skip = [KERNFORGE_ROOT, *exclude]
    roots = missing_roots(imported_sources(), sys.path, skip)
    if not roots:
        return []
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    cores = processes or max(1, (os.cpu_count() or 1) // 4)
    try:
        subprocess.run(command(roots, skip, cores), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass  # a head start only: what was written is whole, the rest compiles from source as before
    return roots


def compile_missing_in_background(exclude: Sequence[str | Path] = ()) -> threading.Thread | None:
    """``compile_missing`` in a daemon thread, once per process (the packages a judge's process
    imports are the same for every judge it opens); None when it was started here before."""
    global _started
    with _lock:
        if _started:
            return None
        _started = True
    thread = threading.Thread(target=compile_missing, args=(tuple(exclude),), name="kernforge-bytecode", daemon=True)
    thread.start()
    return thread
