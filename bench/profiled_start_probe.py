"""Does a candidate worker become ready: seeded, under Nsight Compute, and stopped around windows?

Three starts, each given ``--wait`` seconds: a worker whose home got the pool's Triton cache seed
(verifier/triton_seed.py); a worker under Nsight Compute with that seed (the audit's profiled
worker); and one under Nsight Compute enlisted with the GPU's gate as the pool enlists a warming
worker (gate.warming), while another thread holds the gate alone 50 ms of every 100 ms, as a
judge's timed windows do. Each line says whether the worker was ready and where its start went
(the worker's own ``start_steps``); one that is not ready after a few seconds has its process tree
printed (each process, its threads, the children each thread forked), and its states (ps) when it
never becomes ready.

On an H100 (session 63) the third never became ready in 39 s, its job process blocked on a futex;
the other two were ready in 7.2 s and 11.0 s. So the audit's worker is never stopped while it
warms up (loop/evaluate.py ``open_judge``).

Usage: python bench/profiled_start_probe.py [--wait 40]   (on a GPU host with ncu)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from kernforge.sandbox.isolation import for_profiler, mechanism
from kernforge.sandbox.pool import ProcessBackend
from kernforge.sandbox.protocol import WorkerSpec
from kernforge.verifier import ncu
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import HARNESS_PRELOAD, HARNESS_WARMUP
from kernforge.verifier.triton_seed import TritonSeed


def _tree(root: int) -> None:
    """Each process under ``root``: its name, threads, and the children each thread forked."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        kids: dict[int, str] = {}
        for tid in tids:
            try:
                for kid in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
                    kids[int(kid)] = "main" if tid == str(pid) else tid
            except OSError:
                pass
        print(f"  {pid} {comm}: {len(tids)} threads, children (by thread) {kids}", flush=True)
        todo += list(kids)


def _start(name: str, backend: ProcessBackend, wait: float) -> None:
    started = time.monotonic()
    ready = backend.wait_warm(min(4.0, wait))
    if not ready:
        for worker in list(backend._starting):
            _tree(worker.proc.pid)
        ready = backend.wait_warm(max(0.0, wait - (time.monotonic() - started)))
    steps = ", ".join(f"{k} {v:.2f}" for k, v in backend.start_steps().items())
    print(f"{name}: {'ready' if ready else 'NOT ready'} after {time.monotonic() - started:.1f} s ({steps})", flush=True)
    if not ready:
        for worker in list(backend._starting):
            print(subprocess.run(f"ps -eo pid,ppid,stat,wchan:25,etime,cmd --forest | grep -v grep | grep -A8 {worker.proc.pid}"
                                 " | cut -c1-160", shell=True, capture_output=True, text=True).stdout, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="0", help="the GPU's index")
    parser.add_argument("--wait", type=float, default=40.0, help="seconds each start is given")
    args = parser.parse_args(argv)
    exe = ncu.available()
    if exe is None:
        raise SystemExit("ncu is not installed here")
    spec = WorkerSpec(device=args.device, preload=HARNESS_PRELOAD, warmup=HARNESS_WARMUP, isolation="strict", fork=True)
    seed = TritonSeed()
    with ProcessBackend(spec, pool_size=1, seed=seed) as pool:  # the seed's source, as in a run
        pool.wait_warm(120)
    print(f"seed: {len(seed.files or {})} files", flush=True)
    with ProcessBackend(spec, pool_size=1, refill=False, seed=seed) as plain:
        _start("seeded", plain, args.wait)
    profiler = for_profiler(mechanism("strict"))
    for name, stopped in (("seeded, under ncu", False), ("under ncu, stopped around windows", True)):
        gate, done = DeviceGate(), threading.Event()

        def windows() -> None:
            while not done.is_set():
                with gate.exclusive():
                    time.sleep(0.05)
                time.sleep(0.05)

        with tempfile.TemporaryDirectory() as folder:
            backend = ProcessBackend(replace(spec, profiler=ncu.command(exe, Path(folder) / "ncu.csv")), pool_size=1,
                                     refill=False, start_timeout=120, mechanism=profiler, seed=None if stopped else seed,
                                     starts=gate.warming if stopped else None)
            thread = threading.Thread(target=windows, daemon=True)
            if stopped:
                thread.start()
            try:
                _start(name, backend, args.wait)
            finally:
                done.set()
                backend.close()


if __name__ == "__main__":
    main()
