"""The base of a ``--from-host`` worker image, made from this machine (no registry needed).

The base holds the interpreter and the system libraries the host's Python and its extension
modules link against (found with ``ldd``), the dynamic loader, ``/bin/sh``, ``ldconfig`` and,
with ``--toolchain``, the C compiler Triton needs on a GPU. Python's library folders (the
standard library and site-packages, with torch and Triton) are *not* copied: the image names them
in a label and every worker container binds them read-only at the same path (see docker_image.py
for why). The base is imported with ``docker import`` and tagged with a digest of everything in
it, so an unchanged machine reuses it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from .isolation import outermost, under
from .protocol import SandboxError

HOSTBASE_REPO = "kernforge-hostbase"
#: Changes whenever the host base's recipe changes, so old bases are not reused.
RECIPE_VERSION = "2"
#: Driver libraries are never copied: they must match the running kernel module, and GPU workers
#: get the host's own bound in (see docker_gpu.py).
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[\w-]+|nvcuvid|nvoptix)\.so")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"

Log = Callable[[str], None]


def host_library_folders(exclude: str) -> list[str]:
    """The host folders the installation's Python imports from (standard library, site-packages,
    headers) and a CUDA toolkit. Decided by the installation, not by this process's sys.path (a
    test runner or a script adds its own folders there); never ``exclude`` (a kernforge checkout,
    which may hold the archive) or a folder holding it."""
    paths = sysconfig.get_paths()
    candidates = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "include", "platinclude")]
    candidates += site.getsitepackages()
    # Folders .pth files add (lib-dynload, vendored trees, a venv's link to another installation's
    # site-packages) count too: the path a fresh interpreter starts with, never this process's
    # (a test runner or a script adds its own folders) nor $PYTHONPATH's (-E).
    scripts = {os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(sys.executable))}
    candidates += [p for p in installation_path() if os.path.realpath(p) not in scripts]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parents[1]))
    repo = os.path.realpath(exclude)
    venv = virtual_env()
    if venv is not None:
        # The whole venv, not only its site-packages: its bin/python3 (the link workers are
        # started through) and pyvenv.cfg, which make the interpreter that venv's. In the image
        # they could be hidden (a venv under /tmp is under the container's private /tmp).
        candidates.append(venv if not under(repo, venv) else os.path.join(venv, "bin"))
    keep = []
    for c in candidates:
        if not c or not os.path.isabs(c) or not os.path.isdir(c):
            continue
        real = os.path.realpath(c)
        # A folder holding the checkout would show the worker its archive; one inside it is fine
        # only in the venv (a checkout's .venv)
        inside_venv = venv is not None and under(real, venv) and not under(repo, venv)
        if under(repo, real) or (under(real, repo) and not inside_venv) or real in ("/", "/usr", "/usr/local"):
            continue
        keep.append(real)
    return list(outermost(keep))


def installation_path() -> list[str]:
    """``sys.path`` of a fresh interpreter of this installation (its own folders and the ones its
    .pth files add), without the current folder or $PYTHONPATH."""
    try:
        done = subprocess.run([sys.executable, "-E", "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, timeout=60, cwd="/")
        found = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise SandboxError(f"--from-host: cannot ask {sys.executable} for its library folders: {e}") from None
    return [p for p in found if isinstance(p, str) and p and os.path.isabs(p)]


def virtual_env() -> str | None:
    """The real path of the virtual environment this interpreter runs in, or None."""
    if sys.prefix == sys.base_prefix:
        return None
    return os.path.realpath(sys.prefix)


def elf_closure(roots: Iterable[str]) -> set[str]:
    """Every shared library (and the dynamic loader) the ELF files ``roots`` load, per ``ldd``."""
    ldd = shutil.which("ldd")
    if not ldd:
        raise SandboxError("--from-host needs ldd (glibc) to find the libraries Python links against")
    roots = sorted(set(roots))
    found: set[str] = set()
    for start in range(0, len(roots), 200):
        done = subprocess.run([ldd, *roots[start : start + 200]], capture_output=True, text=True, timeout=300)
        for line in done.stdout.splitlines():
            line = line.strip()
            if "=>" in line:
                target = line.split("=>", 1)[1].split("(")[0].strip()
            else:
                target = line.split("(")[0].strip()
            if target.startswith("/") and os.path.exists(target):
                found.add(target)
    return found


def _shared_objects(folders: Iterable[str]) -> list[str]:
    objects = []
    for top in folders:
        for folder, _dirs, files in os.walk(top):
            objects += [os.path.join(folder, f) for f in files if ".so" in f and not f.endswith((".py", ".pyc"))
                        and os.path.isfile(os.path.join(folder, f)) and not os.path.islink(os.path.join(folder, f))]
    return objects


def toolchain() -> tuple[set[str], set[str]]:
    """(files, folders) of the host's C/C++ compiler as the compiler itself reports them: what
    Triton needs to build its launcher on a GPU, and load_inline to build C++."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SandboxError("--toolchain: no C compiler (cc or gcc) on this machine")

    def ask(flag: str) -> str:
        return subprocess.run([cc, flag], capture_output=True, text=True, timeout=30).stdout.strip()

    files, folders = {cc}, {"/usr/include"}
    for name in ("c++", "g++", "gcc", "as", "ld"):
        if shutil.which(name):
            files.add(shutil.which(name))
    for prog in ("cc1", "cc1plus", "collect2", "lto-wrapper", "as", "ld"):
        path = ask(f"-print-prog-name={prog}")
        path = path if os.path.isabs(path) else (shutil.which(path) or "")
        if path and os.path.exists(path):
            files.add(path)
    libgcc = ask("-print-libgcc-file-name")
    if os.path.isabs(libgcc):
        folders.add(os.path.dirname(libgcc))  # crtbegin.o, libgcc, gcc's own headers (stddef.h)
    for name in ("crt1.o", "Scrt1.o", "crti.o", "crtn.o", "libc.so", "libc_nonshared.a", "libm.so", "libmvec.so",
                 "libstdc++.so", "libdl.so", "libpthread.so", "librt.so"):
        path = ask(f"-print-file-name={name}")
        if os.path.isabs(path) and os.path.exists(path):
            files.add(path)
    return files, {f for f in folders if os.path.isdir(f)}


