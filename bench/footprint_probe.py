"""Where the time of record's few microseconds per call over Nsight Compute come from.

The judge times a batch of calls captured in one CUDA graph, each call on fresh inputs at its
own place in the shared arena; ``bench/ncu_check.py`` showed that per-call time a roughly
constant 6 to 10 us above ncu's time of the same kernel, whatever the kernel's bytes. This
probe times one memory-bound call (bf16 ``x + 1``, 256 MiB in and 256 MiB out, like the rms_norm
seed) in graphs of back-to-back calls, and varies one thing at a time:

* where the buffers come from: PyTorch's caching allocator or one ``cuMemCreate`` block
  (verifier/vmm.py, as the arena);
* how many distinct buffer pairs the calls cycle over (1: the same inputs every call; = calls:
  every call on fresh memory, as the judge does), i.e. the memory the batch touches;
* the difference of a long and a short batch (the judge's method) against the long batch alone;
* then, for the rms_norm seed's own kernel on fresh memory: the GPU left idle before each
  window (as between the judge's messages), and a second process holding a CUDA context.

Usage (H200): python3 bench/footprint_probe.py [--mib 256] [--calls 40]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from kernforge.verifier import timing, vmm


def _graph(pairs: list[tuple[torch.Tensor, torch.Tensor]], calls: int) -> torch.cuda.CUDAGraph:
    for x, y in pairs[:2]:
        torch.add(x, 1, out=y)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for k in range(calls):
            x, y = pairs[k % len(pairs)]
            torch.add(x, 1, out=y)
    return g


def _window_ms(g: torch.cuda.CUDAGraph, l2: timing.L2Control, reps: int, idle_s: float = 0.0) -> float:
    times = []
    for _ in range(reps):
        l2.flush()
        if idle_s:
            torch.cuda.synchronize()
            time.sleep(idle_s)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _pairs(source: str, count: int, numel: int, keep: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if source == "torch":
        return [(torch.randn(numel, device="cuda", dtype=torch.bfloat16), torch.empty(numel, device="cuda", dtype=torch.bfloat16))
                for _ in range(count)]
    block = vmm.create(2 * count * numel * 2, torch.cuda.current_device())
    keep.append(block)
    flat = block.tensor().view(torch.bfloat16)
    flat.normal_()
    return [(flat[(2 * k) * numel:(2 * k + 1) * numel], flat[(2 * k + 1) * numel:(2 * k + 2) * numel]) for k in range(count)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB of each input (and of each output)")
    ap.add_argument("--calls", type=int, default=40, help="calls in the long batch (the short one has an eighth)")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    numel = args.mib * 2**20 // 2
    short = max(1, args.calls // 8)
    l2 = timing.L2Control(torch.device("cuda"))
    rows = []
    for source in ("torch", "vmm"):
        for distinct in sorted({1, 2, 8, args.calls}):
            keep: list = []
            pairs = _pairs(source, distinct, numel, keep)
            long_ms = _window_ms(_graph(pairs, args.calls), l2, args.reps)
            short_ms = _window_ms(_graph(pairs, short), l2, args.reps)
            alone_ms = _window_ms(_graph(pairs, 1), l2, args.reps)
            slope = (long_ms - short_ms) * 1e3 / (args.calls - short)
            rows.append((source, distinct, distinct * 2 * args.mib / 1024, long_ms * 1e3 / args.calls, slope, alone_ms * 1e3))
            del pairs, keep
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    rows += _rms_rows(args, short, l2)
    print(f"| memory | distinct pairs | GiB touched | long batch us/call ({args.calls}) | difference us/call ({args.calls}-{short}) | one call alone us |")
    print("|---|---|---|---|---|---|")
    for source, distinct, gib, plain, slope, alone in rows:
        print(f"| {source} | {distinct} | {gib:.1f} | {plain:.2f} | {slope:.2f} | {alone:.2f} |")


def _rms_rows(args: argparse.Namespace, short: int, l2: timing.L2Control) -> list[tuple]:
    """The rms_norm seed's kernel (T x 8192 bf16 rows, ``--mib`` per input) on fresh vmm memory."""
    from kernforge.tasks.builtin.rms_norm.seed import rms_norm

    hidden = 8192
    rows_n = args.mib * 2**20 // 2 // hidden
    keep: list = []
    pairs = _pairs("vmm", args.calls, rows_n * hidden, keep)
    weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)

    def graph(calls: int) -> torch.cuda.CUDAGraph:
        for x, y in pairs[:2]:
            rms_norm(x.view(rows_n, hidden), weight)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for k in range(calls):
                rms_norm(pairs[k][0].view(rows_n, hidden), weight)
        return g

    long_g, short_g, one_g = graph(args.calls), graph(short), graph(1)
    out = []
    for label, idle_s, other in (("rms seed", 0.0, False), ("rms seed, 50 ms idle", 0.05, False),
                                 ("rms seed, 2nd context", 0.0, True)):
        holder = None
        if other:  # another process with a live CUDA context, idle (as the reference worker is)
            holder = subprocess.Popen([sys.executable, "-c", "import torch, time; torch.zeros(1, device='cuda'); "
                                       "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
            holder.stdout.readline()
        try:
            long_ms = _window_ms(long_g, l2, args.reps, idle_s)
            short_ms = _window_ms(short_g, l2, args.reps, idle_s)
            alone_ms = _window_ms(one_g, l2, args.reps, idle_s)
        finally:
            if holder is not None:
                holder.kill()
        slope = (long_ms - short_ms) * 1e3 / (args.calls - short)
        out.append((label, args.calls, args.calls * 2 * args.mib / 1024, long_ms * 1e3 / args.calls, slope, alone_ms * 1e3))
    return out


if __name__ == "__main__":
    main()
