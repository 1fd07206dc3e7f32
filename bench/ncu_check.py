"""The judge's trusted time of record against two yardsticks: the old per-call CUDA-graph time
measured inside one process, and Nsight Compute's gpu__time_duration.

    python bench/ncu_check.py --tasks rms_norm silu_and_mul softmax     # GPU; ncu on PATH

For each task's seed at its largest public shape: (1) a verdict from the judge (time of record:
the reference worker's clock over batches of calls, each on inputs of its own); (2) the old way,
each call replayed alone from a graph with the L2 flushed (bench/graph_timer.py); (3) ncu, which
replays each launch of the seed's kernels with caches flushed (--cache-control all, clocks left
alone). Targets: (1) within 5% of (2) and of (3).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graph_timer import per_call_graph_us  # noqa: E402

from kernforge.tasks import runtime  # noqa: E402
from kernforge.tasks.loader import load_task  # noqa: E402
from kernforge.verifier.kernels import own_kernel_names  # noqa: E402


def _setup(task_name: str, sets: int = 3):
    task = load_task(task_name)
    shape = runtime.largest_shape(task, "cuda")
    seed = runtime.load_module(task.seed_path)
    model = runtime.build_model(seed.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda")
    inputs = [runtime.make_inputs(task, shape, task.distributions[0], k + 1, "cuda") for k in range(sets)]
    return task, shape, model, inputs


def inner(task_name: str, calls: int) -> None:
    task, shape, model, inputs = _setup(task_name, 1)
    for _ in range(calls):
        model(*inputs[0])
    torch.cuda.synchronize()


def ncu_us(task_name: str, calls: int) -> tuple[float | None, str]:
    task = load_task(task_name)
    kernels = own_kernel_names(task.seed_source)
    ncu = shutil.which("ncu")
    if ncu is None:
        return None, "ncu is not on PATH"
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--metrics", "gpu__time_duration.sum",
           "--csv", "-k", f"regex:{'|'.join(kernels)}", sys.executable, __file__, "--tasks", task_name,
           "--calls", str(calls), "--inner"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if len(r) > 5]
    if not rows:
        return None, (proc.stderr or proc.stdout)[-500:]
    header, data = rows[0], rows[1:]
    value, unit = header.index("Metric Value"), header.index("Metric Unit")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    per_launch = [float(r[value].replace(",", "")) * scale[r[unit].strip()] for r in data]
    # several kernels per call: add them up per call (launches come in call order)
    per_call = len(per_launch) // calls if calls and len(per_launch) >= calls else 1
    sums = [sum(per_launch[i:i + per_call]) for i in range(0, per_call * calls, per_call)] or per_launch
    return statistics.median(sums), ""


def outer(names: list[str], calls: int) -> None:
    from kernforge.loop.evaluate import open_judge
    from kernforge.verifier.judge import JudgeOptions

    rows = []
    for repeat in range(2):  # two verdicts each: the spread between them is the noise of the figure
        options = JudgeOptions(device="cuda:0", time_shapes="largest", baselines=False,
                               cache_dir=Path(tempfile.mkdtemp(prefix="kf-ncu-cache-")))
        with open_judge("cuda:0", pool_size=1, options=options) as judge:
            for name in names:
                task = load_task(name)
                verdict = judge.verify(task.seed_source, task)
                s = verdict.shapes[0] if verdict.shapes else None
                rows.append({"task": name, "repeat": repeat, "shape": s.label if s else "-", "status": verdict.status.value,
                             "trusted": s.time_us if verdict.accepted else None, "calls": s.batch_calls if s else None,
                             "short": s.short_calls if s else None, "single": s.single_us if s else None,
                             "fixed_us": s.fixed_us if s else None, "method": s.method if s else None,
                             "spread": s.spread_pct if s else None})
                print(f"{name} (verdict {repeat + 1}): {verdict.status.value}: {verdict.reason[:300]}; {rows[-1]}; calibration "
                      f"{verdict.environment.get('calibration')}", flush=True)
    yardsticks = {}
    for name in names:
        task, shape, model, inputs = _setup(name)
        old = per_call_graph_us(model, inputs)
        del model, inputs
        torch.cuda.empty_cache()
        yardsticks[name] = (old, ncu_us(name, calls)[0])

    def pct(a, b):
        return f"{100 * (a - b) / b:+.2f}%" if a and b else "-"

    print("| task | shape | verdict | trusted us (batches of N, n) | method | single-batch us | fixed us | old per-call graph us | "
          "ncu us | trusted vs old | trusted vs ncu |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        old, ncu = yardsticks[r["task"]]
        trusted, single, fixed = r["trusted"], r["single"], r["fixed_us"]
        print(f"| {r['task']} | {r['shape']} | {r['repeat'] + 1} | {trusted and f'{trusted:.2f}'} ({r['calls']}, {r['short']}) | "
              f"{r['method']} | {single and f'{single:.2f}'} | {fixed and f'{fixed:.0f}'} | {old:.2f} | {ncu and f'{ncu:.2f}'} | "
              f"{pct(trusted, old)} | {pct(trusted, ncu)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["rms_norm"])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--inner", action="store_true")
    args = parser.parse_args()
    if args.inner:
        inner(args.tasks[0], args.calls)
    else:
        outer(args.tasks, args.calls)
