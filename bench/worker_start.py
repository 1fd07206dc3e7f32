"""Where a candidate worker's start goes, with and without the pool's Triton cache seed.

A verdict takes a warm worker from its GPU's pool, and the pool starts another: imports (torch,
Triton, the harness), the CUDA context, the first Triton launch (Triton's driver module and the
kernel's launcher built with the host's C compiler, the kernel compiled), then the harness's hooks.
In a loaded run on an H100 a start took 9.6 s and the pool of six ran dry (session 62).
verifier/triton_seed.py copies the first warm worker's Triton cache into each later worker's home.
This starts ``--rounds`` rounds of ``--workers`` workers at once, the way a pool refills, each
round without the seed and then with it, and prints each step's median seconds (the workers' own
account, ``start_steps``) beside the start's wall time. ``--load N`` keeps N processes spinning
on the CPU meanwhile (a run's Inductor compiles); workers warm up niced, as in a pool.

Usage: python bench/worker_start.py [--device 0] [--workers 6] [--rounds 3] [--load 4]
       [--json out.json]   (on a GPU: on the CPU a warm-up builds no Triton module, and no seed)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kernforge.sandbox.isolation import mechanism
from kernforge.sandbox.protocol import WorkerSpec
from kernforge.sandbox.spawn import Worker
from kernforge.sandbox.uids import uid_drop_status
from kernforge.verifier.judge import HARNESS_PRELOAD, HARNESS_WARMUP
from kernforge.verifier.triton_seed import TritonSeed

SPIN = "while True: pass\n"


def start_round(spec: WorkerSpec, count: int, seed: TritonSeed | None, timeout: float) -> list[dict[str, Any]]:
    """``count`` workers started at once; each one's wall time to ready and its own steps."""
    mech = mechanism(spec.isolation)
    drop = uid_drop_status(mech)[0]
    workers = [Worker(spec, mech, drop, seed=seed) for _ in range(count)]
    rows = []
    try:
        for worker in workers:
            worker.wait_ready(timeout)
            rows.append({"wall": time.monotonic() - worker.started, **(worker.ready_info or {}).get("start_steps", {})})
    finally:
        for worker in workers:
            worker.cleanup()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="0", help="the GPU's index")
    parser.add_argument("--workers", type=int, default=6, help="workers started at once (a pool's size)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=0, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    spec = WorkerSpec(device=args.device, preload=HARNESS_PRELOAD, warmup=HARNESS_WARMUP, isolation="strict")
    seed = TritonSeed()
    # the seed's source: one warm worker's cache, taken before it has a job, as in a pool
    probe = Worker(spec, mechanism(spec.isolation), uid_drop_status(mechanism(spec.isolation))[0])
    try:
        probe.wait_ready(args.timeout)
        alone = time.monotonic() - probe.started
        seed.harvest(probe.workdir)
    finally:
        probe.cleanup()
    if not seed.files:  # on the CPU a warm-up builds no Triton module: the seeded starts are plain ones
        print("note: the first worker's warm-up left no Triton cache to seed from (no GPU?)", flush=True)
    print(f"alone, the first worker (the seed's source): {alone:.2f} s; seed {sorted(seed.files or {})}", flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.load)]
    results: dict[str, list[dict[str, Any]]] = {"unseeded": [], "seeded": []}
    try:
        for n in range(args.rounds):
            for name, planted in (("unseeded", None), ("seeded", seed)):
                rows = start_round(spec, args.workers, planted, args.timeout)
                results[name] += rows
                # as it goes: a call cut short still shows what came
                print(f"round {n + 1} {name}: " + " ".join(f"{r['wall']:.1f}s" for r in rows), flush=True)
    finally:
        for p in spinners:
            p.kill()
    steps = sorted({k for rows in results.values() for row in rows for k in row if k != "wall"})
    table = Table(title=f"worker starts: {args.workers} at once, {args.rounds} rounds, {args.load} spinning "
                        f"(median s; seed: {len(seed.files or {})} files, {sum(map(len, (seed.files or {}).values())) >> 10} KiB)")
    for col in ["start", "workers", "wall", *steps]:
        table.add_column(col, justify="right")
    for name, rows in results.items():
        table.add_row(name, str(len(rows)), *[f"{statistics.median(r.get(k, 0.0) for r in rows):.2f}" for k in ["wall", *steps]])
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"alone": alone, **results, "seed_files": sorted(seed.files or {})}, indent=1))


if __name__ == "__main__":
    main()
