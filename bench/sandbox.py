"""Sandbox benchmark: dispatch latency and candidates per minute, warm pool vs cold spawn.

    python bench/sandbox.py                              # CPU, and the GPU 0 when there is one
    python bench/sandbox.py --candidates 40 --pool-size 4 --device gpu

Each candidate is a trivial kernel job (tests/sandbox_jobs/gpu.py:add_one): it launches one
small Triton kernel (under the interpreter on the CPU), checks the result, and reports the
moment its code started running. Workers preload torch and Triton; GPU workers also create their
CUDA context in warm-up. The job module is preloaded too, as the verifier preloads its harness.

* dispatch latency: ``backend.session(...)`` called -> the job's first line runs (both on the
  host's monotonic clock, which every process shares).
* candidates/min: candidates judged one after another, each in a fresh worker, over the wall
  time of the whole batch. ``warm`` keeps ``--pool-size`` workers ready and refills in the
  background; ``cold`` (pool size 0) starts a worker only when a candidate arrives.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
from kernforge.sandbox.isolation import describe_isolation

JOBS = Path(__file__).resolve().parents[1] / "tests"
ENTRY = "sandbox_jobs.gpu:add_one"
TARGET_DISPATCH_MS = 50.0
TARGET_GPU_RATIO = 3.0


def run_batch(spec: WorkerSpec, pool_size: int, candidates: int) -> dict[str, float]:
    limits = Limits(wall_seconds=600)
    with ProcessBackend(spec, pool_size=pool_size) as backend:
        if pool_size:
            backend.wait_warm(timeout=900)
        dispatch, start = [], time.monotonic()
        for _ in range(candidates):
            submitted = time.monotonic()
            with backend.session(ENTRY, {"n": 4096}, limits) as session:
                reply = session.recv(timeout=600)
            if not reply.get("ok"):
                raise SystemExit(f"the trivial kernel gave a wrong result: {reply}")
            dispatch.append(reply["started"] - submitted)
        elapsed = time.monotonic() - start
    dispatch.sort()
    return {
        "p50_ms": 1000 * statistics.median(dispatch),
        "p90_ms": 1000 * dispatch[min(len(dispatch) - 1, int(0.9 * len(dispatch)))],
        "per_candidate_s": elapsed / candidates,
        "per_minute": 60 * candidates / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=20, help="candidates per measurement")
    parser.add_argument("--pool-size", type=int, default=2, help="warm workers kept ready")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the CPU, plus GPU 0 when torch sees one")
    parser.add_argument("--isolation", default="strict", help="WorkerSpec.isolation (strict, bwrap, namespaces, none)")
    args = parser.parse_args()

    devices = []
    if args.device in ("auto", "cpu"):
        devices.append("cpu")
    if args.device in ("auto", "gpu"):
        import torch

        if torch.cuda.is_available():
            devices.append("0")
        elif args.device == "gpu":
            raise SystemExit("--device gpu: torch sees no CUDA GPU")

    console = Console()
    ok, detail = describe_isolation()
    console.print(f"isolation ({args.isolation}): {detail}")
    table = Table(title=f"sandbox dispatch, {args.candidates} trivial-kernel candidates per row")
    for col in ("device", "mode", "pool", "dispatch p50 ms", "dispatch p90 ms", "s / candidate", "candidates / min"):
        table.add_column(col, justify="right" if "ms" in col or "/" in col or col == "pool" else "left")
    verdicts = []
    for device in devices:
        spec = WorkerSpec(device=device, preload=("torch", "triton", "sandbox_jobs.gpu"), warmup="sandbox_jobs.gpu:warm",
                          env={"PYTHONPATH": str(JOBS)}, isolation=args.isolation)
        name = "cpu (interpreter)" if device == "cpu" else f"gpu {device}"
        results = {}
        for mode, pool in (("warm", args.pool_size), ("cold", 0)):
            r = results[mode] = run_batch(spec, pool, args.candidates)
            table.add_row(name, mode, str(pool), f"{r['p50_ms']:.1f}", f"{r['p90_ms']:.1f}",
                          f"{r['per_candidate_s']:.2f}", f"{r['per_minute']:.1f}")
        ratio = results["warm"]["per_minute"] / results["cold"]["per_minute"]
        verdicts.append(f"{name}: warm dispatch p50 {results['warm']['p50_ms']:.1f} ms "
                        f"({'meets' if results['warm']['p50_ms'] <= TARGET_DISPATCH_MS else 'MISSES'} <= {TARGET_DISPATCH_MS:.0f} ms); "
                        f"warm/cold candidates per minute {ratio:.2f}x"
                        + ("" if device == "cpu" else f" ({'meets' if ratio >= TARGET_GPU_RATIO else 'MISSES'} >= {TARGET_GPU_RATIO:.0f}x)"))
    console.print(table)
    for line in verdicts:
        console.print(line)


if __name__ == "__main__":
    main()
