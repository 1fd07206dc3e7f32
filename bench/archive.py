"""Archive benchmark: fill a fresh archive with synthetic attempts, then time the common reads.

    python bench/archive.py                   # 1,000,000 attempts (minutes)
    python bench/archive.py --attempts 20000  # a quick run

Attempts come from ``kernforge.archive.synthetic``: 6 tasks, 4 proposers/models, 3 environments
(H200, A100, interpreter), the verdict mix an LLM loop sees, 2-8 shapes each, a parent for most
and ~5% repeated code (reuse rows). They are written through the library (``record_attempts``,
one transaction per batch, FTS triggers and all), so the insert rate is the archive's own.
Read latencies are medians over ``--repeat`` calls on a fresh read-only ``Archive``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from kernforge.archive import synthetic
from kernforge.archive.content import code_hash
from kernforge.archive.store import Archive


def fill(path: Path, attempts: int, batch: int, seed: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Write the attempts; (seconds spent generating, hashing and recording; things worth querying)."""
    rng = random.Random(seed)
    generate = hashing = record = 0.0
    with Archive.create(path, exist_ok=False) as archive:
        tasks = [(name, archive.register_task(synthetic.task_record(name))) for name in synthetic.TASKS]
        runs = [archive.start_run({"bench": i}) for i in range(max(1, attempts // 100_000))]
        last: dict[int, list[int]] = {task_id: [] for _, task_id in tasks}
        codes: dict[tuple[int, str], list[str]] = {}
        seq = {run: 0 for run in runs}
        done = 0
        while done < attempts:
            started = time.perf_counter()
            items = []
            for _ in range(min(batch, attempts - done)):
                name, task_id = rng.choice(tasks)
                run = runs[done * len(runs) // attempts]
                env = rng.choices(synthetic.ENVIRONMENTS, weights=(70, 25, 5))[0]
                parents = last[task_id]
                parent = parents[rng.randrange(len(parents))] if parents and rng.random() < 0.8 else None
                item = synthetic.attempt(rng, run, seq[run], task_id, name, done, environment=env, parent_id=parent)
                known = codes.setdefault((task_id, env["gpu"] or "cpu"), [])
                if known and rng.random() < 0.05:
                    item = replace(item, code=rng.choice(known))  # a repeat: stored as a reuse row
                elif rng.random() < 0.01:
                    known.append(item.code)
                items.append(item)
                seq[run] += 1
                done += 1
            generate += time.perf_counter() - started
            started = time.perf_counter()
            for item in items:  # the loop hashes each proposal for its lookup before evaluating it
                code_hash(item.code)
            hashing += time.perf_counter() - started
            started = time.perf_counter()
            ids = archive.record_attempts(items)
            record += time.perf_counter() - started
            for item, attempt_id in zip(items, ids):
                window = last[item.task_id]
                window.append(attempt_id)
                del window[:-200]
        probe = archive.best()[0]
        sample = {"task_name": probe.task, "task_id": probe.task_id, "attempt": probe.attempt_id, "gpu": probe.gpu,
                  "deep": max(max(ids) for ids in last.values() if ids)}
    return {"generate": generate, "hash": hashing, "record": record}, sample


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000, help="attempts per transaction")
    parser.add_argument("--repeat", type=int, default=9, help="calls per read latency (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", type=Path, help="where to build the archive (default: a temporary folder)")
    args = parser.parse_args()

    folder = None if args.db else tempfile.TemporaryDirectory(prefix="kernforge-bench-")
    path = args.db or Path(folder.name) / "bench.db"
    spent, s = fill(path, args.attempts, args.batch, args.seed)
    record = spent["record"]
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))

    with Archive.open(path, readonly=True) as archive:
        n_shapes = archive.conn.execute("SELECT count(*) FROM measurements").fetchone()[0]
        lookup_code = archive.get_attempt(s["attempt"]).code
        reads = {
            "best (all tasks x GPUs)": lambda: archive.best(),
            "best --task --gpu": lambda: archive.best(task=s["task_name"], gpu=s["gpu"]),
            "best --shapes (one task)": lambda: archive.best_per_shape(task=s["task_name"]),
            "stats": lambda: archive.stats(),
            "lookup (content hash)": lambda: archive.lookup(s["task_id"], lookup_code, archive.get_attempt(s["attempt"]).env_key),
            "population (8/4/4/4)": lambda: archive.population(s["task_id"], s["gpu"]),
            "lineage (newest attempt)": lambda: archive.lineage(s["deep"]),
            "show (get_attempt)": lambda: archive.get_attempt(s["attempt"]),
        }
        latencies = {name: median_ms(fn, args.repeat) for name, fn in reads.items()}
    if folder:
        folder.cleanup()

    table = Table(title=f"archive bench: {args.attempts:,} attempts, {n_shapes:,} shape rows, batch {args.batch}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("insert rate (record_attempts)", f"{args.attempts / record:,.0f} attempts/s")
    table.add_row("  shape rows / s", f"{n_shapes / record:,.0f}")
    table.add_row("  normalise + hash code (ast)", f"{spent['hash'] / args.attempts * 1e3:,.2f} ms/attempt")
    table.add_row("  seconds recording / hashing / generating",
                  f"{record:,.0f} / {spent['hash']:,.0f} / {spent['generate']:,.0f}")
    table.add_row("file size (db + wal)", f"{size / 2**20:,.1f} MiB ({size / args.attempts:,.0f} B/attempt)")
    for name, ms in latencies.items():
        flag = "  (target <= 50 ms)" if name.startswith("best (all") else ""
        table.add_row(f"{name}, median of {args.repeat}", f"{ms:,.2f} ms{flag}")
    Console().print(table)


if __name__ == "__main__":
    main()
