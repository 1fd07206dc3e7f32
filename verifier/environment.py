"""The hardware and software a measurement was taken on, recorded with every verdict."""

from __future__ import annotations

import platform
import shutil
import subprocess
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def software() -> dict[str, Any]:
    """Versions that change what a kernel does or how fast it runs."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # macOS or a torch build without triton
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
    }


@lru_cache(maxsize=None)
def gpu(index: int = 0) -> dict[str, Any] | None:
    """Name, SMs, memory, L2 and driver of one GPU, or None without CUDA."""
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "arch": f"sm_{props.major}{props.minor}",
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 1024**3, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver_version(),
    }


@lru_cache(maxsize=None)
def driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def describe(device: str) -> dict[str, Any]:
    """Everything for one device: 'cpu' (the Triton interpreter) or 'cuda:N'."""
    from .revision import fingerprint

    info = dict(software(), judge=fingerprint())  # which judge measured (revision.py)
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        info.update(gpu(index) or {})
        info["device"] = "cuda"
    else:
        info.update({"gpu": None, "device": "cpu", "arch": "interpreter", "cpu": platform.processor() or platform.machine()})
    return info
