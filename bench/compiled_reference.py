"""Would a compiled stacked reference make a timed window's verification cheaper? Per task and
shape, a window's worth of calls (``--window-ms`` of them at the roofline's rate, 2 to 512) run
through the stacked reference's derived answers (reference_batched.py: the task's reference under
vmap, eagerly, an op at a time, its high answer rounded for the low one), against the same under
torch.compile as the judge runs it with ``KERNFORGE_COMPILED_REFERENCE=1``
(verifier/reference_compiled.py: one graph per shape for any number of calls, where the reference
lets it). Also the window's fresh draw (runtime.make_many) for scale.

Eagerly, a float32 reference over bf16 inputs reads and writes every intermediate: silu_and_mul's
moves about seven times what the kernel does, so at the large shapes a window's verification is
bound by memory traffic, not launches. A fused graph moves the inputs once and the answer once.

    python bench/compiled_reference.py --tasks silu_and_mul rms_norm --device cuda:0

Columns: calls; the draw's ms; the eager reference's ms; the compiled one's ms and its compile's
seconds (the first call at that shape); whether the compiled answer lies within the stacked
reference's own bound of the eager one (reference_batched._close: CLOSE of the tolerance or one
step of the dtype).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import torch

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier import reference, reference_batched, reference_compiled, refworker
from kernforge.verifier.judge import JudgeOptions


def _ms(fn: Any, device: str, repeats: int = 5) -> float:
    """Median wall milliseconds of ``fn()`` synced (its first call is a warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize(device) if device.startswith("cuda") else None
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device) if device.startswith("cuda") else None
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(name: str, which: str, window_ms: float, gbps: float, device: str) -> dict[str, Any]:
    task = load_task(name)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    shapes = list(task.shapes(kind, hidden=False))
    shape = runtime.largest_shape(task, kind) if which == "largest" else shapes[0]
    line = runtime.roofline(task, shape, task.dtype(kind))
    per_call_us = max(line.bytes / (gbps * 1e3) if line is not None else 4.0, 4.0)
    calls = int(max(2, min(512, math.ceil(window_ms * 1e3 / per_call_us))))
    dist = task.distributions[0]
    row: dict[str, Any] = {"task": name, "shape": shape.label, "calls": calls}
    draw = lambda: runtime.make_many(task, shape, dist, 7, calls, device)  # noqa: E731
    stacked = draw()
    if stacked is None:
        return {**row, "note": "the draw cannot be batched"}
    row["draw_ms"] = _ms(draw, device)
    model = refworker._model(task.ref, shape, 3, device)
    first = runtime.make_inputs(task, shape, dist, 7, device)
    hi_model, _, low = reference.decide_wider(model, first, task.mutated_inputs)
    if hi_model is None:
        return {**row, "note": "the reference runs no wider: its low answer is run"}
    values = [None if isinstance(x, torch.Tensor) else x for x in first]
    positions = [i for i, x in enumerate(first) if isinstance(x, torch.Tensor)]
    dtypes = [lo.dtype for lo in low]
    args = (values, positions, list(task.mutated_inputs))

    def eager() -> Any:  # the stacked reference's own derived answers, uncompiled
        high = reference_compiled._stacked(hi_model, *args, *stacked)
        return high, [h.to(d) for h, d in zip(high, dtypes)]

    with torch.no_grad():
        row["eager_ms"] = _ms(eager, device)
        want = eager()
        t0 = time.perf_counter()
        try:
            got = reference_compiled.run(model, hi_model, *args, dtypes, stacked)
        except Exception as err:  # noqa: BLE001 - any failure to compile is a row's note
            return {**row, "note": f"torch.compile failed: {type(err).__name__}: {str(err)[:160]}"}
        row["compile_s"] = time.perf_counter() - t0
        row["compiled_ms"] = _ms(lambda: reference_compiled.run(model, hi_model, *args, dtypes, stacked), device)
        tolerances = [refworker._tolerance(lo, task.tolerance_table()) for lo in low]
        row["close"] = all(reference_batched._close([h[k] for h in got[0]], [h[k] for h in want[0]], tolerances)
                           and reference_batched._close([lo[k] for lo in got[1]], [lo[k] for lo in want[1]], tolerances)
                           for k in sorted({0, calls - 1}))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["silu_and_mul", "rms_norm", "softmax", "fused_add_rms_norm", "rotary_embedding"])
    parser.add_argument("--shapes", nargs="+", choices=("largest", "smallest"), default=["largest", "smallest"])
    parser.add_argument("--window-ms", type=float, default=JudgeOptions.batch_window_ms,
                        help=f"a long timed batch's length at the roofline's rate (default {JudgeOptions.batch_window_ms:g}, the judge's)")
    parser.add_argument("--gbps", type=float, default=3000.0, help="the memory bandwidth the roofline's rate assumes")
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    print(f"a window of {args.window_ms:g} ms at {args.gbps:g} GB/s, on {args.device}")
    print(f"{'task':<22} {'shape':<28} {'calls':>5} {'draw ms':>8} {'eager ms':>9} {'compiled ms':>12} {'compile s':>10} close")
    for name in args.tasks:
        for which in args.shapes:
            try:
                r = measure(name, which, args.window_ms, args.gbps, args.device)
            except Exception as err:  # noqa: BLE001 - one task's failure is its row
                r = {"task": name, "shape": which, "calls": 0, "note": f"{type(err).__name__}: {str(err)[:160]}"}
            if "note" in r:
                print(f"{r['task']:<22} {r['shape']:<28} {r['calls']:>5} {r['note']}")
                continue
            print(f"{r['task']:<22} {r['shape'][:28]:<28} {r['calls']:>5} {r['draw_ms']:>8.2f} {r['eager_ms']:>9.2f} "
                  f"{r['compiled_ms']:>12.2f} {r['compile_s']:>10.1f} {r['close']}")


if __name__ == "__main__":
    main()
