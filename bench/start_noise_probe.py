"""Do sandbox workers warming up disturb a timed window? (GPU; ``--device cpu`` only checks that the
script runs.)

A GPU pool keeps workers warm (loop/devices.py ``GPU_POOL``) and refills itself in the background:
each new worker imports torch, creates its CUDA context and compiles and launches Triton's first
kernel in a cache of its own (harness.warm_up). Those starts were outside the GPU's gate: nothing
stopped them while a judge timed. The question came from an audit on an H100 (session 61) that
read 3-4 times its recorded time at the small shapes, spreads of 35-175%, in a run's first
minute while the pool's workers started. On an H100 (session 62) this found the median window
unmoved by the starts, and the worst of some 1,350 at 5.82 us a call beside them, 2.85 alone and
1.32 with the starters stopped for each window: a start lands in a window now and then.

The victim here is a timed window as the reference worker makes one: a captured graph of
``--calls`` small kernels replayed between two CUDA events after the GPU is found quiet
(refworker._quiet_gpu); its time per call is printed at the median, the 90th percentile and the
worst, and the share of windows over 1.2 times the median alone. Beside it:

* ``alone``: nothing else on the GPU;
* ``starts``: ``--starters`` processes each running harness.warm_up in a fresh Triton cache,
  over and over (a pool refilling);
* ``starts, stopped``: the same, every starter stopped (SIGSTOP) before each window and let go
  after, as the gate stops the processes enlisted with it (verifier/gate.py).

Usage: python bench/start_noise_probe.py [--seconds 20] [--calls 512] [--starters 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

STARTER = """
import os, sys
from kernforge.verifier import harness
harness.warm_up()
"""


class Starters:
    """``n`` loops, each starting a warming worker again as soon as the last one exits."""

    def __init__(self, n: int, device: str) -> None:
        self.n, self.device = n, device
        self.procs: list[subprocess.Popen[bytes]] = []
        self.starts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        while not self._stop.is_set():
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TRITON_CACHE_DIR=cache)
                if not self.device.startswith("cuda"):
                    env["CUDA_VISIBLE_DEVICES"] = ""
                with self._lock:
                    if self._stop.is_set():
                        return
                    proc = subprocess.Popen([sys.executable, "-c", STARTER], env=env, stdout=subprocess.DEVNULL)
                    self.procs.append(proc)
                proc.wait()
                with self._lock:
                    self.procs.remove(proc)
                    self.starts += 1

    def __enter__(self) -> "Starters":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            for proc in self.procs:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for t in self._threads:
            t.join()

    def signal(self, sig: int) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            procs = list(self.procs)
        for proc in procs:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        return procs


def _window(device: str, calls: int) -> Any:
    """A replayable timed window: ``calls`` small kernels captured in one graph."""
    x = torch.ones(4096, device=device)
    if not device.startswith("cuda"):
        def run() -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                x.mul_(1.0000001)
            return (time.perf_counter() - t0) * 1e6 / calls
        return run
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.mul_(1.0000001)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            x.mul_(1.0000001)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run() -> float:
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls
    return run


def _quiet(device: str) -> None:
    if device.startswith("cuda"):
        from kernforge.verifier.refworker import _quiet_gpu

        _quiet_gpu(device)


def _measure(device: str, run: Any, seconds: float, starters: Starters | None, stop: bool) -> list[float]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stopped = starters.signal(signal.SIGSTOP) if starters is not None and stop else []
        _quiet(device)
        out.append(run())
        for proc in stopped:
            try:
                proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        time.sleep(0.01)  # a verdict's windows come tens of ms apart
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--starters", type=int, default=2)
    args = parser.parse_args(argv)
    device = args.device
    run = _window(device, args.calls)
    rows = []
    alone = _measure(device, run, args.seconds, None, False)
    base = statistics.median(alone)
    rows.append(("alone", alone, 0))
    for name, stop in (("starts", False), ("starts, stopped", True)):
        with Starters(args.starters, device) as starters:
            got = _measure(device, run, args.seconds, starters, stop)
            rows.append((name, got, starters.starts))
    table = Table(title=f"a window of {args.calls} small kernels beside workers warming up ({device}): us a call")
    for col in ("beside", "windows", "starts done", "median", "p90", "worst", "> 1.2x alone's median"):
        table.add_column(col, justify="right")
    for name, got, starts in rows:
        got = sorted(got)
        table.add_row(name, str(len(got)), str(starts), f"{statistics.median(got):.2f}", f"{got[int(0.9 * (len(got) - 1))]:.2f}",
                      f"{got[-1]:.2f}", f"{100 * sum(1 for g in got if g > 1.2 * base) / len(got):.0f}%")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
