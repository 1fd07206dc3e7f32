"""``kernforge doctor``: what this machine can do, one check per line.

Each check is cheap and never raises: a missing piece is reported, not a traceback.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _python() -> Check:
    return Check("python", True, f"{platform.python_version()} ({platform.machine()})")


def _torch() -> Check:
    try:
        import torch
    except ImportError as e:
        return Check("torch", False, f"not importable: {e}")
    return Check("torch", True, f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")


def _triton() -> Check:
    try:
        import triton
    except ImportError as e:
        return Check("triton", False, f"not importable: {e}")
    return Check("triton", True, triton.__version__)


def _gpus() -> Check:
    try:
        import torch
    except ImportError:
        return Check("gpus", False, "torch missing")
    if not torch.cuda.is_available():
        return Check("gpus", False, "no CUDA GPU: kernels run under the Triton interpreter (correctness only)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Check("gpus", True, ", ".join(f"{i}: {n}" for i, n in enumerate(names)))


def _nvcc() -> Check:
    exe = shutil.which("nvcc")
    if not exe:
        return Check("nvcc", False, "not on PATH: CUDA C++ candidates (load_inline) cannot build")
    try:
        text = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("nvcc", False, f"{exe} did not answer: {e}")
    release = [line for line in text.splitlines() if "release" in line]
    return Check("nvcc", True, release[-1].strip() if release else exe)


def _sandbox() -> Check:
    from kernforge.sandbox.isolation import describe_isolation

    ok, detail = describe_isolation()
    return Check("sandbox isolation", ok, detail)


def _docker() -> Check:
    from kernforge.sandbox.docker_probe import probe_docker

    ok, detail = probe_docker()
    return Check("docker engine", ok, detail)


def _api_key() -> Check:
    from kernforge.loop.config import api_key_source

    source = api_key_source()
    if source is None:
        return Check("api key", False, "none configured: `kernforge run` uses the offline tuner")
    return Check("api key", True, f"yes (from {source})")


def _bytecode() -> Check:
    from kernforge.sandbox.bytecode import describe

    ok, detail = describe()
    return Check("python bytecode", ok, detail)


def _judge() -> Check:
    from kernforge.verifier.revision import fingerprint

    return Check("judge", True, f"fingerprint {fingerprint()}: audits by another count for no best (verifier/revision.py)")


CHECKS: tuple[Callable[[], Check], ...] = (_python, _torch, _triton, _gpus, _nvcc, _sandbox, _bytecode, _docker, _api_key, _judge)


def run_checks() -> list[Check]:
    results = []
    for check in CHECKS:
        try:
            results.append(check())
        except (ImportError, OSError, RuntimeError) as e:
            name = check.__name__.lstrip("_").replace("_", " ")
            results.append(Check(name, False, f"check failed: {type(e).__name__}: {e}"))
    return results
