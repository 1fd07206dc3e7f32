"""Sandbox benchmark: dispatch latency and candidates per minute, warm pool vs cold spawn.

    python bench/sandbox.py                              # CPU, and the GPU 0 when there is one
    python bench/sandbox.py --candidates 40 --pool-size 4 --device gpu

Each candidate is a trivial kernel job (tests/sandbox_jobs/gpu.py:add_one): it launches one
small Triton kernel (under the interpreter on the CPU), checks the result, and reports the
moment its code started running. Workers preload torch and Triton; GPU workers also create their
CUDA context in warm-up. The job module is preloaded too, as the verifier preloads its harness.

* dispatch latency: ``backend.session(...)`` called -> the job's first line runs (both on the
  host's monotonic clock, which every process shares). "ready": each of ``--paced`` candidates
  arrives at a fully warm pool; "back-to-back": during the throughput run, where a candidate may
  wait for a worker still warming up.
* candidates/min: ``--candidates`` judged one after another, each in a fresh worker, over the
  wall time of the whole batch. ``warm`` keeps ``--pool-size`` workers ready and refills in the
  background; ``cold`` (pool size 0) starts a worker only when a candidate arrives.
* docker warm: the same warm pool with each worker in a container (``--sandbox docker``), when a
  Docker engine and the worker image are there (``kernforge sandbox build-image``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
from kernforge.sandbox.docker_probe import probe_docker
from kernforge.sandbox.isolation import describe_isolation

JOBS = Path(__file__).resolve().parents[1] / "tests"
ENTRY = "sandbox_jobs.gpu:add_one"
TARGET_DISPATCH_MS = 50.0
TARGET_GPU_RATIO = 3.0


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_batch(spec: WorkerSpec, pool_size: int, candidates: int, paced: int, backend_class=ProcessBackend) -> dict[str, float]:
    """``paced`` candidates each handed to a ready pool (latency), then ``candidates`` back to
    back (throughput: the pool refills while candidates run, or cannot keep up)."""
    limits = Limits(wall_seconds=600)
    with backend_class(spec, pool_size=pool_size) as backend:

        def one() -> float:
            submitted = time.monotonic()
            with backend.session(ENTRY, {"n": 4096}, limits) as session:
                reply = session.recv(timeout=600)
            if not reply.get("ok"):
                raise SystemExit(f"the trivial kernel gave a wrong result: {reply}")
            return reply["started"] - submitted

        ready = []
        for _ in range(paced if pool_size else 0):
            backend.wait_warm(timeout=900)
            ready.append(one())
        backend.wait_warm(timeout=900)
        start = time.monotonic()
        loaded = [one() for _ in range(candidates)]
        elapsed = time.monotonic() - start
    return {
        "ready_p50_ms": _p(ready, 0.5) if ready else float("nan"),
        "ready_p90_ms": _p(ready, 0.9) if ready else float("nan"),
        "p50_ms": _p(loaded, 0.5),
        "p90_ms": _p(loaded, 0.9),
        "per_candidate_s": elapsed / candidates,
        "per_minute": 60 * candidates / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=20, help="candidates per measurement")
    parser.add_argument("--pool-size", type=int, default=2, help="warm workers kept ready")
    parser.add_argument("--paced", type=int, default=10,
                        help="candidates handed to a fully warm pool, for the dispatch latency of a ready worker")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="auto: the CPU, plus GPU 0 when torch sees one")
    parser.add_argument("--isolation", default="strict", help="WorkerSpec.isolation (strict, bwrap, namespaces, none)")
    parser.add_argument("--no-docker", action="store_true", help="skip the docker row even when an engine and the image are there")
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

    console = Console(width=110)
    ok, detail = describe_isolation()
    console.print(f"isolation ({args.isolation}): {detail}")
    docker_ok, docker_detail = (False, "skipped (--no-docker)") if args.no_docker else probe_docker()
    console.print(f"docker: {docker_detail}")
    table = Table(title=f"sandbox dispatch: {args.paced} paced + {args.candidates} back-to-back trivial-kernel candidates per row")
    for col in ("device", "mode", "pool", "ready: dispatch p50 ms", "ready: p90 ms", "back-to-back: dispatch p50 ms",
                "p90 ms", "s / candidate", "candidates / min"):
        table.add_column(col, justify="left" if col in ("device", "mode") else "right")
    verdicts = []
    for device in devices:
        spec = WorkerSpec(device=device, preload=("torch", "triton", "sandbox_jobs.gpu"), warmup="sandbox_jobs.gpu:warm",
                          env={"PYTHONPATH": str(JOBS)}, isolation=args.isolation)
        name = "cpu" if device == "cpu" else f"gpu {device}"
        results = {}
        for mode, pool in (("warm", args.pool_size), ("cold", 0)):
            r = results[mode] = run_batch(spec, pool, args.candidates, args.paced)
            ready = (f"{r['ready_p50_ms']:.1f}", f"{r['ready_p90_ms']:.1f}") if pool else ("-", "-")
            table.add_row(name, mode, str(pool), *ready,
                          f"{r['p50_ms']:.1f}", f"{r['p90_ms']:.1f}", f"{r['per_candidate_s']:.2f}", f"{r['per_minute']:.1f}")
        if docker_ok:
            from kernforge.sandbox.docker_backend import DockerBackend

            r = run_batch(spec, args.pool_size, args.candidates, args.paced, DockerBackend)
            table.add_row(name, "docker warm", str(args.pool_size), f"{r['ready_p50_ms']:.1f}", f"{r['ready_p90_ms']:.1f}",
                          f"{r['p50_ms']:.1f}", f"{r['p90_ms']:.1f}", f"{r['per_candidate_s']:.2f}", f"{r['per_minute']:.1f}")
        ratio = results["warm"]["per_minute"] / results["cold"]["per_minute"]
        warm_ms = results["warm"]["ready_p50_ms"]
        verdicts.append(f"{name}: dispatch to a ready warm worker p50 {warm_ms:.1f} ms "
                        f"({'meets' if warm_ms <= TARGET_DISPATCH_MS else 'MISSES'} <= {TARGET_DISPATCH_MS:.0f} ms); "
                        f"warm/cold candidates per minute {ratio:.2f}x"
                        + ("" if device == "cpu" else f" ({'meets' if ratio >= TARGET_GPU_RATIO else 'MISSES'} >= {TARGET_GPU_RATIO:.0f}x)"))
    console.print(table)
    for line in verdicts:
        console.print(line)


if __name__ == "__main__":
    main()
