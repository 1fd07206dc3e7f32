"""The environment a worker gets: an allow-list of the parent's variables, never a secret.

A variable reaches a worker only if its name is allow-listed (exactly or by prefix) and contains
none of the secret markers, whatever the allow-list says: ``CUDA_API_KEY`` stays behind even
though ``CUDA_`` is allowed. The worker's private directory becomes its home, temp dir and the
home of every compiler cache, so nothing it writes lands in the parent's caches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .protocol import SandboxError, WorkerSpec

ALLOWED_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM",
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONWARNINGS",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS",
    "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDNN_HOME", "ROCM_PATH", "HIP_PATH",
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NVCC_", "CUBLAS_", "CUDNN_", "NCCL_", "TRITON_",
                    "TORCH_", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "KERNFORGE_")
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")

#: Set by the sandbox itself from the spec and the private directory; never taken from the parent.
SANDBOX_OWNED = frozenset({"HOME", "TMPDIR", "TEMP", "TMP", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET",
                           "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR",
                           "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "PYTHONDONTWRITEBYTECODE",
                           "PYTHONNOUSERSITE", "PYTHONUNBUFFERED"})


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def is_allowed(name: str) -> bool:
    if is_secret(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def check_spec_env(env: Mapping[str, str]) -> None:
    """Refuse a spec whose extra variables would leak a secret or bypass the allow-list."""
    for name, value in env.items():
        if not isinstance(value, str):
            raise SandboxError(f"WorkerSpec.env[{name!r}] must be a string")
        if is_secret(name):
            raise SandboxError(f"WorkerSpec.env must not carry secrets: {name!r} looks like one")
        if name in SANDBOX_OWNED:
            raise SandboxError(f"WorkerSpec.env must not set {name!r}: the sandbox sets it from the spec")
        if not is_allowed(name):
            raise SandboxError(f"WorkerSpec.env variable {name!r} is not on the sandbox allow-list")


def physical_device(index: str, parent_visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES entry for GPU ``index`` as the parent numbers it: when the parent
    itself sees only some GPUs ("2,3", UUIDs, MIG ids), its GPU 1 is the second of those."""
    if not parent_visible:
        return index
    visible = [d.strip() for d in parent_visible.split(",") if d.strip()]
    if int(index) >= len(visible):
        raise SandboxError(f"GPU {index} does not exist here: CUDA_VISIBLE_DEVICES={parent_visible!r}")
    return visible[int(index)]


def trusted_cache_env(folder: str) -> dict[str, str]:
    """The compiler caches' variables for a trusted process whose caches live in ``folder``; its
    Python bytecode too. An environment installed without bytecode (uv's default, and the H200's
    torch) compiled some 1,500 of torch's modules from source in every reference worker, 9-11 s
    of its start; workers write no bytecode next to the sources (``worker_env``), so a trusted
    one keeps it here, where no candidate writes."""
    return {"TRITON_CACHE_DIR": f"{folder}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor",
            "PYTHONPYCACHEPREFIX": f"{folder}/pycache"}


def worker_env(spec: WorkerSpec, workdir: Path, parent_env: Mapping[str, str]) -> dict[str, str]:
    """The complete environment of a worker whose private directory is ``workdir``."""
    check_spec_env(spec.env)
    env = {k: v for k, v in parent_env.items() if is_allowed(k) and k not in SANDBOX_OWNED}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    home = str(workdir)
    env.update({
        "HOME": home, "TMPDIR": home, "TEMP": home, "TMP": home,
        "XDG_CACHE_HOME": f"{home}/.cache",
        "TRITON_CACHE_DIR": f"{home}/.triton",
        "TORCH_EXTENSIONS_DIR": f"{home}/.torch_extensions",
        "TORCHINDUCTOR_CACHE_DIR": f"{home}/.inductor",
        "CUDA_CACHE_PATH": f"{home}/.nv",
        # Bytecode would be written next to read-only sources; the user site is not ours to load.
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        # What a candidate printed just before it crashed or was killed is the useful part.
        "PYTHONUNBUFFERED": "1",
    })
    if spec.trusted_cache is not None:  # a trusted worker's compiles outlive it (WorkerSpec.trusted_cache)
        env.update(trusted_cache_env(spec.trusted_cache))
        del env["PYTHONDONTWRITEBYTECODE"]  # into the trusted cache's own folder
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TRITON_INTERPRET"] = "1"
    else:
        env["CUDA_VISIBLE_DEVICES"] = physical_device(spec.device, parent_env.get("CUDA_VISIBLE_DEVICES"))
        env.pop("TRITON_INTERPRET", None)
    env.update(spec.env)
    if spec.isolation != "none":
        # an MPS control daemon (bench/h200.sh mpson) shares one GPU context among trusted
        # processes: a candidate there could end them all with one fault, and a client of another
        # user waits until their server ends. Its pipe is nowhere it can reach.
        for name in [n for n in env if n.startswith("CUDA_MPS_")]:
            del env[name]
        env["CUDA_MPS_PIPE_DIRECTORY"] = f"{home}/.no-mps"
    return env
