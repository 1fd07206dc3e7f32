"""The worker image: ``kernforge sandbox build-image`` (the recipe is docker/Dockerfile).

Two bases:

* **a CUDA PyTorch image** from a registry (``--base``, ``DEFAULT_BASE``): self-contained, for
  users whose machines can pull images.
* **this machine** (``--from-host``), for machines that reach no registry (CI, air-gapped GPU
  servers). The base holds the interpreter and the system libraries the host's Python and its
  extension modules link against (found with ``ldd``), the dynamic loader, ``/bin/sh``,
  ``ldconfig`` and, with ``--toolchain``, the C compiler Triton needs on a GPU. Python's library
  folders (the standard library and site-packages, with torch and Triton) are *not* copied: the
  image names them in a label and every worker container binds them read-only at the same path.
  Copying them would make the image gigabytes, and with Docker's ``vfs`` storage driver (the one
  that works inside other containers, as in CI) every container start copies the whole image:
  with the 2.7 GB Python installation of the CI machine inside, ``docker create`` took 1 min 45 s
  and ``docker rm`` 4 min 55 s; the bound variant starts a container in well under a second, and
  the workers run exactly the torch the trusted reference runs.

Either way the Dockerfile then copies the kernforge packages a worker imports (sandbox, verifier,
tasks) into ``/opt/kernforge``. Images are labelled with a digest of those sources, and a build
whose inputs have not changed is skipped. A backend given an image built from other sources (an
upgraded or edited kernforge) binds its own worker packages over the image's copy, read-only, so
parent and worker never speak different protocols.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .docker_probe import WORKER_IMAGE, default_tag  # noqa: F401  (default_tag: for the CLI)
from .protocol import SandboxError

DEFAULT_BASE = "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-devel"
HOSTBASE_REPO = "kernforge-hostbase"
LABEL_PYTHON = "org.kernforge.python"
LABEL_SOURCE = "org.kernforge.source"
LABEL_BUILD = "org.kernforge.build"
LABEL_HOST_PATHS = "org.kernforge.host-paths"
#: The sub-packages a worker imports (the generic worker, the verifier's harness, the task
#: runtime). Only these go into the image and into its source digest, so editing the loop or
#: the archive does not make the image stale.
WORKER_PACKAGES = ("sandbox", "verifier", "tasks")
#: Where docker/Dockerfile copies the package (on the image's PYTHONPATH as /opt/kernforge).
IMAGE_PACKAGE = "/opt/kernforge/kernforge"
#: Not needed by workers: the judge sends each task as a bundle, so built-in tasks stay out.
NOT_IN_IMAGE = frozenset({"tasks/builtin"})
#: Changes whenever the host base's recipe changes, so old bases are not reused.
RECIPE_VERSION = "2"
#: Driver libraries are never copied: they must match the running kernel module, and GPU workers
#: get the host's own bound in (see docker_gpu.py).
DRIVER_LIBRARY = re.compile(r"lib(cuda|nvidia-[\w-]+|nvcuvid|nvoptix)\.so")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"

Log = Callable[[str], None]


@dataclass(frozen=True)
class ImageInfo:
    """What a worker image says about itself (its labels)."""

    tag: str
    id: str
    #: the interpreter inside ("python3" on the PATH, or an absolute path)
    python: str
    #: host folders every container binds read-only at the same path (``--from-host`` images)
    host_paths: tuple[str, ...]
    #: digest of the kernforge sources inside
    source: str

    @property
    def stale(self) -> bool:
        return self.source != source_digest()

    def describe(self) -> str:
        kind = f"from this host, binds {len(self.host_paths)} host folders" if self.host_paths else "self-contained"
        state = ("built from other kernforge sources: this kernforge's worker packages are bound over its copy "
                 "(rebuild to make it self-contained)" if self.stale else "current")
        return f"{self.tag} ({self.id[7:19]}, {kind}, {state})"


def client(timeout: int = 120):
    """A Docker SDK client for the engine the environment names; SandboxError if none answers."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError as e:
        raise SandboxError(f"the docker SDK is not importable ({e}): pip install docker") from None
    try:
        engine = docker.from_env(timeout=timeout)
        engine.ping()
    except (DockerException, OSError) as e:
        raise SandboxError(f"no Docker engine reachable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return engine


# ---- kernforge sources -----------------------------------------------------------------------
def package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def package_files() -> list[str]:
    """Paths (relative to the package root) of the files a worker needs, sorted."""
    root = package_root()
    found = ["__init__.py"]
    for package in WORKER_PACKAGES:
        for folder, dirs, files in os.walk(root / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith(".")
                             and os.path.relpath(os.path.join(folder, d), root) not in NOT_IN_IMAGE)
            for name in files:
                if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                    found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def source_digest() -> str:
    root, digest = package_root(), hashlib.sha256()
    for rel in package_files():
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class Overlay:
    binds: list[str]
    hidden_dirs: list[str]


def worker_package_binds() -> Overlay:
    """Read-only binds of this kernforge's worker packages over an image's copy (IMAGE_PACKAGE),
    for an image built from other sources; built-in tasks (hidden shapes) stay covered."""
    root = package_root()
    binds = [f"{root / '__init__.py'}:{IMAGE_PACKAGE}/__init__.py:ro"]
    binds += [f"{root / package}:{IMAGE_PACKAGE}/{package}:ro" for package in WORKER_PACKAGES]
    return Overlay(binds=binds, hidden_dirs=[f"{IMAGE_PACKAGE}/{folder}" for folder in sorted(NOT_IN_IMAGE)])


def image_info(engine, tag: str = WORKER_IMAGE) -> ImageInfo | None:
    from docker.errors import ImageNotFound

    try:
        image = engine.images.get(tag)
    except ImageNotFound:
        return None
    labels = image.labels or {}
    return ImageInfo(tag=tag, id=image.id, python=labels.get(LABEL_PYTHON, "python3"),
                     host_paths=tuple(json.loads(labels.get(LABEL_HOST_PATHS, "[]"))),
                     source=labels.get(LABEL_SOURCE, ""))


# ---- the host base ---------------------------------------------------------------------------
def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for p in sorted(set(paths), key=lambda p: p.rstrip("/").count("/")):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return sorted(kept)


def host_library_folders() -> list[str]:
    """The host folders the installation's Python imports from (standard library, site-packages,
    headers) and a CUDA toolkit. Decided by the installation, not by this process's sys.path (a
    test runner or a script adds its own folders there); never a kernforge source checkout."""
    paths = sysconfig.get_paths()
    candidates = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "include", "platinclude")]
    candidates += site.getsitepackages()
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    # Folders .pth files add inside the installation (e.g. lib-dynload, vendored trees) count too;
    # sys.path[0] is the running script's folder (a console script's bin/), never a library.
    scripts = {os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(sys.executable))}
    candidates += [p for p in sys.path[1:] if p and os.path.isabs(p) and os.path.realpath(p) not in scripts
                   and _under_any(os.path.realpath(p), prefixes - {"/", "/usr"})]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parents[1]))
    repo = str(package_root())
    keep = []
    for c in candidates:
        if not c or not os.path.isabs(c) or not os.path.isdir(c):
            continue
        real = os.path.realpath(c)
        if _under_any(repo, [real]) or _under_any(real, [repo]) or real in ("/", "/usr", "/usr/local"):
            continue
        keep.append(real)
    return _outermost(keep)


