"""What the trusted judge's GPU design rests on, measured: shared device memory between a trusted
process and a candidate-like child, the candidate's allocations routed into it, and the trusted
clock over a batch of calls (GPU only).

The parent plays the trusted side: it creates device memory (verifier/vmm.py), hands the child a
file descriptor for it, writes fresh inputs into it, and times a batch with its own CUDA events:
from before its input write until its own probe of the child's outputs has run. The child plays
the candidate's worker: it maps the memory, routes torch's allocations into it (verifier/heap.py),
captures one CUDA graph of many calls and replays it when told. Printed:

* set-up costs (create, export, import, map) and whether the child sees the parent's bytes;
* whether eager and graph-captured outputs land in the shared memory;
* per call: the child's own event time, the trusted batch time (window less the input write's
  lower bound), and the same op timed inside one process, for several batch sizes;
* whether a kernel in another process runs concurrently with the parent's (time-slicing);
* whether ncu runs, and what it costs per kernel.

Usage: python bench/ipc_probe.py [--mb 64] [--calls 8 32 128] [--batches 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def send(sock: socket.socket, obj: dict, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


class Reader:
    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.fds = sock, b"", []

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 8)
            if not data:
                raise EOFError
            self.buf += data
            self.fds += fds
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def spin_byte(sock: socket.socket) -> bytes:
    """Wait for one byte, polling (what a latency-critical trusted side does)."""
    sock.setblocking(False)
    try:
        while True:
            try:
                b = sock.recv(1)
                if b:
                    return b
                raise EOFError
            except BlockingIOError:
                continue
    finally:
        sock.setblocking(True)


# ---- the child: a candidate-like worker -------------------------------------------------------
def child(fd_sock: int, go_sock: int) -> None:
    import torch

    from kernforge.verifier import heap, vmm

    sock = socket.socket(fileno=fd_sock)
    go = socket.socket(fileno=go_sock)
    rd = Reader(sock)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    msg = rd.recv()
    t0 = time.perf_counter()
    arena = vmm.open_fd(rd.fds.pop(0), msg["size"], 0)
    map_s = time.perf_counter() - t0
    view = arena.tensor()
    seen = int(view[: 4096].to(torch.int64).sum().item())
    in_bytes = msg["in_bytes"]
    pool = heap.HeapPool(arena.ptr + msg["heap_offset"], arena.size - msg["heap_offset"])
    with pool.use():
        x = view[:in_bytes].view(torch.bfloat16)
        y = x * 2.0
        torch.cuda.synchronize()
    eager_in = pool.region.contains(y.data_ptr(), y.numel() * 2)
    send(sock, {"map_s": map_s, "seen": seen, "eager_in_arena": eager_in})
    graphs = {}
    while True:
        msg = rd.recv()
        if msg["op"] == "capture":
            m = msg["calls"]
            xs = [view[k * in_bytes:(k + 1) * in_bytes].view(torch.bfloat16) for k in range(m)]
            with pool.use():
                for _ in range(2):
                    _ = xs[0] * 2.0
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            t0 = time.perf_counter()
            try:
                with torch.cuda.graph(g, pool=pool.id):
                    outs = [x * 2.0 for x in xs]
            except Exception as err:  # report, the parent prints it
                send(sock, {"error": f"{type(err).__name__}: {err}"})
                continue
            torch.cuda.synchronize()
            graphs[m] = (g, outs)
            send(sock, {"capture_s": time.perf_counter() - t0,
                        "offsets": [o.data_ptr() - arena.ptr for o in outs],
                        "in_arena": all(pool.region.contains(o.data_ptr(), o.numel() * 2) for o in outs)})
        elif msg["op"] == "batch":
            g, outs = graphs[msg["calls"]]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spin_byte(go)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            go.sendall(b"d")
            send(sock, {"own_ms": start.elapsed_time(end)})
        elif msg["op"] == "sleep":
            torch.cuda._sleep(int(msg["cycles"]))
            send(sock, {"queued": True})
            torch.cuda.synchronize()
            send(sock, {"slept": True})
        elif msg["op"] == "done":
            return


# ---- the parent: the trusted side -------------------------------------------------------------
def parent(args: argparse.Namespace) -> None:
    import torch

    from kernforge.verifier import vmm

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    torch.empty(1, device=dev)
    rows: list[tuple[str, str]] = []
    in_bytes = args.mb << 20
    max_calls = max(args.calls)
    heap_offset = -(-(max_calls * in_bytes) // (2 << 20)) * (2 << 20)
    size = heap_offset + 2 * max_calls * in_bytes + (512 << 20)
    t0 = time.perf_counter()
    arena = vmm.create(size, 0)
    rows.append(("create + map, parent", f"{(time.perf_counter() - t0) * 1e3:.1f} ms for {arena.size / 2**30:.2f} GiB"))
    view = arena.tensor()
    view[:4096].fill_(1)
    t0 = time.perf_counter()
    fd = arena.export()
    rows.append(("export", f"{(time.perf_counter() - t0) * 1e6:.0f} us"))

    a, b = socket.socketpair()
    ga, gb = socket.socketpair()
    unshare = shutil.which("unshare")
    prefix = []
    if unshare and subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0:
        prefix = [unshare, "--pid", "--fork", "--mount-proc"]
    rows.append(("child in its own pid namespace", "yes" if prefix else "no (unshare refused)"))
    proc = subprocess.Popen(prefix + [sys.executable, str(Path(__file__).resolve()), "--child", str(b.fileno()), str(gb.fileno())],
                            pass_fds=(b.fileno(), gb.fileno()))
    b.close()
    gb.close()
    rd = Reader(a)
    send(a, {"size": arena.size, "in_bytes": in_bytes, "heap_offset": heap_offset}, [fd])
    os.close(fd)
    hello = rd.recv()
    rows.append(("import + map, child", f"{hello['map_s'] * 1e3:.1f} ms"))
    rows.append(("child reads the parent's bytes", "yes" if hello["seen"] == 4096 else f"NO ({hello['seen']})"))
    rows.append(("eager output in shared memory", str(hello["eager_in_arena"])))

    copy_gbps = _copy_ceiling(torch, dev)
    rows.append(("copy ceiling", f"{copy_gbps:.0f} GB/s"))
    table = []
    for m in args.calls:
        send(a, {"op": "capture", "calls": m})
        cap = rd.recv()
        if "error" in cap:
            rows.append((f"capture {m} calls", "FAILED " + cap["error"]))
            continue
        rows.append((f"capture {m} calls", f"{cap['capture_s'] * 1e3:.1f} ms, outputs in shared memory: {cap['in_arena']}"))
        numel = in_bytes // 2
        outs = [view[o:o + in_bytes].view(torch.bfloat16) for o in cap["offsets"]]
        region = view[: m * in_bytes]
        pristine = torch.empty(m * in_bytes, dtype=torch.uint8, device=dev)
        # one gather over the shared bytes: 64 random elements of every output, both bytes of each
        elems = torch.randint(0, numel, (m, 64), device=dev, dtype=torch.int64)
        base = torch.tensor(cap["offsets"], device=dev, dtype=torch.int64)[:, None]
        byte_idx = torch.stack([base + 2 * elems, base + 2 * elems + 1], dim=-1).flatten()
        wins, owns, writes, wrong = [], [], [], 0
        for _ in range(args.batches):
            pristine.view(torch.bfloat16).normal_()
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda.synchronize()
            e0.record()
            region.copy_(pristine)
            e1.record()
            torch.cuda.current_stream().synchronize()
            send(a, {"op": "batch", "calls": m})
            ga.sendall(b"g")
            spin_byte(ga)
            sample = view[byte_idx]
            e2.record()
            torch.cuda.synchronize()
            own = rd.recv()["own_ms"]
            src = pristine.view(torch.bfloat16).view(m, numel)
            wrong += sum(int((o != src[k] * 2.0).sum()) for k, o in enumerate(outs))
            want = (src * 2.0).view(torch.uint8).view(m, numel, 2)
            got = sample.view(m, 64, 2)
            wrong += int((got != torch.stack([want[k, elems[k]] for k in range(m)])).sum())
            wins.append(e0.elapsed_time(e2))
            writes.append(e0.elapsed_time(e1))
            owns.append(own)
        w_min = 2 * m * in_bytes / (copy_gbps * 1e9 * 1.05) * 1e3
        inproc = _inprocess(torch, dev, m, in_bytes, args.batches)
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        table.append((m, med(owns) / m * 1e3, (med(wins) - w_min) / m * 1e3, inproc / m * 1e3, med(writes), w_min, med(wins), wrong))

    # Do kernels of two processes run at the same time? The child spins one block for about a
    # second; the parent times its own 64 MB write with a copy-engine memcpy and with a kernel.
    from kernforge.verifier import timing

    src = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)

    def timed(fn) -> tuple[float, float]:
        """(device us between events around fn, host us from launch until the device finished)."""
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3, (time.perf_counter() - t0) * 1e6

    for _ in range(3):  # load both kernels before anything is timed
        timed(lambda: dst.copy_(src)), timed(lambda: timing.write(dst, src))
    memcpy_alone, kernel_alone = timed(lambda: dst.copy_(src)), timed(lambda: timing.write(dst, src))
    send(a, {"op": "sleep", "cycles": 2_000_000_000})
    rd.recv()
    time.sleep(0.05)
    memcpy_busy, kernel_busy = timed(lambda: dst.copy_(src)), timed(lambda: timing.write(dst, src))
    rd.recv()
    fmt = lambda v: f"{v[0]:.0f} us on the device, {v[1]:.0f} us on the host"  # noqa: E731
    rows.append(("64 MB memcpy alone", fmt(memcpy_alone)))
    rows.append(("64 MB memcpy while the child's kernel spins", fmt(memcpy_busy)))
    rows.append(("64 MB write kernel alone", fmt(kernel_alone)))
    rows.append(("64 MB write kernel while the child's kernel spins", fmt(kernel_busy)))
    send(a, {"op": "done"})
    proc.wait(timeout=30)

    t0 = time.perf_counter()
    big = vmm.create(8 << 30, 0)
    rows.append(("create + map 8 GiB", f"{(time.perf_counter() - t0) * 1e3:.1f} ms"))
    big.close()
    rows += _ncu()

    print("\n| what | measured |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\n| calls | child's own us/call | trusted us/call | one process us/call | write ms | write floor ms | window ms | wrong elements |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.3f} | {r[7]} |")


def _copy_ceiling(torch, dev) -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return 2 * n / (sorted(times)[5] * 1e-3) / 1e9


def _inprocess(torch, dev, m: int, in_bytes: int, batches: int) -> float:
    """The same graph of ``m`` calls, timed by events inside one process (the old way)."""
    xs = [torch.randn(in_bytes // 2, dtype=torch.bfloat16, device=dev) for _ in range(m)]
    g = torch.cuda.CUDAGraph()
    for _ in range(2):
        _ = xs[0] * 2.0
    with torch.cuda.graph(g):
        outs = [x * 2.0 for x in xs]
    times = []
    for _ in range(batches):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    del outs
    return sorted(times)[len(times) // 2]


def _ncu() -> list[tuple[str, str]]:
    ncu = shutil.which("ncu")
    if not ncu:
        return [("ncu", "not installed")]
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    script = "import torch\nx=torch.randn(1<<20,device='cuda')\nfor _ in range(50):\n    x=x*1.0001\ntorch.cuda.synchronize()\n"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], capture_output=True)
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = subprocess.run([ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
                          "--target-processes", "all", sys.executable, "-c", script], capture_output=True, text=True)
    ncu_s = time.perf_counter() - t0
    lines = [ln for ln in run.stdout.splitlines() if "gpu__time_duration" in ln]
    return [("ncu", f"{' '.join(version)}; exit {run.returncode}; {len(lines)} kernel rows; {ncu_s:.1f} s vs {plain_s:.1f} s without"),
            ("ncu sample row", lines[1][:200] if len(lines) > 1 else (run.stderr or run.stdout)[-300:])]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        p.add_argument("--mb", type=int, default=64, help="input bytes per call (MiB); output is the same size")
        p.add_argument("--calls", type=int, nargs="+", default=[8, 32, 128])
        p.add_argument("--batches", type=int, default=5)
        parent(p.parse_args())
