"""Verifier benchmark: per built-in task at its largest public shape, the seed's time against
PyTorch eager and torch.compile, % of copy bandwidth, the spread of repeated evaluations and
the time to a verdict.

    python bench/verify.py                         # every built-in task, GPU 0
    python bench/verify.py --tasks rms_norm silu_and_mul --repeats 5 --json out.json
    python bench/verify.py --shapes public        # a routine verdict: every public shape timed
    python bench/verify.py --shapes public --batches 3   # three timed windows of each kind, as an audit times

The first evaluation of a task measures (and caches) the baselines; the repeats run with the
baselines cached, which is the steady state of a run. Spread: (max - min) / mean of the seed's
median time over the repeats (target <= 1%). Time to verdict: median over the repeats (target
<= 5 s for elementwise tasks), each starting on a warm worker; the JSON rows add every
verdict's time and the median time per step (environment.phase_seconds), and a second table
lists each task's slowest steps. Checks still cover every public and hidden shape and input
distribution; only the timing is restricted to the largest public shape (``--shapes largest``,
the default) or to the public ones, as in a run's routine verdict (``--shapes public``; the
table's figures are then those of the largest of them). ``--batches``: the timed windows per
shape of each kind, long and short (JudgeOptions.batches): fewer make a verdict shorter and its
time of record noisier, and the spread over the repeats says by how much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernforge.loop.evaluate import open_judge, resolve_device
from kernforge.tasks.loader import builtin_names, load_task
from kernforge.verifier.judge import JudgeError, JudgeOptions


def bench_task(judge, name: str, repeats: int, memory: bool = False) -> dict:
    task = load_task(name)
    row: dict = {"task": name}
    times, verdict_seconds, inner, phases, claimed = [], [], [], [], []
    per_shape: dict[str, list[float]] = {}
    methods: dict[str, list[str]] = {}
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        try:
            verdict = judge.verify(task.seed_source, task)
        except JudgeError as error:  # the judge or the reference failed, not the seed: the next task still runs
            row.update(error=f"judge error: {error}"[:300])
            return row
        elapsed = time.perf_counter() - t0
        if memory:
            gib = {k.removesuffix("_bytes"): round(v / (1 << 30), 2) for k, v in judge.device_memory().items()}
            Console().print(f"after {name} verdict {i}: {verdict.status.value}; GiB {gib}")
        if not verdict.accepted:
            row.update(error=f"{verdict.status.value}: {verdict.reason}"[:300],
                       evidence=str(getattr(verdict, "evidence", ""))[-3000:])
            return row
        shape = max(verdict.shapes, key=lambda s: s.floor_us or 0.0)  # the largest timed shape
        if i == 0:  # measures and caches the baselines
            row.update(first_phase_seconds=verdict.environment.get("phase_seconds", {}))  # the baselines' compiles among them
            row.update(shape=shape.label, first_verdict_s=elapsed, eager_us=shape.eager_us, compile_us=shape.compile_us,
                       pct_bandwidth=shape.pct_bandwidth, floor_us=shape.floor_us, timing=shape.timing,
                       batch_calls=shape.batch_calls, flags=list(verdict.flags))
            continue
        times.append(shape.time_us)
        for s in verdict.shapes:  # every timed shape's time of record, for the spread at each
            if s.time_us is not None and not s.hidden:
                label = " ".join(f"{k}={v}" for k, v in s.shape.items())
                per_shape.setdefault(label, []).append(round(s.time_us, 3))
                # "difference, bounded" for an honest seed: the guard bound, its record above its slope (clock.per_call)
                methods.setdefault(label, []).append(f"{s.method} {s.batch_calls}/{s.short_calls or 0} calls, fixed "
                                                     f"{s.fixed_us if s.fixed_us is None else round(s.fixed_us)} us, pairs "
                                                     f"{s.spread_pct if s.spread_pct is None else round(s.spread_pct, 1)}% apart")
        claimed.append(shape.claimed_us)
        verdict_seconds.append(elapsed)
        inner.append(shape.spread_pct)
        phases.append(verdict.environment.get("phase_seconds", {}))
    mean = statistics.fmean(times)
    row.update(
        seed_us=statistics.median(times),
        spread_pct=100 * (max(times) - min(times)) / mean,
        verdict_s=statistics.median(verdict_seconds),
        claimed_us=statistics.median(c for c in claimed if c is not None) if any(c is not None for c in claimed) else None,
        speedup_eager=row["eager_us"] / statistics.median(times) if row.get("eager_us") else None,
        speedup_compile=row["compile_us"] / statistics.median(times) if row.get("compile_us") else None,
        times_us=times,
        inner_spread_pct=inner,
        # per step, the median over the repeats (the steps of one verdict need not add up to it)
        phase_seconds={k: round(statistics.median(p.get(k, 0.0) for p in phases), 3)
                       for k in sorted({k for p in phases for k in p}, key=lambda k: -max(p.get(k, 0.0) for p in phases))},
        verdicts_s=[round(v, 3) for v in verdict_seconds],
        shapes_us=per_shape,
        shapes_method=methods,
        shapes_spread_pct={k: round(100 * (max(v) - min(v)) / statistics.fmean(v), 2) for k, v in per_shape.items()},
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=None, help="built-in task names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--shapes", choices=("largest", "public"), default="largest",
                        help="time the largest public shape, or every public shape as a run's routine verdict does")
    parser.add_argument("--batches", type=int, default=JudgeOptions.batches,
                        help=f"timed windows per shape of each kind, long and short (default {JudgeOptions.batches})")
    parser.add_argument("--window-ms", type=float, default=JudgeOptions.batch_window_ms,
                        help=f"a long timed batch's length at the roofline floor (default {JudgeOptions.batch_window_ms:g} ms)")
    parser.add_argument("--max-calls", type=int, default=JudgeOptions.max_batch_calls,
                        help=f"most calls in a long timed batch (default {JudgeOptions.max_batch_calls})")
    parser.add_argument("--min-call-us", type=float, default=JudgeOptions.min_call_us,
                        help=f"the shortest a call is assumed to take when a batch is sized (default {JudgeOptions.min_call_us:g} us)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the judge's cache (baselines), to share between invocations (default: a fresh one)")
    parser.add_argument("--memory", action="store_true", help="after every verdict, print where the GPU's memory is (free, the reference worker's, its arena)")
    parser.add_argument("--serial-checks", action="store_true",
                        help="checked calls one process at a time: the candidate's next call waits for the last one's compare")
    args = parser.parse_args()

    device = resolve_device(args.gpu)
    names = args.tasks or builtin_names()
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    if args.window_ms <= 0:
        parser.error("--window-ms must be positive")
    if args.max_calls < 1 or args.min_call_us <= 0:
        parser.error("--max-calls must be at least 1 and --min-call-us positive")
    options = JudgeOptions(time_shapes="largest" if args.shapes == "largest" else "all", batches=args.batches,
                           batch_window_ms=args.window_ms, overlap_checks=not args.serial_checks,
                           max_batch_calls=args.max_calls, min_call_us=args.min_call_us,
                           cache_dir=args.cache_dir or Path(tempfile.mkdtemp(prefix="kf-bench-cache-")))
    rows = []
    console = Console()
    # Three warm workers: each verdict starts on one that is ready, as in a run with a pool
    # (a worker's cold start is bench/sandbox.py's figure, not part of a verdict).
    with open_judge(device, pool_size=3, options=options) as judge:
        ceilings = judge.ceilings()
        console.print(f"device {device}: {judge.environment().get('gpu')}; measured ceilings {ceilings}")
        for name in names:
            row = bench_task(judge, name, args.repeats, args.memory)
            rows.append(row)
            console.print(f"{name}: {json.dumps(row, default=str)}")

    table = Table(title=f"Seeds at their largest public shape on {device} (median over {args.repeats} evaluations, "
                        f"{args.batches} timed windows of each kind per shape, {args.window_ms:g} ms long batches, "
                        f"at most {args.max_calls} calls, {args.min_call_us:g} us a call at least)")
    for col in ("task", "shape", "seed us", "eager us", "compile us", "x eager", "x compile", "% BW",
                "spread %", "verdict s", "first s"):
        table.add_column(col, justify="left" if col in ("task", "shape") else "right")

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        if "error" in r:
            table.add_row(r["task"], "rejected", r["error"][:60], *["-"] * 8)
            continue
        table.add_row(r["task"], r["shape"], f(r["seed_us"], ".1f"), f(r["eager_us"], ".1f"), f(r["compile_us"], ".1f"),
                      f(r["speedup_eager"], ".2f"), f(r["speedup_compile"], ".2f"), f(r["pct_bandwidth"], ".0f"),
                      f(r["spread_pct"], ".2f"), f(r["verdict_s"], ".1f"), f(r["first_verdict_s"], ".1f"))
    console.print(table)
    steps = Table(title="Where a warm verdict's time goes (median seconds per step; steps nest, so they need not add up)")
    steps.add_column("task")
    steps.add_column("verdict s", justify="right")
    steps.add_column("slowest steps")
    for r in rows:
        if "phase_seconds" in r:
            top = [f"{k} {v:.2f}" for k, v in list(r["phase_seconds"].items())[:8]]
            steps.add_row(r["task"], f(r["verdict_s"], ".2f"), ", ".join(top))
    console.print(steps)
    if args.json:
        args.json.write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