class RootFs:
    """The paths of a root file system taken from this machine, symbolic links kept as links
    (every link on the way to a path is added with what it points at)."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}  # path -> "dir" | "file" | "link"

    def add(self, path: str, _depth: int = 0) -> None:
        if _depth > 40:
            raise SandboxError(f"too many symbolic links resolving {path}")
        parts = Path(os.path.normpath(path)).parts[1:]
        current = "/"
        for i, part in enumerate(parts):
            current = os.path.join(current, part)
            if os.path.islink(current):
                self.entries[current] = "link"
                target = os.path.join(os.path.dirname(current), os.readlink(current))
                rest = parts[i + 1 :]
                self.add(os.path.normpath(os.path.join(target, *rest)), _depth + 1)
                return
            if not os.path.exists(current):
                return
            if i < len(parts) - 1:
                self.entries.setdefault(current, "dir")
        if os.path.isdir(current):
            self.entries.setdefault(current, "dir")
        elif os.path.isfile(current):
            self.entries[current] = "file"

    def add_tree(self, top: str) -> None:
        self.add(top)
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                self.add(os.path.join(folder, name))

    def digest(self, extra: bytes) -> str:
        digest = hashlib.sha256(RECIPE_VERSION.encode() + extra)
        for path in sorted(self.entries):
            info = os.lstat(path)
            link = os.readlink(path) if self.entries[path] == "link" else ""
            # A folder's size and mtime change whenever anything in it does (a venv under /tmp):
            # only files and links say whether the image would differ.
            size, mtime = (0, 0) if self.entries[path] == "dir" else (info.st_size, info.st_mtime_ns)
            digest.update(f"{path}\0{self.entries[path]}\0{size}\0{mtime}\0{info.st_mode}\0{link}\n".encode())
        return digest.hexdigest()[:16]

    def write_tar(self, out: str, generated: dict[str, tuple[bytes, int]]) -> None:
        # A generated file replaces the host's file at the same path (a tar with both is refused
        # by the engine: "duplicates of file paths not supported").
        replaced = {os.path.normpath(p) for p in generated}
        with tarfile.open(out, "w") as tar:
            for path in sorted(self.entries):
                if os.path.normpath(path) in replaced:
                    continue
                info = tar.gettarinfo(path, arcname=path.lstrip("/"))
                # Workers run as an unprivileged uid: every folder on the way must be open to it
                # (the host's /root is not), every file readable.
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isdir():
                    info.mode |= 0o755
                elif info.isfile():
                    info.mode |= 0o444 | (0o111 if info.mode & 0o100 else 0)
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
            for path, (data, mode) in sorted(generated.items()):
                info = tarfile.TarInfo(path.lstrip("/"))
                if data is None:
                    info.type, info.mode = tarfile.DIRTYPE, mode
                    tar.addfile(info)
                else:
                    info.size, info.mode = len(data), mode
                    tar.addfile(info, io.BytesIO(data))


def host_python() -> str:
    """The interpreter workers run, named the same whichever way this one was started (a shim, a
    console script): in a virtual environment its own bin/python3 (the venv is found from that
    path), otherwise the real file."""
    if sys.prefix != sys.base_prefix:
        for name in ("python3", "python"):
            candidate = os.path.join(sys.prefix, "bin", name)
            if os.path.exists(candidate):
                return candidate
    return os.path.realpath(sys.executable)


def host_base(engine, *, with_toolchain: bool, exclude: str, log: Log) -> tuple[str, str, list[str]]:
    """Import (or reuse) the base image made from this machine: (tag, python, host folders)."""
    folders = host_library_folders(exclude)
    python = host_python()
    roots = {os.path.realpath(python), "/bin/sh"}
    roots.update(p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p))
    fs = RootFs()
    for path in (python, "/bin/sh", "/sbin/ldconfig", "/usr/sbin/ldconfig", "/etc/ld.so.cache",
                 os.path.join(sys.prefix, "pyvenv.cfg")):
        if os.path.lexists(path):
            fs.add(path)
    if with_toolchain:
        files, trees = toolchain()
        for tree in sorted(trees):
            fs.add_tree(tree)
        roots.update(os.path.realpath(f) for f in files)
        for f in files:
            fs.add(f)
        roots.update(os.path.realpath(p) for p in fs.entries if fs.entries[p] == "file" and _is_elf(p))
    log(f"finding the libraries of {python} and {len(folders)} library folders ...")
    roots.update(_shared_objects(folders))
    for lib in sorted(elf_closure(roots)):
        if not any(under(lib, f) for f in folders) and not DRIVER_LIBRARY.search(os.path.basename(lib)):
            fs.add(lib)
    env = [f"PATH={os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    if os.environ.get("LD_LIBRARY_PATH"):
        env.append(f"LD_LIBRARY_PATH={os.environ['LD_LIBRARY_PATH']}")
    if shutil.which("nvcc"):
        cuda = str(Path(os.path.realpath(shutil.which("nvcc"))).parents[1])
        env += [f"CUDA_HOME={cuda}", f"PATH={cuda}/bin:{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin"]
    generated = {"/etc/passwd": (PASSWD.encode(), 0o644), "/etc/group": (GROUP.encode(), 0o644),
                 "/tmp": (None, 0o1777), "/var/tmp": (None, 0o1777)}
    key = fs.digest(json.dumps([folders, env, python, sorted(generated)]).encode())
    tag = f"{HOSTBASE_REPO}:{key}"
    from .docker_image import find_image  # docker_image imports this module

    if find_image(engine, tag) is not None:
        log(f"host base {tag} is up to date ({len(fs.entries)} paths)")
        return tag, python, folders
    size = sum(os.lstat(p).st_size for p, kind in fs.entries.items() if kind == "file")
    log(f"importing host base {tag}: {len(fs.entries)} paths, {size / 2**20:.0f} MiB; "
        f"binding {', '.join(folders)} at run time")
    with tempfile.TemporaryDirectory(prefix="kf-hostbase-") as scratch:
        archive = os.path.join(scratch, "rootfs.tar")
        fs.write_tar(archive, generated)
        changes = [f"ENV {e}" for e in _merge_env(env)]
        engine.api.import_image(src=archive, repository=HOSTBASE_REPO, tag=key, changes=changes)
    _remove_other_tags(engine, HOSTBASE_REPO, keep=tag)
    return tag, python, folders


def _merge_env(env: list[str]) -> list[str]:
    merged: dict[str, str] = {}
    for item in env:
        name, _, value = item.partition("=")
        merged[name] = value
    return [f"{k}={v}" for k, v in merged.items()]


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _remove_other_tags(engine, repository: str, keep: str) -> None:
    from docker.errors import APIError

    for image in engine.images.list(name=repository):
        for tag in image.tags:
            if tag != keep:
                try:
                    engine.images.remove(tag)
                except APIError:
                    pass  # still used by a container or another image: left for later
