"""A job that reports what a worker sees of its container (tests/test_sandbox_docker.py)."""

from __future__ import annotations

import os
import socket


def probe(channel, payload):
    """Its identity, capabilities and namespaces, and which of ``paths`` exist for it."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    try:
        with open("/kf-root-write", "w") as f:
            f.write("escaped")
        root = "written"
    except OSError as e:
        root = e.strerror
    with open("/proc/1/cmdline", "rb") as f:
        init = [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    channel.send({
        "uid": os.getuid(), "gid": os.getgid(), "ppid": os.getppid(),
        "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip(), "root_write": root, "init": init[:4],
        "interfaces": sorted(os.listdir("/sys/class/net")), "hostname": socket.gethostname(),
        "seen": {p: os.path.exists(p) for p in payload.get("paths", [])},
        "read": {p: _read(p) for p in payload.get("read", [])},
        **(_cuda() if payload.get("cuda") else {}),
    })


def _cuda() -> dict:
    import torch

    count = torch.cuda.device_count()
    return {"cuda_devices": count, "cuda_name": torch.cuda.get_device_name(0) if count else None,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"error: {e.strerror}"
