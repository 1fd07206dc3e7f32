"""Cross-check the verifier's device time against Nsight Compute's gpu__time_duration.

    python bench/ncu_check.py --task rms_norm          # needs ncu on PATH and a GPU

The outer run times the task's seed at its largest public shape with the verifier's own timing
code (CUDA-graph replay, L2 flushed between calls), then runs itself under ncu, which replays
each launch of the seed's kernel with caches flushed (--cache-control all) and reports its
duration; the table compares the two medians (target: within 3%).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import shutil
import statistics
import subprocess
import sys

import torch

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier import timing
from kernforge.verifier.kernels import own_kernel_names


def _setup(task_name: str):
    task = load_task(task_name)
    shape = runtime.largest_shape(task, "cuda")
    seed = runtime.load_module(task.seed_path)
    model = runtime.build_model(seed.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda")
    inputs = runtime.make_inputs(task, shape, task.distributions[0], 1, "cuda")
    return task, shape, model, inputs


def inner(task_name: str, calls: int) -> None:
    task, shape, model, inputs = _setup(task_name)
    for _ in range(calls):
        model(*inputs)
    torch.cuda.synchronize()


def outer(task_name: str, calls: int) -> None:
    task, shape, model, inputs = _setup(task_name)
    l2 = timing.L2Control(torch.device("cuda"))
    timed, _ = timing.time_on_gpu(model, [inputs], task.mutated_inputs, 200, l2, random.Random(0))
    ours = statistics.median(timed.times_us)
    kernels = own_kernel_names(task.seed_source)
    ncu = shutil.which("ncu")
    if ncu is None:
        sys.exit("ncu is not on PATH")
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--metrics", "gpu__time_duration.sum",
           "--csv", "-k", f"regex:{'|'.join(kernels)}", sys.executable, __file__, "--task", task_name,
           "--calls", str(calls), "--inner"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if len(r) > 5]
    header, data = rows[0], rows[1:]
    value, unit = header.index("Metric Value"), header.index("Metric Unit")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    durations = [float(r[value].replace(",", "")) * scale[r[unit].strip()] for r in data]
    if not durations:
        sys.exit(f"ncu measured nothing:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    theirs = statistics.median(durations)
    print(f"task {task_name} shape {shape.label} kernels {kernels}")
    print(f"| measure | median us |\n|---|---|\n| kernforge (graph replay, L2 flushed) | {ours:.2f} |\n"
          f"| ncu gpu__time_duration (cache flushed) | {theirs:.2f} |\n| difference | {100 * (ours - theirs) / theirs:+.2f}% |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="rms_norm")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--inner", action="store_true")
    args = parser.parse_args()
    (inner if args.inner else outer)(args.task, args.calls)
