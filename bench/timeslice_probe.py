"""Do a lane's trusted steps wait on another process's GPU work? (GPU; ``--device cpu`` only
checks that the script runs.)

Two lanes on one GPU are two sets of processes, and one GPU runs one process's context at a
time: while two contexts both have work queued, it switches between them in time slices. A
reference worker's steps are many small kernels, each step ending in a sync (a prepare, a
compare: 7-14 ms on an H100). If each sync waits out a slice of the other lane's work, the steps
slow several-fold beside another lane, and two lanes make fewer verdicts than one (session 37
measured 5-10x; session 47's two-lane runs timed out).

The victim plays those steps: ``--kernels`` small element-wise kernels on 4 MB, then a sync,
``--steps`` times; its wall per step is printed at the median and the 90th percentile. Beside it:

* ``alone``: nothing else on the GPU;
* ``steps, other process``: another process doing the same steps (another lane's checks);
* ``traffic, other process``: another process streaming 1 GiB element-wise ops, a sync every
  eight (another lane's large windows: their fresh draws and verifications);
* ``spin, other process``: another process's kernels that each spin ``--spin-ms`` (a candidate's
  long kernel);
* ``traffic, same process``: the streaming work on another CUDA stream of the victim's own
  process, as one reference worker serving both lanes would run it.

The neighbour's own rate (GB/s or spins a second) is printed beside, so that a victim saved by
starving its neighbour shows.

Usage: python bench/timeslice_probe.py [--steps 200] [--kernels 30] [--spin-ms 2]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

#: the neighbour's streaming tensors, and how many of its ops go between syncs
TRAFFIC_BYTES = 1 << 30
TRAFFIC_BURST = 8


def _steps(device: str, steps: int, kernels: int) -> list[float]:
    """The victim: walls (ms) of ``steps`` steps of ``kernels`` small kernels and a sync."""
    x = torch.ones(1 << 20, device=device)
    walls = []
    for _ in range(steps):
        started = time.perf_counter()
        for _ in range(kernels):
            x.mul_(1.0000001)
        _sync(device, None)
        walls.append((time.perf_counter() - started) * 1e3)
    return walls


def _neighbour_work(kind: str, device: str, going: Any, stop: Any, spin_ms: float, kernels: int,
                    traffic_bytes: int = TRAFFIC_BYTES, stream: Any = None) -> tuple[float, str]:
    """Run ``kind`` until ``stop`` is set, ``going`` set once its first unit of work is done (the
    victim measures from then); its rate and unit."""
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        if kind == "traffic":
            a = torch.ones(traffic_bytes // 4, device=device)

            def unit() -> int:
                for _ in range(TRAFFIC_BURST):
                    a.mul_(1.0000001)
                _sync(device, stream)
                return TRAFFIC_BURST * 2 * traffic_bytes
            scale, what = 1e-9, "GB/s"
        elif kind == "spin":
            cycles = int(spin_ms * 1e-3 * _clock_hz(device))

            def unit() -> int:
                if device.startswith("cuda"):
                    torch.cuda._sleep(cycles)
                    _sync(device, stream)
                else:
                    time.sleep(spin_ms / 1e3)
                return 1
            scale, what = 1.0, "spins/s"
        else:
            def unit() -> int:
                _steps(device, 1, kernels)
                return 1
            scale, what = 1.0, "steps/s"
        unit()
        going.set()
        started, done = time.perf_counter(), 0
        while True:  # at least one unit after ``going``: a victim quicker than a unit still gets a rate
            done += unit()
            if stop.is_set():
                return done * scale / (time.perf_counter() - started), what


def _sync(device: str, stream: Any) -> None:
    """Wait for this thread's own stream only (``stream``, else the current one): a device-wide
    sync in the same-process case would wait for the neighbour's stream too, and measure that."""
    if stream is not None:
        stream.synchronize()
    elif device.startswith("cuda"):
        torch.cuda.current_stream(device).synchronize()


def _clock_hz(device: str) -> float:
    """Cycles a second of ``torch.cuda._sleep``, measured with CUDA events (1 GHz on a CPU)."""
    if not device.startswith("cuda"):
        return 1e9
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1 << 20)
    start.record()
    torch.cuda._sleep(1 << 24)
    end.record()
    end.synchronize()
    return (1 << 24) / (start.elapsed_time(end) / 1e3)


def _neighbour_process(kind: str, device: str, going: Any, stop: Any, out: Any, spin_ms: float, kernels: int,
                       traffic_bytes: int) -> None:
    out.put(_neighbour_work(kind, device, going, stop, spin_ms, kernels, traffic_bytes))


def measure(case: str, device: str, steps: int, kernels: int, spin_ms: float,
            traffic_bytes: int = TRAFFIC_BYTES) -> dict[str, Any]:
    """One case: the victim's walls beside ``case``'s neighbour (measured once the neighbour's
    first unit of work is done), and the neighbour's rate."""
    _steps(device, 5, kernels)  # warm
    if case == "alone":
        return {"walls": _steps(device, steps, kernels), "rate": None}
    kind, where = case.split(", ")
    if where == "same process":
        going, stop, result = threading.Event(), threading.Event(), {}
        stream = torch.cuda.Stream(device) if device.startswith("cuda") else None
        thread = threading.Thread(target=lambda: result.update(
            r=_neighbour_work(kind, device, going, stop, spin_ms, kernels, traffic_bytes, stream)))
        thread.start()
        going.wait()
        walls = _steps(device, steps, kernels)
        stop.set()
        thread.join()
        return {"walls": walls, "rate": result["r"]}
    spawn = mp.get_context("spawn")
    going, stop, out = spawn.Event(), spawn.Event(), spawn.Queue()
    proc = spawn.Process(target=_neighbour_process, args=(kind, device, going, stop, out, spin_ms, kernels, traffic_bytes))
    proc.start()
    if not going.wait(300):
        proc.kill()
        raise RuntimeError(f"the neighbour of {case!r} never started its work")
    walls = _steps(device, steps, kernels)
    stop.set()
    rate = out.get(timeout=300)
    proc.join(60)
    return {"walls": walls, "rate": rate}


CASES = ("alone", "steps, other process", "traffic, other process", "spin, other process",
         "traffic, same process")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="the victim's steps per case")
    parser.add_argument("--kernels", type=int, default=30, help="small kernels per step, before its sync")
    parser.add_argument("--spin-ms", type=float, default=2.0, help="how long each of the spinning neighbour's kernels runs")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    args = parser.parse_args()
    table = Table(title=f"a step of {args.kernels} small kernels and a sync, beside another lane's work ({args.device})")
    for col in ("beside", "median ms", "p90 ms", "max ms", "x alone (median)", "neighbour's rate"):
        table.add_column(col, justify="left" if col == "beside" else "right")
    alone = None
    for case in args.cases:
        r = measure(case, args.device, args.steps, args.kernels, args.spin_ms)
        med = statistics.median(r["walls"])
        alone = med if case == "alone" else alone
        rate = f"{r['rate'][0]:.1f} {r['rate'][1]}" if r["rate"] else "-"
        table.add_row(case, f"{med:.3f}", f"{_pct(r['walls'], 0.9):.3f}", f"{max(r['walls']):.3f}",
                      f"{med / alone:.1f}" if alone else "-", rate)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
