"""The host's CPU through a bench/h200.sh call: every ``--every`` seconds one line ``HH:MM:SS
BUSY RUNNING CORES``, the share of all cores' time spent outside idle and iowait since the last
line (per cent) and the runnable threads then (``procs_running`` of /proc/stat), until killed.

With one lane the judge's pipeline is bound by the host (nvidia-smi sees the GPU busy about a
third of a run): this says whether the host's cores were busy meanwhile, and how many threads
wanted one. h200.sh starts it with ``SMI=1``; bench/gpu_busy.py ``--cpu`` averages it per phase.

    python bench/cpu_sample.py cpu.log [--every 0.5]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def read_stat(text: str) -> tuple[int, int, int]:
    """(busy jiffies, all jiffies, runnable threads) from /proc/stat's text: idle and iowait are
    not busy; steal and guest are counted in the total as the kernel lists them."""
    busy = total = running = 0
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            ticks = [int(x) for x in parts[1:]]
            total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
            busy = total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
        elif parts and parts[0] == "procs_running":
            running = int(parts[1])
    return busy, total, running


def line(at: float, before: tuple[int, int, int], now: tuple[int, int, int], cores: int) -> str:
    """One sample's line: the busy share between two reads of /proc/stat."""
    spent = now[1] - before[1]
    busy = 100.0 * (now[0] - before[0]) / spent if spent > 0 else 0.0
    return f"{time.strftime('%H:%M:%S', time.localtime(at))} {busy:.0f} {now[2]} {cores}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    args = parser.parse_args()
    stat = Path("/proc/stat")
    cores = os.cpu_count() or 1
    before = read_stat(stat.read_text())
    with args.log.open("a") as out:
        while True:
            time.sleep(args.every)
            now = read_stat(stat.read_text())
            out.write(line(time.time(), before, now, cores) + "\n")
            out.flush()
            before = now


if __name__ == "__main__":
    main()
