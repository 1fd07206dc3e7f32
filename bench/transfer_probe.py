"""How fast can a candidate's outputs travel from its worker to the reference worker?

Each checked call's outputs leave the candidate's process (a device-to-host copy and a file in
its folder) and reach the reference worker (a read and a host-to-device copy). For
silu_and_mul's largest hidden shape that is 470 MB per call. This script times the ways of
moving such a tensor through a folder on this machine, so the transfer the verifier uses can
be chosen on measurements. It also times one element-by-element comparison at that size.

    python bench/transfer_probe.py [--mb 470] [--reps 8] [--dirs /tmp /dev/shm] [--contend]

Prints a table: per folder and method, write and read seconds per call and GB/s.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

from rich.console import Console
from rich.table import Table


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] if len(times) > 2 else times)


def _fs_type(folder: str) -> str:
    try:
        out = subprocess.run(["stat", "-f", "-c", "%T", folder], capture_output=True, text=True, timeout=5, check=False)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def _reader(path: str, stop) -> None:
    """Another process reading a large output over and over, as the reference worker does
    while the candidate's worker writes its next outputs."""
    from kernforge.verifier import tensorio

    while not stop.is_set():
        tensorio.read_tensor(path, device="cuda" if torch.cuda.is_available() else "cpu")


def probe_folder(folder: str, src: torch.Tensor, reps: int) -> list[tuple[str, float, float, str]]:
    """(method, write s, read s, note) per method, for the bytes of ``src`` (on the device)."""
    dev = src.device
    nbytes = src.numel()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    back = torch.empty_like(src)
    rows = []
    path = Path(folder) / f"kf-transfer-{os.getpid()}.bin"

    # 1. what the verifier did: a new file per call, written from a pinned buffer, read back
    #    into one, then removed.
    def write_new() -> None:
        pinned.copy_(src)
        with open(path, "wb") as f:
            f.write(memoryview(pinned.numpy()))

    def read_new() -> None:
        with open(path, "rb") as f:
            f.readinto(memoryview(pinned.numpy()))
        back.copy_(pinned)
        torch.cuda.synchronize() if dev.type == "cuda" else None

    def cycle_new() -> tuple[float, float]:
        t0 = time.perf_counter()
        write_new()
        t1 = time.perf_counter()
        read_new()
        t2 = time.perf_counter()
        path.unlink()
        return t1 - t0, t2 - t1

    pairs = [cycle_new() for _ in range(reps)]
    rows.append(("new file each call", statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs), ""))

    # 2. the same file overwritten in place: page cache pages already there
    write_new()

    def write_over() -> None:
        pinned.copy_(src)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, memoryview(pinned.numpy()), 0)
        finally:
            os.close(fd)

    rows.append(("file overwritten", _median_s(write_over, reps), _median_s(read_new, reps), ""))

    # 3. a shared mapping of that file, kept: copies straight into it and out of it
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    view = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes)

    def write_map() -> None:
        view.copy_(src)
        torch.cuda.synchronize() if dev.type == "cuda" else None

    def read_map() -> None:
        back.copy_(view)
        torch.cuda.synchronize() if dev.type == "cuda" else None

    rows.append(("mapping, pageable", _median_s(write_map, reps), _median_s(read_map, reps), ""))

    def write_map_staged() -> None:
        pinned.copy_(src)
        view.copy_(pinned)

    def read_map_staged() -> None:
        pinned.copy_(view)
        back.copy_(pinned)
        torch.cuda.synchronize() if dev.type == "cuda" else None

    threads = torch.get_num_threads()
    for n in sorted({1, 4, threads}):
        torch.set_num_threads(n)
        rows.append((f"mapping via pinned, {n} thr", _median_s(write_map_staged, reps), _median_s(read_map_staged, reps), ""))
    torch.set_num_threads(threads)
    view = None  # the mapping cannot close while a tensor exports it
    mm.close()
    os.close(fd)
    path.unlink()

    # 4. what the verifier does now (verifier/tensorio.py): a kept mapping, parallel reads
    from kernforge.verifier import tensorio

    tensor = src.view(torch.bfloat16) if nbytes % 2 == 0 else src

    def read_tensorio() -> None:
        tensorio.read_tensor(path, device=dev)
        torch.cuda.synchronize() if dev.type == "cuda" else None

    w = _median_s(lambda: tensorio.write_tensor(path, tensor), reps)
    rows.append(("tensorio (verifier)", w, _median_s(read_tensorio, reps), ""))
    tensorio.release_mappings()
    path.unlink()
    return rows


