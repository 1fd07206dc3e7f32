"""What a checked call costs the candidate's worker besides its own kernels (issue #17): the
task's seed at its smallest public shape (where that cost weighs most), called again and again,
each way as harness._check wraps it. Per call, ms:

  bare        the call and a device sync
  recording   inside trace.recording (the dispatch mode counting torch ops and Triton launches)
  census      inside trace.dispatched: the profiler's op count and, on a GPU, its CUDA kernels
  both        the two nested, as a checked call runs
  of which    of ``census``: the profiler block alone, and the reading of its events
  block/read  (prof.events())

    python bench/census_probe.py --device cuda:0 --task rms_norm --task silu_and_mul

On the CPU (``--reference``: the task's reference, not its Triton seed) it runs for the tests;
its times there say nothing about a GPU's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier import trace

MODES = ("bare", "recording", "census", "both", "block", "read")


def _seed_model(task: Any, device: str) -> Any:
    """The task's seed ModelNew, imported from a file (Triton reads its kernels' source there)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(task.seed_source)
    spec = importlib.util.spec_from_file_location("census_probe_seed", f.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


def _per_call_ms(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(task_name: str, device: str, reps: int = 20, reference: bool = False) -> dict[str, Any]:
    """One row: per call ms of each of ``MODES`` for ``task_name`` at its smallest public shape."""
    from torch.profiler import ProfilerActivity, profile

    task = load_task(task_name)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    shape = min(task.shapes(kind, hidden=False), key=lambda s: sum(int(v) for _, v in s.params if isinstance(v, int)))
    cls = runtime.reference_module(task).Model if reference or task.seed_source is None else _seed_model(task, device)
    model = runtime.build_model(cls, runtime.make_init_inputs(task, shape), 1, device)
    inputs = runtime.make_inputs(task, shape, task.distributions[0], 1, device)
    on_gpu = kind == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])

    def bare() -> None:
        model(*inputs)
        sync()

    def recording() -> None:
        with trace.recording():
            bare()

    def census() -> None:
        with trace.dispatched(cuda=on_gpu):
            bare()

    def both() -> None:
        with trace.recording(), trace.dispatched(cuda=on_gpu):
            bare()

    held: list[Any] = []

    def block() -> None:
        with profile(activities=activities) as prof:
            bare()
        held[:] = [prof]

    def read() -> None:
        held[0].events()

    row: dict[str, Any] = {"task": task_name, "shape": " ".join(f"{k}={v}" for k, v in shape.params)}
    for fn in (bare, recording, census, both):  # warm: compiles, the profiler's first start
        fn()
    for name, fn in (("bare", bare), ("recording", recording), ("census", census), ("both", both), ("block", block)):
        row[name] = _per_call_ms(fn, reps)
    reads = []
    for _ in range(reps):
        block()
        t0 = time.perf_counter()
        read()
        reads.append((time.perf_counter() - t0) * 1e3)
    row["read"] = statistics.median(reads)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--task", action="append", dest="tasks", help="a built-in task (repeatable)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--reference", action="store_true", help="time the task's reference, not its seed")
    args = parser.parse_args()
    trace.install_launch_hooks()
    rows = [measure(t, args.device, args.reps, args.reference) for t in args.tasks or ["rms_norm"]]
    print(f"per checked call, ms (median of {args.reps}), on {args.device}")
    print(f"{'task':<22} {'shape':<28} " + " ".join(f"{m:>9}" for m in MODES))
    for r in rows:
        print(f"{r['task']:<22} {r['shape']:<28} " + " ".join(f"{r[m]:9.3f}" for m in MODES))


if __name__ == "__main__":
    main()
