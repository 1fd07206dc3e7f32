"""Trusted timing helpers: cache control, the trusted input write, checksums and in-process batches.

The time of record of every candidate comes from the trusted reference worker's own CUDA events
around a batch of calls (refworker.py); the PyTorch baselines are timed the same way, inside
that worker, by ``time_batch`` here, so the candidate and the baselines are measured alike: each
of M calls on inputs of its own, written by the trusted side inside the timed window (with the
write's least possible duration taken off again), parameters shared across calls as a serving
engine shares its weights.

The input write is a kernel on the streaming multiprocessors, not a copy-engine transfer: kernels
of two processes never run at the same time on one GPU (without MPS), so no candidate kernel can
overlap it, and the window minus the write's floor bounds the candidate's own device time from
above. ``L2Control`` resets persisting L2 lines and the limit (THREATS #18), and flushes the cache
by reading a buffer larger than it.

Torch entry points come from ``integrity``, bound before any candidate code loaded, because the
candidate's harness uses ``L2Control`` too.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


from . import integrity as I

CUDA_LIMIT_PERSISTING_L2 = 0x06


#: elements a checksum reduces at a time: a reduction into float64 casts its whole input first
#: (PyTorch promotes only fp16/bf16 to float32 on the fly), 12 GiB for a KernelBench output of
#: 1.6e9 float32 elements, which ran the reference worker out of memory on the H100 (19_ReLU)
CHECKSUM_ELEMENTS = 1 << 26


def checksum(outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Two float64 numbers per output, computed on the device without a host sync, a piece of
    at most ``CHECKSUM_ELEMENTS`` at a time."""
    sums = []
    for out in outputs:
        if out.is_floating_point() and out.element_size() >= 2:
            parts = _pieces(out)
            s = _total([I.tensor_sum(p, dtype=torch.float64) for p in parts])
            a = _total([I.vector_norm(p, ord=1, dtype=torch.float64) for p in parts])
        else:  # fp8, ints, bool: the bytes themselves
            b = out.contiguous().view(torch.uint8)
            parts = _pieces(b)
            s = _total([I.tensor_sum(p, dtype=torch.float64) for p in parts])
            a = _total([I.tensor_sum(p.to(torch.float64).pow(2)) for p in parts]) if b.numel() < (1 << 26) else s
        sums.append(torch.stack([s, a]))
    return sums


