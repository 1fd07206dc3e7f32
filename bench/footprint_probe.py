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
  window (as between the judge's messages), a second process holding a CUDA context, its output
  in the block rather than the graph's pool, and a second process on memory imported from this
  one (the judge's candidate worker maps the reference worker's arena so).

Measured on the H200 (2026-12-02): the elementwise call takes 127.0-127.8 us whatever the memory
touched; the rms_norm seed's kernel 131.7 us per call back to back (Nsight Compute: 126.8 us),
unchanged by idle time or a second context.

Usage (H200): python3 bench/footprint_probe.py [--mib 256] [--calls 40]
"""

from __future__ import annotations

import argparse
import json
import os
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
    return _split(flat, count, numel)


def _split(flat: torch.Tensor, count: int, numel: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (input, output) pairs of ``numel`` elements each, side by side in ``flat``."""
    return [(flat[(2 * k) * numel:(2 * k + 1) * numel], flat[(2 * k + 1) * numel:(2 * k + 2) * numel]) for k in range(count)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB of each input (and of each output)")
    ap.add_argument("--calls", type=int, default=40, help="calls in the long batch (the short one has an eighth)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--child-fd", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-size", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_fd is not None:
        _child(args)
        return
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


def _rms_graphs(pairs: list, rows_n: int, hidden: int, sizes: tuple[int, ...], into_pairs: bool) -> list:
    """Graphs of the rms_norm seed's kernel over ``pairs`` (one call per pair, in turn), one per
    batch size: its output from the graph's pool (as the seed allocates it) or ``into_pairs``, the
    pair's own output buffer (as the judge's outputs lie in the arena)."""
    import triton

    from kernforge.tasks.builtin.rms_norm.seed import _rms_norm_kernel, rms_norm

    weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)

    def call(k: int) -> None:
        x, y = pairs[k % len(pairs)]
        x2 = x.view(rows_n, hidden)
        if not into_pairs:
            rms_norm(x2, weight)
            return
        y2 = y.view(rows_n, hidden)
        _rms_norm_kernel[(rows_n,)](x2, weight, y2, hidden, x2.stride(0), y2.stride(0), 1e-6,
                                     BLOCK=triton.next_power_of_2(hidden), num_warps=8)

    for k in range(2):
        call(k)
    torch.cuda.synchronize()
    graphs = []
    for n in sizes:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for k in range(n):
                call(k)
        graphs.append(g)
    return graphs


def _rms_measure(pairs: list, rows_n: int, hidden: int, args: argparse.Namespace, short: int, l2: timing.L2Control,
                 into_pairs: bool, idle_s: float = 0.0) -> tuple[float, float, float]:
    """(long batch us per call, difference us per call, one call alone us)."""
    long_g, short_g, one_g = _rms_graphs(pairs, rows_n, hidden, (args.calls, short, 1), into_pairs)
    long_ms = _window_ms(long_g, l2, args.reps, idle_s)
    short_ms = _window_ms(short_g, l2, args.reps, idle_s)
    alone_ms = _window_ms(one_g, l2, args.reps, idle_s)
    return long_ms * 1e3 / args.calls, (long_ms - short_ms) * 1e3 / (args.calls - short), alone_ms * 1e3


def _rms_rows(args: argparse.Namespace, short: int, l2: timing.L2Control) -> list[tuple]:
    """The rms_norm seed's kernel (T x 8192 bf16 rows, ``--mib`` per input) on fresh vmm memory:
    in this process, with the GPU idle before each window, beside another process's idle
    context, and in a child process on memory imported from this one (as the judge's workers
    share the arena)."""
    hidden = 8192
    rows_n = args.mib * 2**20 // 2 // hidden
    keep: list = []
    pairs = _pairs("vmm", args.calls, rows_n * hidden, keep)
    gib = args.calls * 2 * args.mib / 1024
    out = []
    for label, into, idle_s, other in (("rms seed", False, 0.0, False), ("rms seed, 50 ms idle", False, 0.05, False),
                                       ("rms seed, 2nd context", False, 0.0, True), ("rms kernel, out in vmm", True, 0.0, False)):
        holder = None
        if other:  # another process with a live CUDA context, idle (as the reference worker is)
            holder = subprocess.Popen([sys.executable, "-c", "import torch, time; torch.zeros(1, device='cuda'); "
                                       "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
            holder.stdout.readline()
        try:
            out.append((label, args.calls, gib, *_rms_measure(pairs, rows_n, hidden, args, short, l2, into, idle_s)))
        finally:
            if holder is not None:
                holder.kill()
    block = keep[0]
    fd = block.export()
    try:
        child = subprocess.run([sys.executable, __file__, "--child-fd", str(fd), "--child-size", str(block.size),
                                "--mib", str(args.mib), "--calls", str(args.calls), "--reps", str(args.reps)],
                               pass_fds=(fd,), capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    if child.returncode != 0:
        print(f"the child on imported memory failed: {child.stderr[-800:]}")
        return out
    for label, figures in json.loads(child.stdout.strip().splitlines()[-1]).items():
        out.append((label, args.calls, gib, *figures))
    return out


def _child(args: argparse.Namespace) -> None:
    """The rms rows in a process of its own, on the parent's block (imported by fd)."""
    hidden = 8192
    rows_n = args.mib * 2**20 // 2 // hidden
    numel = rows_n * hidden
    block = vmm.open_fd(args.child_fd, args.child_size, torch.cuda.current_device())
    pairs = _split(block.tensor().view(torch.bfloat16), args.calls, numel)
    short = max(1, args.calls // 8)
    l2 = timing.L2Control(torch.device("cuda"))
    got = {"rms seed, imported memory": _rms_measure(pairs, rows_n, hidden, args, short, l2, False),
           "rms kernel, out in imported memory": _rms_measure(pairs, rows_n, hidden, args, short, l2, True)}
    print(json.dumps(got))


if __name__ == "__main__":
    main()
