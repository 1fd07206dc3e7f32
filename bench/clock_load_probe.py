"""Does the clock rule call an honest worker a cheat on a busy host? (CPU only; no GPU needed.)

The protocol of a timed batch, without the GPU: a trusted process sends go and spins for done
(refworker._wait_byte, with the host readings of verifier/host_load.py); a worker spins for go,
does WORK_MS of work on its own clock, says done and reports what its clock said. Each case runs
SAMPLES such batches, with some processes burning every core or none, and with an honest worker
or one that divides its clock by 5. Printed per case: the gap (trusted less claimed: the two
wake-ups) at the median and at its largest, the share of samples the trusted side saw quiet, and
how many verdicts clock.lied accuses, each verdict being three consecutive samples (a shape's
three long batches), with the host readings (the rule) and without them (every sample taken as
quiet: the rule before host_load).

Usage: python bench/clock_load_probe.py [--samples 20] [--work-ms 1.5] [--burners N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time
from typing import Any

from kernforge.verifier import host_load, refworker
from kernforge.verifier.defences import clock


def _burn(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _worker(sock: socket.socket, samples: int, work_s: float, divide: float) -> None:
    for _ in range(samples):
        sock.setblocking(False)
        while True:
            try:
                if sock.recv(1):
                    break
            except BlockingIOError:
                continue
        start = time.perf_counter()
        while time.perf_counter() - start < work_s:
            pass
        sock.setblocking(True)
        sock.sendall(b"d")
        claimed = (time.perf_counter() - start) / divide
        sock.sendall(f"{claimed:.9f}\n".encode())


def _case(samples: int, work_s: float, burners: int, divide: float) -> list[clock.Sample]:
    stop = mp.Event()
    burn = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(burners)]
    for p in burn:
        p.start()
    time.sleep(0.5 if burners else 0.0)  # the burners are running
    ours, theirs = socket.socketpair()
    worker = mp.Process(target=_worker, args=(theirs, samples, work_s, divide), daemon=True)
    worker.start()
    out: list[clock.Sample] = []
    reader = ours.makefile("rb")
    try:
        for _ in range(samples):
            time.sleep(0.01)  # the worker is spinning for go
            watch = host_load.Watch()
            t1 = time.perf_counter()
            ours.sendall(b"g")
            refworker._wait_byte(ours, deadline=time.perf_counter() + 10, watch=watch)
            trusted = time.perf_counter() - t1
            watch.look()
            claimed = float(reader.readline())
            out.append((claimed, trusted, host_load.quiet(watch.facts())))
    finally:
        worker.join(5)
        stop.set()
        for p in burn:
            p.join(5)
        ours.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--work-ms", type=float, default=1.5, help="the worker's batch (an honest 512-call batch of a tiny kernel)")
    ap.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1), help="processes burning the cores in the busy cases")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.samples} samples of {args.work_ms} ms per case; busy: {args.burners} burners")
    print("cheats: verdicts of three samples the clock rule calls a cheat, with the host readings and without them")
    print(f"{'case':<26} {'gap median ms':>13} {'gap max ms':>10} {'quiet':>6} {'the rule':>9} {'no readings':>12}")
    for name, burners, divide in [("honest, idle host", 0, 1.0), ("honest, busy host", args.burners, 1.0),
                                  ("clock / 5, idle host", 0, 5.0), ("clock / 5, busy host", args.burners, 5.0)]:
        got = _case(args.samples, args.work_ms / 1e3, burners, divide)
        gaps = [(t - c) * 1e3 for c, t, _ in got]
        quiet = sum(q for _, _, q in got) / len(got)
        verdicts = [got[i:i + 3] for i in range(0, len(got) - 2, 3)]
        rule = sum(clock.lied(v, clock.BATCH_MARGIN_S, "probe") is not None for v in verdicts)
        before = sum(clock.lied([(c, t, True) for c, t, _ in v], clock.BATCH_MARGIN_S, "probe") is not None for v in verdicts)
        print(f"{name:<26} {statistics.median(gaps):>13.3f} {max(gaps):>10.3f} {quiet:>6.0%} "
              f"{f'{rule}/{len(verdicts)}':>9} {f'{before}/{len(verdicts)}':>12}")


if __name__ == "__main__":
    main()
