"""What one stop of the jobs the gate stops costs (CPU; no GPU needed).

Before every timed window the judge stops what is enlisted with the GPU's gate (verifier/gate.py):
another lane's or a compile ahead's worker (procs.freeze_many: walks of /proc, checked until
every member is seen stopped) and, since session 62, the workers the pool is warming up
(procs.stop_trusted_tree: their children files, no walk). A walk reads every process of the host,
and on a GPU host during a run there are hundreds (the compile ahead's processes and their
compile workers, the pool's workers). This prints the milliseconds of one stop and thaw of
``--trees`` process trees beside ``--others`` idle processes, each way.

Usage: python bench/stop_cost.py [--others 300] [--trees 6] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Callable

from rich.console import Console
from rich.table import Table

from kernforge.sandbox import procs

TREE = "import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\nwhile True: time.sleep(0.001)\n"


def _ms(fn: Callable[[], None], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--others", type=int, default=300, help="idle processes beside (the host's others)")
    parser.add_argument("--trees", type=int, default=6, help="process trees stopped (a pool's warming workers)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    others = [subprocess.Popen(["sleep", "1000"]) for _ in range(args.others)]
    trees = [subprocess.Popen([sys.executable, "-c", TREE]) for _ in range(args.trees)]
    try:
        time.sleep(1.0)  # every tree has its child
        roots = [t.pid for t in trees]

        def walked() -> None:
            for pids, _ in procs.freeze_many([(root, None) for root in roots]):
                procs.thaw(pids)

        def quick() -> None:
            for pids in [procs.stop_trusted_tree(root) for root in roots]:
                procs.thaw(pids)

        table = Table(title=f"one stop and thaw of {args.trees} process trees beside {len(procs.snapshot())} processes (ms)")
        for col in ("how", "median", "p90"):
            table.add_column(col, justify="right")
        for name, fn in (("walks of /proc, checked (freeze_many)", walked), ("children files (stop_trusted_tree)", quick)):
            median, p90 = _ms(fn, args.repeats)
            table.add_row(name, f"{median:.2f}", f"{p90:.2f}")
        Console(width=120).print(table)
    finally:
        for proc in trees:
            for pid in procs.descendants(proc.pid, procs.snapshot())[::-1]:
                procs._signal(pid, 9)
            proc.wait()
        for proc in others:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
