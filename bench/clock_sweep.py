"""Where the trusted batch clock's excess comes from: per task and public shape, the window of
a timed batch against its number of calls (GPU).

    python bench/clock_sweep.py --tasks rms_norm silu_and_mul softmax --windows 1 2.5 5 10 20
    python bench/clock_sweep.py --tasks fp8_quant_per_group --windows 1 2.5 5 10 20 --max-calls 4096

Each seed is judged once per batch window (so batches of different sizes M), every public shape
timed. A batch's window less its write is W(M) = a + b*M: b is the cost of one more call, a the
fixed cost per batch. The table sets b and the time of record beside the old per-call
CUDA-graph time (bench/graph_timer.py, one process): if b matches the old time, the excess is a
fixed cost per batch, which a difference of two batch sizes takes off exactly; if b itself is
above it, the excess grows with the calls (their bytes) and no batch size removes it. Each row
also lists the time of record at every batch size and how it was reached: at the launch-bound
shapes (a few us a call, 512 calls at most by default) the fixed cost is over a tenth of the
window, the record is the long batch's own figure less 10% ("bounded", defences/clock.per_call)
and the in-process baselines are not (verifier/timing.time_batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graph_timer import per_call_graph_us  # noqa: E402

from kernforge.loop.evaluate import open_judge  # noqa: E402
from kernforge.tasks import runtime  # noqa: E402
from kernforge.tasks.loader import load_task  # noqa: E402
from kernforge.verifier.judge import JudgeOptions  # noqa: E402


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares W = a + b*M over (M, W ms); (a ms, b us)."""
    n = len(points)
    mx = sum(m for m, _ in points) / n
    my = sum(w for _, w in points) / n
    sxx = sum((m - mx) ** 2 for m, _ in points)
    if sxx == 0:
        return float("nan"), float("nan")
    b = sum((m - mx) * (w - my) for m, w in points) / sxx
    return my - b * mx, b * 1e3


def old_time(task_name: str, params: dict) -> float:
    task = load_task(task_name)
    shape = next(s for s in task.shapes("cuda", hidden=False) if s.as_dict() == params)
    seed = runtime.load_module(task.seed_path)
    model = runtime.build_model(seed.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda")
    inputs = [runtime.make_inputs(task, shape, task.distributions[0], k + 1, "cuda") for k in range(3)]
    us = per_call_graph_us(model, inputs)
    del model, inputs
    torch.cuda.empty_cache()
    return us


def sweep(judge, name: str, windows: list[float], rows: list[dict]) -> None:
    task = load_task(name)
    for w in windows:
        judge.options = replace(judge.options, batch_window_ms=w)  # a bench's knob; the judge reads it per verdict
        t0 = time.perf_counter()
        verdict = judge.verify(task.seed_source, task)
        seconds = time.perf_counter() - t0
        if not verdict.accepted:
            print(f"{name} window {w}: {verdict.status.value}: {verdict.reason[:300]}", flush=True)
            continue
        for s in verdict.shapes:
            m = s.batch_calls
            # the long batch's own window less its write: its plain figure (less the calibrated cost) times
            # its calls, the cost added back (the time of record is the difference's, not this window's)
            window = (s.single_us if s.single_us is not None else s.time_us) * m / 1e3 + (s.clock_cost_us or 0.0) / 1e3
            rows.append({"task": name, "shape": s.shape, "label": s.label, "window_ms": w, "calls": m, "time_us": s.time_us,
                         "method": s.method, "fixed_us": s.fixed_us, "single_us": s.single_us,
                         "claimed_us": s.claimed_us, "clock_cost_us": s.clock_cost_us, "spread_pct": s.spread_pct,
                         "window_less_write_ms": window, "verdict_s": seconds})
        print(f"{name} window {w}: {[(r['label'], r['calls'], round(r['time_us'], 2)) for r in rows if r['task'] == name and r['window_ms'] == w]}"
              f" in {seconds:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["rms_norm", "silu_and_mul", "softmax"])
    parser.add_argument("--windows", nargs="+", type=float, default=[1.0, 2.5, 5.0, 10.0, 20.0])
    parser.add_argument("--max-calls", type=int, default=4096, help="most calls in a long batch (the judge's default: 512)")
    parser.add_argument("--min-call-us", type=float, default=JudgeOptions.min_call_us,
                        help="the shortest a call is assumed to take when a batch is sized")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    cache = Path(tempfile.mkdtemp(prefix="kf-sweep-"))
    options = JudgeOptions(device="cuda:0", time_hidden="never", baselines=False, max_batch_calls=args.max_calls,
                           min_call_us=args.min_call_us, cache_dir=cache)
    with open_judge("cuda:0", pool_size=1, options=options) as judge:
        for name in args.tasks:
            sweep(judge, name, args.windows, rows)
    print("| task | shape | M range | a: fixed ms | b: us per call | old per-call graph us | b vs old | record at 5 ms vs old | "
          "records by M (us, method) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in dict.fromkeys((r["task"], r["label"]) for r in rows):
        mine = [r for r in rows if (r["task"], r["label"]) == key]
        a, b = fit([(r["calls"], r["window_less_write_ms"]) for r in mine])
        old = old_time(key[0], mine[0]["shape"])
        at5 = [r["time_us"] for r in mine if r["window_ms"] == 5.0]
        for r in mine:
            r.update(fit_a_ms=a, fit_b_us=b, old_us=old)
        ms = sorted({r["calls"] for r in mine})
        records = ", ".join(f"{r['calls']}: {r['time_us']:.2f} {'bounded' if 'bounded' in (r['method'] or '') else r['method']}"
                            for r in mine)
        print(f"| {key[0]} | {key[1]} | {ms[0]}-{ms[-1]} | {a:.3f} | {b:.2f} | {old:.2f} | {100 * (b - old) / old:+.1f}% | "
              f"{(100 * (statistics.median(at5) - old) / old) if at5 else float('nan'):+.1f}% | {records} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
