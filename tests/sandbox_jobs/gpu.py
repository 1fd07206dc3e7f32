"""GPU jobs for tests/test_sandbox_pool.py and bench/sandbox.py: warm-up and one tiny Triton kernel."""

from __future__ import annotations

import os
import time


def warm():
    """Trusted warm-up: create the CUDA context, and compile and launch one throwaway Triton
    kernel so Triton's one-time set-up in a fresh cache (building its driver stub with the host
    compiler) is paid here rather than on the first job's clock."""
    import torch
    import triton
    import triton.language as tl

    if not torch.cuda.is_available():
        return
    torch.empty(1, device="cuda")

    @triton.jit
    def _zero_kernel(y_ptr):
        tl.store(y_ptr + tl.arange(0, 16), tl.zeros((16,), dtype=tl.float32))

    y = torch.ones(16, device="cuda")
    _zero_kernel[(1,)](y)
    torch.cuda.synchronize()


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