def _under_any(path: str, folders: Iterable[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


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
            digest.update(f"{path}\0{self.entries[path]}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_mode}\0{link}\n".encode())
        return digest.hexdigest()[:16]

    def write_tar(self, out: str, generated: dict[str, tuple[bytes, int]]) -> None:
        with tarfile.open(out, "w") as tar:
            for path in sorted(self.entries):
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


def host_base(engine, *, with_toolchain: bool, log: Log) -> tuple[str, str, list[str]]:
    """Import (or reuse) the base image made from this machine: (tag, python, host folders)."""
    folders = host_library_folders()
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
        if not _under_any(lib, folders) and not DRIVER_LIBRARY.search(os.path.basename(lib)):
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
    from docker.errors import ImageNotFound

    try:
        engine.images.get(tag)
        log(f"host base {tag} is up to date ({len(fs.entries)} paths)")
        return tag, python, folders
    except ImageNotFound:
        pass
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


# ---- the worker image ------------------------------------------------------------------------
def build_image(engine=None, *, base: str | None = None, tag: str = WORKER_IMAGE, from_host: bool = False,
                with_toolchain: bool | None = None, force: bool = False, log: Log = print) -> ImageInfo:
    """Build the worker image (skipped when one built from the same inputs exists)."""
    engine = engine or client(timeout=600)
    if from_host and base:
        raise SandboxError("--from-host makes its own base: give --base or --from-host, not both")
    host_folders: list[str] = []
    python = "python3"
    if from_host:
        if with_toolchain is None:
            with_toolchain = os.path.exists("/dev/nvidiactl")  # Triton needs cc on a GPU only
        base, python, host_folders = host_base(engine, with_toolchain=with_toolchain, log=log)
    base = base or DEFAULT_BASE
    dockerfile = Path(__file__).with_name("docker") / "Dockerfile"
    source = source_digest()
    base_id = _image_id(engine, base)
    labels = {LABEL_SOURCE: source, LABEL_HOST_PATHS: json.dumps(host_folders)}
    key = hashlib.sha256(json.dumps([source, base, base_id, python, host_folders,
                                     dockerfile.read_text()]).encode()).hexdigest()[:24]
    labels[LABEL_BUILD] = key
    current = _labels(engine, tag)
    if current is not None and current.get(LABEL_BUILD) == key and not force:
        log(f"{tag} is up to date (built from the same sources and base)")
        return image_info(engine, tag)
    old_id = _image_id(engine, tag)
    log(f"building {tag} on {base} ...")
    with tempfile.TemporaryDirectory(prefix="kf-image-") as context:
        shutil.copy(dockerfile, os.path.join(context, "Dockerfile"))
        root = package_root()
        for rel in package_files():
            target = Path(context, "kernforge", rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / rel, target)
        from docker.errors import BuildError

        try:
            engine.images.build(path=context, tag=tag, buildargs={"BASE": base, "PYTHON": python},
                                labels=labels, rm=True, forcerm=True, pull=False)
        except BuildError as e:
            lines = [str(chunk.get("stream") or chunk.get("error") or "").rstrip() for chunk in e.build_log]
            raise SandboxError(f"building {tag} failed: {e.msg}\n" + "\n".join(l for l in lines if l)[-3000:]) from None
    if old_id and old_id != _image_id(engine, tag):
        _remove_quietly(engine, old_id)
    info = image_info(engine, tag)
    log(f"built {info.describe()}")
    return info


def _labels(engine, tag: str) -> dict[str, str] | None:
    from docker.errors import ImageNotFound

    try:
        return engine.images.get(tag).labels or {}
    except ImageNotFound:
        return None


def _image_id(engine, tag: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return engine.images.get(tag).id
    except ImageNotFound:
        return None


def _remove_quietly(engine, image_id: str) -> None:
    from docker.errors import APIError

    try:
        engine.images.remove(image_id)
    except APIError:
        pass
