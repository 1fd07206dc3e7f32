"""How long stopping a sandboxed job takes (sandbox/procs.py ``freeze_many``), per job kind.

    python bench/freeze_probe.py                       # 100 stops of each job, every mechanism here
    python bench/freeze_probe.py --stops 300 --load 4  # with 4 busy loops beside it (a loaded host)

A lane that times stops every other lane's worker before each window (verifier/gate.py), and the
verdict waits for the stop: its seconds are gate wait for every lane. Each job is stopped and
resumed ``--stops`` times; the table gives the stop's milliseconds (median, 99th percentile, most)
and the rounds over /proc it took (most). Jobs (tests/sandbox_jobs/hostile.py):

* ``idle``: a worker waiting for a message, as an honest candidate's worker between calls;
* ``forks``: a parent with 6 children, all busy;
* ``wake_each_other``: 7 processes that send each other SIGCONT without end, a candidate's
  attempt to keep running through another lane's window (a freeze that stopped only the members a
  listing saw awake took up to 364 listings on a 2-core machine, and CI's loaded run gave up
  after 500).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernforge.sandbox import Limits, ProcessBackend, SandboxError, WorkerSpec, isolation, procs

TESTS = Path(__file__).resolve().parents[1] / "tests"
LIMITS = Limits(wall_seconds=600, cpu_seconds=3600, memory_bytes=1 << 30, processes=64)
JOBS = {"idle": ("sandbox_jobs.hostile:conversation", {}),
        "forks": ("sandbox_jobs.hostile:busy_children", {"children": 6}),
        "wake_each_other": ("sandbox_jobs.hostile:wake_each_other", {"children": 6})}


def mechanisms() -> list[str]:
    """The namespace mechanisms this machine offers (as tests/test_sandbox.py picks them)."""
    found = []
    for name in ("bwrap", "namespaces"):
        try:
            if isolation.mechanism(name).name == name:
                found.append(name)
        except SandboxError:
            pass
    return found or ["strict"]


def _spin() -> None:
    while True:
        pass


def _counting_rounds() -> list[int]:
    """Wrap ``procs.freeze_many`` so each call appends how many rounds it took (its sleeps + 1)."""
    rounds: list[int] = []
    real_freeze, real_sleep = procs.freeze_many, procs.time.sleep

    def counted(targets):
        slept = [0]

        def sleep(seconds):
            slept[0] += 1
            real_sleep(seconds)

        procs.time.sleep = sleep
        try:
            return real_freeze(targets)
        finally:
            procs.time.sleep = real_sleep
            rounds.append(slept[0] + 1)

    procs.freeze_many = counted
    return rounds


def probe(mechanism: str, job: str, stops: int, rounds: list[int]) -> dict:
    entry, payload = JOBS[job]
    backend = ProcessBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation=mechanism), pool_size=1)
    stopped_ms: list[float] = []
    failed = 0
    del rounds[:]
    try:
        with backend.session(entry, payload, LIMITS) as session:
            if job != "idle":
                session.recv(30)  # its processes are up
            for _ in range(stops):
                started = time.perf_counter()
                try:
                    session.pause()
                except procs.NotStopped:
                    failed += 1
                stopped_ms.append((time.perf_counter() - started) * 1e3)
                session.resume()
    finally:
        backend.close()
    ordered = sorted(stopped_ms)
    return {"median": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "most": ordered[-1], "rounds": max(rounds, default=0), "failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, default=100, help="stops of each job (default 100)")
    parser.add_argument("--load", type=int, default=0, help="busy loops run beside the jobs (default 0)")
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    args = parser.parse_args(argv)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for spinner in spinners:
        spinner.start()
    rounds = _counting_rounds()
    table = Table(title=f"stopping a job: {args.stops} stops each, {args.load} busy loop(s) beside")
    for column in ("mechanism", "job", "median ms", "p99 ms", "most ms", "most rounds", "not stopped"):
        table.add_column(column, justify="left" if column in ("mechanism", "job") else "right")
    try:
        for mechanism in mechanisms():
            for job in args.jobs:
                r = probe(mechanism, job, args.stops, rounds)
                table.add_row(mechanism, job, f"{r['median']:.2f}", f"{r['p99']:.2f}", f"{r['most']:.2f}",
                              str(r["rounds"]), str(r["failed"]))
    finally:
        for spinner in spinners:
            spinner.terminate()
    Console(width=140).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
