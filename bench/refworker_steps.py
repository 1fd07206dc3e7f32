"""What the reference worker's per-window steps cost, run in this process: a timed batch's fresh
inputs (``_plan_batch`` again before every window) and the comparison of every call's outputs
(``_verify_batch``), per window, in milliseconds and in aten ops dispatched.

On a GPU most of these ops are a kernel launch each, and the H200 spent 1.4 s of a 7.3 s rms_norm
verdict drawing inputs and 2.5 s comparing (session 37): thousands of small ops from Python. The op
counts are the same on any device, so a change measured here on the CPU shows what it saves
there; the milliseconds are this machine's.

Each task has two rows. "per call": every call drawn on its own and its reference run on its own
(on the GPU replayed from the worker's captured graph where it has one; on the CPU made before
the comparison is measured, so that row counts the gathering and comparing alone). "batched": the
calls drawn at once and their reference run over many calls at once (reference_batched.py), both
counted.

    python bench/refworker_steps.py                        # rms_norm T=1 H=4096, 512 calls, on the CPU
    python bench/refworker_steps.py --task silu_and_mul --shape T=64,I=8192 --calls 128 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape
from kernforge.verifier import refworker as W
from kernforge.verifier.arena import Arena, Layout, Slots
from kernforge.verifier.messages import TensorRef


class _Ops(TorchDispatchMode):
    """Counts the aten ops dispatched: all of them, and those that are no views (on a GPU each of
    those is a kernel launch)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.writes = 0
        self.bytes = 0  # what the ops that are no views read and write: each tensor argument and result once


    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        got = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.writes += 1
            self.bytes += _nbytes(args) + _nbytes(kwargs) + _nbytes(got)
        return got


def _nbytes(tree: Any) -> int:
    """Bytes of every tensor in ``tree`` (a tensor, or lists, tuples and dicts of them)."""
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _shape(text: str | None, task: Any) -> Shape:
    if not text:
        return min(task.public_shapes, key=lambda s: sum(v for _, v in s.params))
    values = dict(part.split("=") for part in text.split(","))
    return Shape.of({**task.public_shapes[0].as_dict(), **{k: int(v) for k, v in values.items()}})


def measure(task_name: str, shape_text: str | None, calls: int, windows: int, device: str,
            batched: bool = True) -> dict[str, Any]:
    """One task's window steps; ``batched`` False: every call drawn on its own (as before batched
    draws, or for a task whose draw cannot be batched)."""
    task = load_task(task_name)
    shape = _shape(shape_text, task)
    ref = task.ref
    W._STATE.clear()
    sizes = W._sizes(device, {"task_ref": ref, "shapes": [shape.as_dict()], "init_seed": 3})["sizes"][0]
    input_bytes = int((sizes["input_bytes"] + 4096) * calls * 1.1) + (1 << 20)
    heap_bytes = int((sizes["output_bytes"] + 4096) * calls * 1.1) + (1 << 20)
    arena = Arena.create(Layout(input_bytes + heap_bytes, input_bytes), device)
    W._STATE.update(arena=arena, calls={}, history={}, batches={})
    dist = task.distributions[0]
    msg = {"key": "bench", "task_ref": ref, "shape": shape.as_dict(), "dist": dist, "init_seed": 3}
    try:
        planned = W._plan_batch(device, {**msg, "seeds": list(range(1, calls + 1))})
        batch = W._STATE["batches"]["bench"]
        if not batched:
            batch.stacked = None
        model = W._model(ref, shape, 3, device)
        heap = Slots(arena.layout.input_bytes, arena.layout.size)
        outputs = []
        with torch.no_grad():
            for args in planned["sets"]:
                inputs = [arena.view(TensorRef(**a["ref"])) if a.get("ref") else a["value"] for a in args]
                # what the call returns, placed in the heap, then the inputs it writes in place, where they lie
                outputs.append([arena.place(heap, t) for t in _returned(model(*inputs))]
                               + [TensorRef(**args[i]["ref"]) for i in task.mutated_inputs])
        batch.outputs = outputs
        fills, verifies, fill_ops, verify_ops = [], [], _Ops(), _Ops()
        tolerances = task.tolerance_table()
        for w in range(windows + 1):
            seeds = [calls * (w + 1) + k for k in range(calls)]
            counted = w == windows  # the last window's ops are counted; the others are timed
            with fill_ops if counted else _nothing():
                t0 = time.perf_counter()
                W._plan_batch(device, {**msg, "seeds": seeds})
                _sync(device)
                t1 = time.perf_counter()
            batch.region.copy_(batch.pristine)  # the trusted write, inside the window
            with torch.no_grad():  # the candidate's calls: honest, on this window's inputs
                for args, outs in zip(planned["sets"], outputs):
                    inputs = [arena.view(TensorRef(**a["ref"])) if a.get("ref") else a["value"] for a in args]
                    for t, r in zip(_returned(model(*inputs)), outs):  # in-place outputs are written where they lie
                        arena.view(r).copy_(t)
            # call by call on the CPU, the references are made before the comparison (on a GPU the
            # worker replays them from its graph); batched, the comparison runs its own, stacked
            references = _references(batch, model, task, device) if batch.stacked is None else None
            with verify_ops if counted else _nothing(), _replayed(references):
                t2 = time.perf_counter()
                got = W._verify_batch(device, {"key": "bench", "tolerances": tolerances})
                _sync(device)
                t3 = time.perf_counter()
            if got["failed_call"] != -1 or got["mutated_inputs"]:
                raise SystemExit(f"the honest batch failed its verification: {got}")
            if not counted and w > 0:  # the first window warms up
                fills.append(t1 - t0)
                verifies.append(t3 - t2)
        line = runtime.roofline(task, shape, task.dtype(device.split(":")[0]))
        moved = line.bytes * calls if line is not None and line.bytes else None  # what the calls themselves move
        return {"task": task.name, "shape": shape.label, "calls": calls, "device": device,
                "fill_x": fill_ops.bytes / moved if moved else None, "verify_x": verify_ops.bytes / moved if moved else None,
                "draw": "batched" if batch.stacked is not None else "per call",
                "fill_ms": 1e3 * statistics.median(fills), "verify_ms": 1e3 * statistics.median(verifies),
                "fill_ops": sum(fill_ops.ops.values()), "fill_writes": fill_ops.writes,
                "verify_ops": sum(verify_ops.ops.values()), "verify_writes": verify_ops.writes,
                "top_fill": fill_ops.ops.most_common(8), "top_verify": verify_ops.ops.most_common(12)}
    finally:
        arena.close()
        W._STATE.clear()


