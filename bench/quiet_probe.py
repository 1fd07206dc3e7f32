"""Can the trusted side tell that another process has GPU work before it opens a timed window?
(GPU only.)

Lanes share one GPU (verifier/gate.py): while one lane times, every other lane's candidate
worker is stopped (SIGSTOP), but GPU work it queued before it was stopped still runs, and a
kernel of another process lands inside the timed window (one GPU runs one context at a time).
This measures the probe the reference worker could run before the window: the host's wall from
launching a tiny kernel until the device has finished it, several times over, in each case:

* the GPU idle;
* another process spinning one kernel (``torch.cuda._sleep``) for about a second;
* another process that queued a long chain of matmuls and was then stopped with SIGSTOP;
* the same after its queue drained (it is still stopped).

Printed: per case the probe's median and largest latency, and the device time of a 64 MB write
(the window's own first step) measured beside it.

Usage: python bench/quiet_probe.py [--probes 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

CHILD = r"""
import sys, time, torch
mode = sys.argv[1]
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
if mode == "spin":
    sys.stdin.readline()
    torch.cuda._sleep(2_000_000_000)  # about a second at ~2 GHz
    print("queued", flush=True)
    torch.cuda.synchronize()
elif mode == "queue":
    sys.stdin.readline()
    for _ in range(400):  # ~1 ms each: a queue of about 0.4 s
        x = x @ x
        x = x / x.abs().amax()
    print("queued", flush=True)
    torch.cuda.synchronize()
print("drained", flush=True)
sys.stdin.readline()
"""


def probe(torch, n: int) -> list[float]:
    """Host microseconds from the launch of a one-element kernel until the device finished it."""
    t = torch.zeros(1, device="cuda")
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        t.add_(1)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def write_us(torch, src, dst) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    dst.copy_(src)
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=20)
    args = ap.parse_args()
    import torch

    src = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    probe(torch, 5), write_us(torch, src, dst)
    rows = []

    def case(name: str) -> None:
        lat = probe(torch, args.probes)
        rows.append((name, statistics.median(lat), max(lat), write_us(torch, src, dst)))

    case("idle")
    for mode in ("spin", "queue"):
        child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        case(f"idle, {mode} child started")
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "queued"
        if mode == "queue":
            os.kill(child.pid, signal.SIGSTOP)
            case("a stopped child's queued matmuls")
            time.sleep(1.0)
            case("the stopped child's queue drained")
            os.kill(child.pid, signal.SIGCONT)
        else:
            time.sleep(0.05)
            case("another process's kernel spinning")
        assert child.stdout.readline().strip() == "drained"
        case(f"after the {mode} child drained")
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=30)
    print("\n| case | probe median us | probe max us | 64 MB copy us (device) |\n|---|---:|---:|---:|")
    for name, med, most, w in rows:
        print(f"| {name} | {med:.1f} | {most:.1f} | {w:.1f} |")


if __name__ == "__main__":
    main()
