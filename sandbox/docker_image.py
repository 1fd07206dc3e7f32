"""The worker image: ``kernforge sandbox build-image`` (the recipe is docker/Dockerfile).

Two bases:

* **a CUDA PyTorch image** from a registry (``--base``, ``DEFAULT_BASE``): self-contained, for
  users whose machines can pull images.
* **this machine** (``--from-host``, docker_hostbase.py), for machines that reach no registry
  (CI, air-gapped GPU servers): the interpreter and the system libraries it needs, while Python's
  library folders (with torch and Triton) are bound read-only into each container at the same
  path rather than copied. Copied, they would make the image gigabytes, and with Docker's ``vfs``
  storage driver (the one that works inside other containers, as in CI) every container start
  copies the whole image: with the CI machine's 2.7 GB Python installation inside, ``docker
  create`` took 1 min 45 s and ``docker rm`` 4 min 55 s; bound, a container starts in a fraction
  of a second, and workers run exactly the torch the trusted reference runs.

Either way the Dockerfile then copies the kernforge packages a worker imports (sandbox, verifier,
tasks) into ``/opt/kernforge``. Images are labelled with a digest of those sources, and a build
whose inputs have not changed is skipped. A backend given an image built from other sources (an
upgraded or edited kernforge) binds its own worker packages over the image's copy, read-only, so
parent and worker never speak different protocols.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .docker_hostbase import Log, host_base
from .docker_probe import WORKER_IMAGE, default_tag  # noqa: F401  (default_tag: for the CLI)
from .protocol import SandboxError

DEFAULT_BASE = "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-devel"
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
    #: the image's own environment (its ENV lines), read with the same id
    env: dict[str, str]

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


@contextlib.contextmanager
def engine_errors(doing: str) -> Iterator[None]:
    """The Docker SDK's errors (a refusal, an engine that stopped answering) as a SandboxError
    that says what was being done: a message for the CLI, never a traceback."""
    from docker.errors import APIError, DockerException
    from requests.exceptions import RequestException

    try:
        yield
    except APIError as e:
        raise SandboxError(f"{doing}: the Docker engine refused ({e.status_code}): {e.explanation or e}") from None
    except DockerException as e:
        raise SandboxError(f"{doing}: {e}") from None
    except RequestException as e:
        raise SandboxError(f"{doing}: the Docker engine did not answer ({type(e).__name__}: {e})") from None


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


def find_image(engine, tag: str):
    """The engine's image named ``tag``, or None."""
    from docker.errors import ImageNotFound

    try:
        return engine.images.get(tag)
    except ImageNotFound:
        return None


def image_info(engine, tag: str = WORKER_IMAGE) -> ImageInfo | None:
    image = find_image(engine, tag)
    if image is None:
        return None
    labels = image.labels or {}
    env = (image.attrs.get("Config") or {}).get("Env") or []
    return ImageInfo(tag=tag, id=image.id, python=labels.get(LABEL_PYTHON, "python3"),
                     host_paths=tuple(json.loads(labels.get(LABEL_HOST_PATHS, "[]"))),
                     source=labels.get(LABEL_SOURCE, ""), env=dict(item.partition("=")[::2] for item in env))


# ---- the worker image ------------------------------------------------------------------------
def build_image(engine=None, *, base: str | None = None, tag: str = WORKER_IMAGE, from_host: bool = False,
                with_toolchain: bool | None = None, force: bool = False, log: Log = print) -> ImageInfo:
    """Build the worker image (skipped when one built from the same inputs exists)."""
    if from_host and base:
        raise SandboxError("--from-host makes its own base: give --base or --from-host, not both")
    engine = engine or client(timeout=600)
    with engine_errors(f"building the worker image {tag}"):
        return _build_image(engine, base=base, tag=tag, from_host=from_host, with_toolchain=with_toolchain,
                            force=force, log=log)


def _build_image(engine, *, base: str | None, tag: str, from_host: bool, with_toolchain: bool | None, force: bool,
                 log: Log) -> ImageInfo:
    host_folders: list[str] = []
    python = "python3"
    if from_host:
        if with_toolchain is None:
            with_toolchain = os.path.exists("/dev/nvidiactl")  # Triton needs cc on a GPU only
        base, python, host_folders = host_base(engine, with_toolchain=with_toolchain, exclude=str(package_root()), log=log)
    base = base or DEFAULT_BASE
    dockerfile = Path(__file__).with_name("docker") / "Dockerfile"
    source = source_digest()
    base_image = find_image(engine, base)
    labels = {LABEL_SOURCE: source, LABEL_HOST_PATHS: json.dumps(host_folders)}
    key = hashlib.sha256(json.dumps([source, base, base_image and base_image.id, python, host_folders,
                                     dockerfile.read_text()]).encode()).hexdigest()[:24]
    labels[LABEL_BUILD] = key
    current = find_image(engine, tag)
    if current is not None and (current.labels or {}).get(LABEL_BUILD) == key and not force:
        log(f"{tag} is up to date (built from the same sources and base)")
        return image_info(engine, tag)
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
    info = image_info(engine, tag)
    if current is not None and current.id != info.id:
        _remove_quietly(engine, current.id)
    log(f"built {info.describe()}")
    return info


def _remove_quietly(engine, image_id: str) -> None:
    from docker.errors import APIError

    try:
        engine.images.remove(image_id)
    except APIError:
        pass