def _pieces(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` as views of at most ``CHECKSUM_ELEMENTS`` each (a strided one by its leading
    dimension: no copy, a row at least)."""
    n = CHECKSUM_ELEMENTS
    if t.dim() == 0 or t.numel() <= n:
        return [t]
    if t.is_contiguous():
        flat = t.view(-1)
        return [flat[i: i + n] for i in range(0, flat.numel(), n)]
    rows = max(1, n // max(1, t[0].numel()))
    return [t[i: i + rows] for i in range(0, t.shape[0], rows)]


def _total(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else I.tensor_sum(torch.stack(parts), dtype=torch.float64)


class L2Control:
    """Flush the L2 by writing a buffer larger than it; reset persisting lines via the runtime."""

    def __init__(self, device: torch.device):
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 1024 * 1024)
        self.buffer = torch.ones(max(4 * l2, 256 * 1024 * 1024) // 4, dtype=torch.int32, device=device)
        self.sink = torch.empty((), dtype=torch.int32, device=device)
        self.note = None
        self._cycles_per_second: float | None = None
        self._cudart = _load_cudart()
        if self._cudart is None:
            self.note = "persisting-L2 reset unavailable (libcudart not found); flush by buffer only"

    def persisting_limit(self) -> int | None:
        """The persisting-L2 size limit now in force; > 0 only if someone asked for pinning."""
        if self._cudart is None:
            return None
        value = ctypes.c_size_t(0)
        if self._cudart.cudaDeviceGetLimit(ctypes.byref(value), CUDA_LIMIT_PERSISTING_L2) != 0:
            return None
        return int(value.value)

    def reset_persisting(self) -> None:
        if self._cudart is not None:
            self._cudart.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0))
            self._cudart.cudaCtxResetPersistingL2Cache()

    def flush(self) -> None:
        # Read, not write: a written buffer leaves the L2 full of dirty lines whose write-back
        # the next kernel would pay for; a read leaves it full of clean, useless lines.
        torch.amax(self.buffer, dim=0, out=self.sink)

    def gate(self, seconds: float = 150e-6) -> None:
        """Hold the stream for ``seconds`` on the GPU, giving the host time to queue what follows."""
        if self._cycles_per_second is None:  # calibrate the sleep kernel once: cycles per second
            start, end = I.Event(enable_timing=True), I.Event(enable_timing=True)
            I.gpu_sleep(1_000_000)
            I.event_record(start)
            I.gpu_sleep(2_000_000)
            I.event_record(end)
            I.synchronize()
            self._cycles_per_second = 2_000_000 / max(I.event_elapsed(start, end) / 1000.0, 1e-6)
        I.gpu_sleep(int(seconds * self._cycles_per_second))

    def spin(self, seconds: float = 0.1) -> None:
        """Keep the GPU busy long enough for its clocks to settle before timing starts."""
        start, end = I.Event(enable_timing=True), I.Event(enable_timing=True)
        I.event_record(start)
        self.flush()
        I.event_record(end)
        I.synchronize()
        per_flush = max(I.event_elapsed(start, end) / 1000.0, 1e-6)
        for _ in range(int(min(2000, seconds / per_flush))):
            self.flush()


def _load_cudart() -> Any:
    """The CUDA runtime this process already loaded (the one torch uses)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def write(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` (flat uint8, same length): on a GPU with a kernel on the SMs
    (8 bytes per element where the length allows), never the copy engine, which can run beside
    another process's kernels."""
    if dst.device.type != "cuda":
        dst.copy_(src)
        return
    if dst.numel() % 8 == 0 and dst.data_ptr() % 8 == 0 and src.data_ptr() % 8 == 0:
        torch.bitwise_or(src.view(torch.int64), 0, out=dst.view(torch.int64))
    else:
        torch.bitwise_or(src, 0, out=dst)


def write_throughput(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """The fastest the trusted write moves bytes on this GPU (bytes read + written per second):
    its floor for a region is 2 * bytes / this, a time no real write beats."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start, end = I.Event(enable_timing=True), I.Event(enable_timing=True)
        I.event_record(start)
        write(dst, src)
        I.event_record(end)
        I.synchronize()
        best = min(best, I.event_elapsed(start, end) / 1e3)
    return 2 * nbytes / best


@dataclass(frozen=True)
class BatchLayout:
    """The baselines' batch: one region per dtype, each with its pristine copy, and every call's
    arguments, its tensors views of the region of their own dtype (``_base.dtype == dtype``).

    One region per dtype, not one of bytes: aot_autograd checks inputs that share a storage for
    overlap (disjoint inputs of two dtypes can look overlapping to it: torch 2.13 on reshape_and_
    cache's caches and slot mapping) and refuses a reference that writes one of them in place when
    they differ in dtype ("input mutations on views with different dtypes"), so torch.compile gave
    no baseline. In a region of one dtype a call's inputs are disjoint slices of one base."""

    regions: tuple[torch.Tensor, ...]
    pristine: tuple[torch.Tensor, ...]
    calls: tuple[list[Any], ...]

    def write(self) -> None:
        """The trusted write of every region's pristine bytes, each region a flat uint8 copy."""
        for region, pristine in zip(self.regions, self.pristine):
            write(region.view(torch.uint8), pristine.view(torch.uint8))


def time_batch(fn: Callable[..., Any], batch: BatchLayout, l2: "L2Control", batches: int) -> dict[str, Any]:
    """The baselines' batch: ``fn`` on each call's arguments, one CUDA graph of all calls, timed
    like a candidate's batch: events around the trusted write of fresh inputs (every region's
    pristine bytes) and the replay; per call, the window less the write."""
    for _ in range(2):
        batch.write()
        fn(*batch.calls[0])
    I.synchronize()
    graph, mode, reason = I.CUDAGraph(), "graph", None
    try:
        with I.cuda_graph_ctx(graph):
            for args in batch.calls:
                fn(*args)
        I.synchronize()
    except Exception as err:  # a reference that syncs the host cannot be captured: eager, flagged
        graph, mode, reason = None, "eager", f"CUDA-graph capture failed ({type(err).__name__}: {str(err)[:200]})"
        I.synchronize()
    l2.spin(0.03)  # the clocks settle before the first timed batch
    per_call = []
    for _ in range(batches):
        l2.reset_persisting()
        start, end = I.Event(enable_timing=True), I.Event(enable_timing=True)
        I.synchronize()
        written = I.Event(enable_timing=True)
        I.event_record(start)
        batch.write()
        I.event_record(written)
        if graph is not None:
            I.graph_replay(graph)
        else:
            for args in batch.calls:
                fn(*args)
        I.event_record(end)
        I.synchronize()
        # Nothing else runs in this trusted process: the write's own span is exact, taken off whole
        # (the candidate's batch takes it off whole too when nothing can have interrupted it).
        per_call.append(max(I.event_elapsed(start, end) - I.event_elapsed(start, written), 0.0) / 1e3 / len(batch.calls))
    return summary(per_call) | {"mode": mode, "fallback_reason": reason}


def summary(per_call_s: Sequence[float]) -> dict[str, Any]:
    """Median per-call time (us) of several batches and their spread (% of the median)."""
    times = [t * 1e6 for t in per_call_s]
    med = statistics.median(times) if times else None
    spread = 100.0 * (max(times) - min(times)) / med if med and len(times) > 1 else None
    return {"median_us": med, "spread_pct": spread, "n": len(times), "times_us": times}