def _returned(got: Any) -> list[Any]:
    """The tensors a call returned (none for an op that only writes its inputs in place)."""
    return [t for t in (got if isinstance(got, (tuple, list)) else [got]) if isinstance(t, torch.Tensor)]


def _references(batch: Any, model: Any, task: Any, device: str) -> list[Any] | None:
    """Every call's reference, computed before the comparison is measured, where the GPU would
    replay them from a captured graph (one launch) and the CPU has none: what is measured is the
    gathering and the comparison, as on the GPU after its replay."""
    from kernforge.verifier import reference

    if device.startswith("cuda"):
        return None  # the worker's own graph
    return [reference.run_reference(model, W._call_inputs(batch, k), task.mutated_inputs) for k in range(len(batch.sets))]


class _replayed:
    """``_batch_reference`` answering with ``references`` (a no-op where they are None)."""

    def __init__(self, references: list[Any] | None) -> None:
        self.references, self.original, self.sync = references, W._batch_reference, torch.cuda.synchronize

    def __enter__(self) -> None:
        if self.references is not None:
            W._batch_reference = lambda *args: self.references
            torch.cuda.synchronize = lambda *args: None  # after a replay; nothing to wait for here

    def __exit__(self, *exc: Any) -> None:
        W._batch_reference, torch.cuda.synchronize = self.original, self.sync


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", action="append", help="a task (repeat); default rms_norm, silu_and_mul, softmax")
    parser.add_argument("--shape", help="NAME=VALUE,... (default: the task's smallest public shape)")
    parser.add_argument("--calls", type=int, default=512, help="calls per batch (the judge's most for a small shape)")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.windows < 2:
        parser.error("--windows must be 2 or more: the first warms up, the last is counted, the rest are timed")
    rows = [measure(t, args.shape, args.calls, args.windows, args.device, batched)
            for t in args.task or ["rms_norm", "silu_and_mul", "softmax"] for batched in (False, True)]
    print(f"per window, {rows[0]['calls']} calls, on {args.device} (ops: aten ops dispatched; writes: those no view;"
          " draw: each call's inputs drawn on its own, or all calls' at once; xK: the bytes those ops read and write,"
          " as a multiple of what the calls themselves move by the task's roofline)")
    print(f"{'task':<20} {'shape':<16} {'draw':<9} {'fill ms':>8} {'fill ops':>9} {'writes':>7} {'xK':>6} "
          f"{'verify ms':>10} {'verify ops':>11} {'writes':>7} {'xK':>6}")
    for r in rows:
        print(f"{r['task']:<20} {r['shape']:<16} {r['draw']:<9} {r['fill_ms']:>8.1f} {r['fill_ops']:>9} {r['fill_writes']:>7} "
              f"{_times(r['fill_x']):>6} {r['verify_ms']:>10.1f} {r['verify_ops']:>11} {r['verify_writes']:>7} {_times(r['verify_x']):>6}")
    for r in rows:
        print(f"{r['task']} ({r['draw']}): fill {r['top_fill']}; verify {r['top_verify']}")


if __name__ == "__main__":
    main()
