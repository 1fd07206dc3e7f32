"""Where does run-to-run timing spread come from? Times one task's seed with verifier.timing
directly, in several fresh processes and several times per process, under a few settings.

    python bench/timing_probe.py --task rms_norm --processes 3 --runs 3

Each row is one time_on_gpu call (3 input sets, graph replay, L2 flush): its median, its own
interquartile spread, and the SM clock read before it. The summary compares the spread within
a process with the spread between processes: if only the second is large, something fixed per
process (allocation placement, compiled configuration) moves the time; if both are, the clock
or the machine does.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

SETTINGS = {  # name: (reps, spin seconds, gate before each replay)
    "default": (100, 0.1, True),
    "nogate": (100, 0.1, False),
    "reps300": (300, 0.1, True),
    "spin1s": (100, 1.0, True),
}


def child(task_name: str, runs: int) -> None:
    import torch

    from kernforge.tasks import runtime
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import timing

    task = load_task(task_name)
    shape = runtime.largest_shape(task, "cuda")
    seed_module = runtime.load_module(task.seed_path, fresh=True)
    model = runtime.build_model(seed_module.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda:0")
    sets = [runtime.make_inputs(task, shape, task.distributions[0], s, "cuda:0") for s in (1, 2, 3)]
    l2 = timing.L2Control(torch.device("cuda:0"))
    spin_, gate_ = timing.L2Control.spin, timing.L2Control.gate
    for name, (reps, spin, gate) in SETTINGS.items():
        for run in range(runs):
            clock = _sm_clock()
            timing.L2Control.spin = lambda self, seconds=spin: spin_(self, spin)  # type: ignore[method-assign]
            timing.L2Control.gate = gate_ if gate else (lambda self, seconds=0.0: None)  # type: ignore[method-assign]
            try:
                timed, _ = timing.time_on_gpu(model, sets, task.mutated_inputs, reps, l2, random.Random(run))
            finally:
                timing.L2Control.spin, timing.L2Control.gate = spin_, gate_  # type: ignore[method-assign]
            s = timed.summary()
            t = sorted(timed.times_us)
            print(json.dumps({"setting": name, "run": run, "mode": s["mode"], "median_us": s["median_us"], "iqr_pct": s["spread_pct"],
                              "min_us": t[0], "p90_us": t[int(0.9 * (len(t) - 1))], "sm_mhz_before": clock,
                              "shape": shape.label}), flush=True)


def _sm_clock() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="rms_norm")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.task, args.runs)
        return
    rows = []
    for p in range(args.processes):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--child", "--task", args.task, "--runs", str(args.runs)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"process {p} failed:\n{out.stderr[-3000:]}")
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                rows.append({"process": p, **json.loads(line)})
        print(f"process {p}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(f"{'setting':8} {'proc':>4} {'run':>3} {'median us':>10} {'IQR %':>6} {'min us':>8} {'p90 us':>8} {'SM MHz':>6}")
    for r in rows:
        print(f"{r['setting']:8} {r['process']:>4} {r['run']:>3} {r['median_us']:>10.2f} {r['iqr_pct']:>6.2f} {r['min_us']:>8.2f} "
              f"{r['p90_us']:>8.2f} {r['sm_mhz_before'] or '-':>6}")
    print()
    print(f"{'setting':8} {'within-process spread %':>24} {'between-process spread %':>25}")
    for name in SETTINGS:
        mine = [r for r in rows if r["setting"] == name]
        within = [_spread([r["median_us"] for r in mine if r["process"] == p]) for p in range(args.processes)]
        per_proc = [statistics.fmean(r["median_us"] for r in mine if r["process"] == p) for p in range(args.processes)]
        print(f"{name:8} {max(within):>24.2f} {_spread(per_proc):>25.2f}")


def _spread(values: list[float]) -> float:
    return 100.0 * (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else 0.0


if __name__ == "__main__":
    main()
