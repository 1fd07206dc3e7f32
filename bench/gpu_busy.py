"""How busy the GPU was during each phase of a bench/h200.sh call: nvidia-smi's samples
(``utilization.gpu``: the share of the sample's time some kernel ran; ``utilization.memory``: the
share the memory was read or written) averaged over each phase's span, and per second.

h200.sh with ``SMI=1`` samples every 100 ms into $OUT/smi.log, marks each phase's start and end in
$OUT/phases.log, and writes this table as gpubusy.log. On an H100 (session 51) a routine verdict's
GPU was busy about half its time: high while the large shapes' windows are verified, low through
the checked calls, whose round trips and the candidate's first calls leave it idle.

``--cpu cpu.log`` (bench/cpu_sample.py's lines, which h200.sh writes with ``SMI=1``) adds the
host's side per phase: its cores' busy share and the runnable threads, on average and at most.

    python bench/gpu_busy.py smi.log phases.log [--seconds PHASE] [--cpu cpu.log]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path


def samples(path: Path) -> list[tuple[str, int, int]]:
    """(HH:MM:SS, gpu %, memory %) per line of nvidia-smi's CSV (timestamp, utilization.gpu, utilization.memory)."""
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[1].endswith("%") or not parts[2].endswith("%"):
            continue
        out.append((parts[0].split()[-1][:8], int(parts[1].rstrip(" %")), int(parts[2].rstrip(" %"))))
    return out


def cpu_samples(path: Path) -> list[tuple[str, float, int]]:
    """(HH:MM:SS, busy %, runnable threads) per line of bench/cpu_sample.py's log."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and re.fullmatch(r"\d\d:\d\d:\d\d", parts[0]):
            try:
                out.append((parts[0], float(parts[1]), int(parts[2])))
            except ValueError:
                continue
    return out


def spans(path: Path) -> list[tuple[str, str, str]]:
    """(phase, start, end) from lines ``start NAME HH:MM:SS`` and ``end NAME HH:MM:SS``."""
    starts: dict[str, str] = {}
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"(start|end) (\S+) (\d\d:\d\d:\d\d)$", line.strip())
        if not m:
            continue
        kind, name, at = m.groups()
        if kind == "start":
            starts[name] = at
        elif name in starts:
            out.append((name, starts.pop(name), at))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("smi", type=Path)
    parser.add_argument("phases", type=Path)
    parser.add_argument("--seconds", help="also print this phase's utilization second by second")
    parser.add_argument("--cpu", type=Path, help="bench/cpu_sample.py's log: the host's cores per phase too")
    args = parser.parse_args()
    got = samples(args.smi)
    cpu = cpu_samples(args.cpu) if args.cpu is not None and args.cpu.exists() else None
    head = f"{'phase':<24} {'seconds':>8} {'samples':>8} {'GPU busy %':>11} {'memory busy %':>14}"
    print(head + (f" {'CPU busy %':>11} {'max':>4} {'runnable':>9} {'max':>4}" if cpu is not None else ""))
    for name, start, end in spans(args.phases):
        inside = [(g, m) for t, g, m in got if start <= t <= end]
        host = _host(cpu, start, end) if cpu is not None else ""
        if not inside:
            print(f"{name:<24} {'-':>8} {0:>8}" + (f" {'-':>11} {'-':>14}{host}" if host else ""))
            continue
        h0, m0, s0 = map(int, start.split(":"))
        h1, m1, s1 = map(int, end.split(":"))
        seconds = (h1 - h0) * 3600 + (m1 - m0) * 60 + (s1 - s0)
        print(f"{name:<24} {seconds:>8} {len(inside):>8} {sum(g for g, _ in inside) / len(inside):>11.0f} "
              f"{sum(m for _, m in inside) / len(inside):>14.0f}{host}")
        if name == args.seconds:
            per: dict[str, list[int]] = defaultdict(list)
            for t, g, _ in got:
                if start <= t <= end:
                    per[t].append(g)
            print("  " + " ".join(f"{t[-5:]}:{round(sum(v) / len(v))}" for t, v in sorted(per.items())))


def _host(cpu: list[tuple[str, float, int]], start: str, end: str) -> str:
    """The phase's CPU columns: busy share and runnable threads, mean and most ("" with no sample)."""
    inside = [(b, r) for t, b, r in cpu if start <= t <= end]
    if not inside:
        return ""
    busy, runnable = [b for b, _ in inside], [r for _, r in inside]
    return (f" {sum(busy) / len(busy):>11.0f} {max(busy):>4.0f} {sum(runnable) / len(runnable):>9.1f} "
            f"{max(runnable):>4}")


if __name__ == "__main__":
    main()
