"""One GPU for a worker container, with or without the NVIDIA container runtime.

* With the NVIDIA container toolkit (its runtime hook installed where the engine runs): a
  DeviceRequest for exactly that GPU; the toolkit adds the device nodes and the driver's
  libraries itself.
* Without it (a plain Debian docker.io, as on an air-gapped GPU server): the GPU's own device node
  plus the control nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``...) are passed as devices, and
  the driver's user-space libraries (``libcuda``, ``libnvidia-*``, found with ``ldconfig -p``
  and in the folders of LD_LIBRARY_PATH)
  are bound read-only into one folder that is put on the loader path. Never copied into an
  image: they must match the kernel module of the machine the container runs on.

Inside the container the GPU is always CUDA device 0.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from .env import physical_device
from .protocol import SandboxError
from .uids import device_groups

#: Where the driver libraries appear inside a container started without the NVIDIA runtime.
DRIVER_DIR = "/opt/kernforge/nvidia"
#: Where drivers installed outside the loader cache usually live (containers, GPU clouds).
DRIVER_FOLDERS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
#: User-space driver libraries CUDA, NVRTC/PTX JIT and NVML load (by soname).
DRIVER_LIBRARY = re.compile(r"^lib(cuda|cudadebugger|nvidia-(ptxjitcompiler|nvvm|ml|gpucomp|cfg|allocator|opencl))\.so")
#: What a GPU worker's environment says inside its container: the one GPU is device 0.
INSIDE = {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


@dataclass(frozen=True)
class GpuPlan:
    """Container options that give it one GPU."""

    detail: str
    device_requests: tuple[dict, ...] = ()
    devices: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    group_add: tuple[str, ...] = ()


def has_nvidia_runtime(engine_info: dict) -> bool:
    """The engine can honour a DeviceRequest for NVIDIA GPUs (toolkit hook or runtime present)."""
    runtimes = engine_info.get("Runtimes") or {}
    return "nvidia" in runtimes or bool(shutil.which("nvidia-container-runtime-hook"))


def driver_libraries(ldconfig_output: str) -> dict[str, str]:
    """soname -> host file of every native (64-bit) NVIDIA driver library ``ldconfig -p`` lists."""
    found: dict[str, str] = {}
    for line in ldconfig_output.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if not match:
            continue
        name, flags, path = match.groups()
        # "(libc6,x86-64)", "(libc6,AArch64)": 64-bit; a bare "(libc6)" is a 32-bit copy.
        if DRIVER_LIBRARY.match(name) and "," in flags:
            found.setdefault(name, path)
    return found


def scan_driver_folders(folders: list[str]) -> dict[str, str]:
    """soname -> file of driver libraries found by name in ``folders`` (a driver installed outside
    the loader cache, e.g. under /usr/local/nvidia and reached through LD_LIBRARY_PATH)."""
    found: dict[str, str] = {}
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if DRIVER_LIBRARY.match(name) and re.search(r"\.so(\.\d+)?$", name):
                found.setdefault(name, os.path.join(folder, name))
    return found


def gpu_minor(physical: str, smi_output: str | None) -> int:
    """The /dev/nvidiaN number of a GPU named as CUDA_VISIBLE_DEVICES names it (an index or a
    UUID). ``smi_output``: ``nvidia-smi --query-gpu=index,uuid,minor_number --format=csv,noheader``."""
    rows = []
    for line in (smi_output or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
            rows.append(parts)
    for index, uuid, minor in rows:
        if physical in (index, uuid):
            return int(minor)
    if physical.isdigit():
        return int(physical)  # no nvidia-smi: nvidia-smi order and minor numbers agree on most machines
    raise SandboxError(f"cannot find the device node of GPU {physical!r} (nvidia-smi did not list it)")


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def runtime_plan(physical: str) -> GpuPlan:
    """GPU ``physical`` through the NVIDIA container runtime (a DeviceRequest)."""
    request = {"Driver": "nvidia", "Count": 0, "DeviceIDs": [physical], "Capabilities": [["gpu"]], "Options": {}}
    return GpuPlan(detail=f"GPU {physical} through the NVIDIA container runtime", device_requests=(request,),
                   env=dict(INSIDE))


def explicit_plan(physical: str, node: str, nodes: list[str], libraries: dict[str, str], image_env: dict[str, str],
                  groups: tuple[int, ...]) -> GpuPlan:
    """GPU ``physical`` without the runtime: its device node ``node`` and the control ``nodes``
    as devices, the driver ``libraries`` (soname -> host file) bound into DRIVER_DIR."""
    if not any(name.startswith("libcuda.so") for name in libraries):
        raise SandboxError("no NVIDIA driver library (libcuda.so) in `ldconfig -p`: is the driver installed?")
    libraries = dict(libraries)
    if "libcuda.so" not in libraries:
        # Triton links its launcher with -lcuda, which needs the unversioned name.
        libraries["libcuda.so"] = next(path for name, path in sorted(libraries.items()) if name.startswith("libcuda.so"))
    binds = tuple(f"{path}:{DRIVER_DIR}/{name}:ro" for name, path in sorted(libraries.items()))
    loader_path = ":".join(p for p in (DRIVER_DIR, image_env.get("LD_LIBRARY_PATH", "")) if p)
    env = dict(INSIDE, LD_LIBRARY_PATH=loader_path, TRITON_LIBCUDA_PATH=DRIVER_DIR)
    return GpuPlan(detail=f"GPU {physical} as {node} with {len(libraries)} driver libraries bound (no NVIDIA runtime)",
                   devices=tuple(f"{n}:{n}:rwm" for n in [node] + [n for n in nodes if n != node]), binds=binds,
                   env=env, group_add=tuple(str(g) for g in groups))


def plan(index: str, engine_info: dict, image_env: dict[str, str]) -> GpuPlan:
    """How a container gets GPU ``index`` (the parent's numbering), on this machine."""
    physical = physical_device(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if has_nvidia_runtime(engine_info):
        return runtime_plan(physical)
    smi = _run(["nvidia-smi", "--query-gpu=index,uuid,minor_number", "--format=csv,noheader"]) if shutil.which("nvidia-smi") else None
    node = f"/dev/nvidia{gpu_minor(physical, smi)}"
    if not os.path.exists(node):
        raise SandboxError(f"GPU {physical}: {node} does not exist on this machine")
    nodes = [n for n in CONTROL_NODES if os.path.exists(n)] + sorted(glob.glob("/dev/nvidia-caps/*"))
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    folders = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p] + list(DRIVER_FOLDERS)
    found = {**scan_driver_folders(folders), **driver_libraries(_run([ldconfig, "-p"]) or "")}
    libraries = {name: os.path.realpath(path) for name, path in found.items()}
    return explicit_plan(physical, node, nodes, libraries, image_env, device_groups())