def probe_compare(numel: int, device: str) -> list[tuple[str, float]]:
    """Seconds for one comparison of ``numel`` bf16 outputs against a float32 reference."""
    from kernforge.tasks.spec import Tolerance
    from kernforge.verifier import compare, timing

    high = torch.randn(numel, device=device)
    low = high.to(torch.bfloat16)
    cand = low.clone()
    tol = Tolerance(rtol=1e-2, atol=1e-3)

    def sync() -> None:
        torch.cuda.synchronize() if device.startswith("cuda") else None

    rows = []
    rows.append(("compare.compare", _median_s(lambda: (compare.compare(cand, high, tol, low=low), sync()), 4)))
    rows.append(("timing.checksum", _median_s(lambda: (timing.checksum([cand]), sync()), 4)))

    def allowed() -> None:
        hf = high.double()
        finite = hf[torch.isfinite(hf)]
        float(1e-2 * finite.abs().max() + 1e-3 * finite.pow(2).mean().sqrt())

    rows.append(("allowed_abs", _median_s(allowed, 4)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=470.0, help="tensor size in MB (470: silu_and_mul T=8191 I=28672 in bf16)")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--dirs", nargs="+", default=["/tmp", "/dev/shm"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--contend", action="store_true", help="also measure with another process reading meanwhile")
    args = ap.parse_args()
    nbytes = int(args.mb * 1e6)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=args.device)
    print(f"kernel {os.uname().release}; {nbytes / 1e6:.0f} MB on {args.device}; {os.cpu_count()} CPUs")
    rows = []
    for folder in args.dirs:
        if not os.access(folder, os.W_OK):
            print(f"{folder}: not writable, skipped")
            continue
        for busy in (False, True) if args.contend else (False,):
            stop = reader = None
            if busy:  # a second process reads another output meanwhile
                import multiprocessing as mp

                from kernforge.verifier import tensorio

                other = Path(folder) / f"kf-transfer-other-{os.getpid()}.bin"
                tensorio.write_tensor(other, src.view(torch.bfloat16))
                tensorio.release_mappings()
                ctx = mp.get_context("spawn")
                stop = ctx.Event()
                reader = ctx.Process(target=_reader, args=(str(other), stop), daemon=True)
                reader.start()
                time.sleep(3)
            try:
                for method, w, r, note in probe_folder(folder, src, args.reps):
                    label = f"{folder} ({_fs_type(folder)})" + (", reader busy" if busy else "")
                    rows.append((label, method, w, r, note))
            finally:
                if reader is not None:
                    stop.set()
                    reader.join(30)
                    other.unlink()
    header = ("folder", "method", "write s", "write GB/s", "read s", "read GB/s", "note")
    lines = [(f, m, f"{w:.3f}", f"{nbytes / w / 1e9:.1f}" if w > 0 else "-", f"{r:.3f}", f"{nbytes / r / 1e9:.1f}" if r > 0 else "-", n)
             for f, m, w, r, n in rows]
    numel = nbytes // 2
    cmp_rows = probe_compare(numel, args.device)
    table = Table(title=f"Moving {nbytes / 1e6:.0f} MB of outputs (median of {args.reps})")
    for h in header:
        table.add_column(h)
    for line in lines:
        table.add_row(*line)
    console = Console(width=160)
    console.print(table)
    t2 = Table(title=f"Comparing {numel / 1e6:.0f}M bf16 outputs with a float32 reference")
    t2.add_column("step")
    t2.add_column("s")
    for name, s in cmp_rows:
        t2.add_row(name, f"{s:.4f}")
    console.print(t2)


if __name__ == "__main__":
    main()
