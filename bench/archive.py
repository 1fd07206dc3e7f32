"""Archive benchmark: fill a fresh archive with synthetic attempts, then time the common reads.

    python bench/archive.py                   # 1,000,000 attempts (minutes)
    python bench/archive.py --attempts 20000  # a quick run

Attempts come from ``kernforge.archive.synthetic``: 6 tasks, 4 proposers/models, 3 environments
(H200, A100, interpreter), the verdict mix an LLM loop sees, 2-8 shapes each, a parent for most
and ~5% repeated code (reuse rows). They are written through the library (``record_attempts``,
one transaction per batch, FTS triggers and all), so the insert rate is the archive's own.
``--writers N`` fills with N processes at once (each its own runs), as N GPU workers would; each
waits for the others' write transactions (BEGIN IMMEDIATE, busy timeout). As a run does, each
writer audits every attempt that beats its best score so far on that task and GPU (one audit in
ten fails), one transaction per audit, so ``best`` has audited winners to find. Read latencies are
medians over ``--repeat`` calls on a fresh read-only ``Archive``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from kernforge.archive import synthetic
from kernforge.archive.content import code_hash
from kernforge.archive.score import summarize
from kernforge.archive.store import Archive, gpu_label


def write(path: Path, attempts: int, batch: int, seed: int) -> dict[str, float]:
    """One writer process: generate, hash and record ``attempts``; seconds spent on each."""
    rng = random.Random(seed)
    spent = {"generate": 0.0, "hash": 0.0, "record": 0.0, "audit": 0.0}
    best: dict[tuple[int, str], float] = {}
    with Archive.open(path) as archive:
        tasks = [(name, archive.register_task(synthetic.task_record(name))) for name in synthetic.TASKS]
        runs = [archive.start_run({"bench": seed, "part": i}) for i in range(max(1, attempts // 100_000))]
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
                salt = seed * 10_000_000 + done
                item = synthetic.attempt(rng, run, seq[run], task_id, name, salt, environment=env, parent_id=parent)
                known = codes.setdefault((task_id, env["gpu"] or "cpu"), [])
                if known and rng.random() < 0.05:
                    item = replace(item, code=rng.choice(known))  # a repeat: stored as a reuse row
                elif rng.random() < 0.01:
                    known.append(item.code)
                items.append(item)
                seq[run] += 1
                done += 1
            spent["generate"] += time.perf_counter() - started
            started = time.perf_counter()
            for item in items:  # the loop hashes each proposal for its lookup before evaluating it
                code_hash(item.code)
            spent["hash"] += time.perf_counter() - started
            started = time.perf_counter()
            ids = archive.record_attempts(items)
            spent["record"] += time.perf_counter() - started
            started = time.perf_counter()
            for item, attempt_id in zip(items, ids):
                score = summarize(item.verdict.shapes)["score"] if item.verdict.accepted else None
                key = (item.task_id, gpu_label(item.environment))
                if score is not None and score > best.get(key, 0.0) and archive.get_attempt(attempt_id).reuse_of is None:
                    audit = synthetic.audit(item.verdict, ratio=1.5 if rng.random() < 0.1 else 1.02)
                    archive.record_audit(attempt_id, audit, run_id=item.run_id)
                    if audit.passed:
                        best[key] = score
            spent["audit"] += time.perf_counter() - started
            for item, attempt_id in zip(items, ids):
                window = last[item.task_id]
                window.append(attempt_id)
                del window[:-200]
    return spent


def fill(path: Path, attempts: int, batch: int, seed: int, writers: int) -> tuple[float, list[dict[str, float]]]:
    """A fresh archive filled by ``writers`` processes at once (as several GPU workers would):
    (wall seconds, each writer's seconds spent generating, hashing and recording)."""
    Archive.create(path, exist_ok=False).close()
    shares = [attempts // writers + (i < attempts % writers) for i in range(writers)]
    started = time.perf_counter()
    if writers == 1:
        spent = [write(path, attempts, batch, seed)]
    else:
        with ProcessPoolExecutor(writers) as pool:
            spent = list(pool.map(write, [path] * writers, shares, [batch] * writers,
                                  [seed * 100 + i for i in range(writers)]))
    return time.perf_counter() - started, spent


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
    parser.add_argument("--writers", type=int, default=1, help="writer processes filling the archive at once")
    parser.add_argument("--db", type=Path, help="where to build the archive (default: a temporary folder)")
    args = parser.parse_args()

    folder = None if args.db else tempfile.TemporaryDirectory(prefix="kernforge-bench-")
    path = args.db or Path(folder.name) / "bench.db"
    wall, spent = fill(path, args.attempts, args.batch, args.seed, args.writers)
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))

    with Archive.open(path, readonly=True) as archive:
        n_shapes = archive.conn.execute("SELECT count(*) FROM measurements").fetchone()[0]
        deep = archive.conn.execute("SELECT max(id) FROM attempts").fetchone()[0]
        n_audits = archive.conn.execute("SELECT count(*) FROM audits").fetchone()[0]
        probe = archive.best()[0]
        code, env_key = archive.get_attempt(probe.attempt_id).code, archive.get_attempt(probe.attempt_id).env_key
        reads = {
            "best (all tasks x GPUs)": lambda: archive.best(),
            "best --task --gpu": lambda: archive.best(task=probe.task, gpu=probe.gpu),
            "best --shapes (one task)": lambda: archive.best_per_shape(task=probe.task),
            "awaiting audit": lambda: archive.awaiting_audit(),
            "show's audits": lambda: archive.audits(probe.attempt_id),
            "stats": lambda: archive.stats(),
            "lookup (content hash)": lambda: archive.lookup(probe.task_id, code, env_key),
            "population (8/4/4/4)": lambda: archive.population(probe.task_id, probe.gpu),
            "lineage (newest attempt)": lambda: archive.lineage(deep),
            "show (get_attempt)": lambda: archive.get_attempt(probe.attempt_id),
        }
        latencies = {name: median_ms(fn, args.repeat) for name, fn in reads.items()}
    if folder:
        folder.cleanup()

    table = Table(title=f"archive bench: {args.attempts:,} attempts, {n_shapes:,} shape rows, batch {args.batch}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    record = max(w["record"] for w in spent)
    per_writer = args.attempts / len(spent)
    table.add_row(f"fill rate, {len(spent)} writer process(es), wall", f"{args.attempts / wall:,.0f} attempts/s")
    table.add_row("record_attempts rate per writer", f"{per_writer / record:,.0f} attempts/s")
    table.add_row("  shape rows / s per writer", f"{n_shapes / len(spent) / record:,.0f}")
    table.add_row("  normalise + hash code (ast)", f"{sum(w['hash'] for w in spent) / args.attempts * 1e3:,.2f} ms/attempt")
    table.add_row("  wall s: total / recording / hashing / generating (slowest writer)",
                  f"{wall:,.0f} / {record:,.0f} / {max(w['hash'] for w in spent):,.0f}"
                  f" / {max(w['generate'] for w in spent):,.0f}")
    table.add_row("audits of would-be bests (one transaction each)",
                  f"{n_audits:,}, {sum(w['audit'] for w in spent) / max(n_audits, 1) * 1e3:,.2f} ms each")
    table.add_row("file size (db + wal)", f"{size / 2**20:,.1f} MiB ({size / args.attempts:,.0f} B/attempt)")
    for name, ms in latencies.items():
        flag = "  (target <= 50 ms)" if name.startswith("best (all") else ""
        table.add_row(f"{name}, median of {args.repeat}", f"{ms:,.2f} ms{flag}")
    Console().print(table)


if __name__ == "__main__":
    main()
