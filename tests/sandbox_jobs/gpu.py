"""GPU jobs for tests/test_sandbox_pool.py and bench/sandbox.py: warm-up and one tiny Triton kernel."""

from __future__ import annotations

import os
import time


def warm():
    """Trusted warm-up: create the CUDA context before any job arrives."""
    import torch

    if torch.cuda.is_available():
        torch.empty(1, device="cuda")


def add_one(channel, payload):
    """Launch one small Triton kernel and check its result; reports the job's start time first."""
    started = time.monotonic()
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = int(payload.get("n", 1024))
    x = torch.arange(n, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    _add_one_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
    ok = bool(torch.equal(y.cpu(), (x + 1).cpu()))
    channel.send({"ok": ok, "started": started, "uid": os.getuid(), "device": device,
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "device_count": torch.cuda.device_count() if device == "cuda" else 0})
