"""torch.compile's baselines compiled ahead: a trusted process that compiles a task's reference
at its timed shapes exactly as the reference worker will (``refworker._compiled``: static
sizes, the baseline's layout, one call), so that the reference worker's own compile later finds
Inductor's graph and Triton's kernels in the trusted compiler cache (WorkerSpec.trusted_cache)
instead of spending seconds of code generation inside a task's first verdict.

Run by the loop (loop/compile_ahead.py) with the reference worker's environment, several at once
on the CPU cores while the GPU verifies. It reads one JSON request per line on stdin (the
reference worker's ``compile_baseline`` message) and answers one JSON line per request. Nothing
it says is evidence: a compile it failed or never made is made by the reference worker as before.

It runs GPU work only while its parent holds the GPU's gate shared for it (``_gpu_held``: the
weights' and inputs' draw, the compiled graph's first run, the judge's own kernels), never
inside a timed phase; Inductor's code generation in between holds nothing, so a verdict's timed
phases no longer wait seconds behind it (on the H200, 28 s of a 57 s first verdict were that wait).

A request ``{"op": "judge_kernels"}`` builds the judge's own comparison kernels for the dtypes
tasks produce (``judge_kernels``), which a first verdict would otherwise compile in its checks.

Usage: python -m kernforge.verifier.compile_ahead DEVICE
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Callable, ContextManager, Iterator

from kernforge.tasks.spec import Shape


#: (output, reference, eager reference) dtypes the judge's comparison kernels meet: 16-bit outputs
#: against float32, float32 against float64 (KernelBench) or float32 (an fp8 task's scales), fp8
DTYPES = (("bfloat16", "float32", "bfloat16"), ("float16", "float32", "float16"), ("float32", "float64", "float32"),
          ("float32", "float32", "float32"), ("float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"),
          ("float8_e4m3fn", "float32", "float8_e4m3fn"))


def judge_kernels(device: str, held: Callable[[], ContextManager[None]]) -> None:
    """The judge's own comparison kernels (compare_kernel.py), built and self-checked once for
    each dtype combination, so that a task's first verdict finds them in the trusted cache; the
    GPU held (``held``) for one combination at a time: a timed phase waits for one build and
    self-check, not all six (held for all of them at once, a night's first verdict waited 12.7 s
    at the gate and a second run's first audit 19.8 s, H100, session 56)."""
    import torch

    from . import compare_kernel

    if not device.startswith("cuda"):
        return
    for names in DTYPES:
        with held():
            c, h, lo = (torch.zeros(2, 8, device=device).to(getattr(torch, n)) for n in names)
            compare_kernel.applies(c, h, lo)
            torch.cuda.synchronize(torch.device(device))


#: the nice value this process compiles at: a head start only, it must not take the host's cores
#: from the judges' own steps, which bound a one-lane run (the GPU busy a third of it), nor delay a
#: candidate's wake-up inside a timed window, which its clock counts. Its Inductor compile workers
#: inherit it. (On an H100, session 64, with the host's cores a third busy, the niced and unniced
#: runs made verdicts as fast: what it does for the times recorded while a first run compiles
#: everything is not yet measured.)
NICE = 10
#: the nice values this process holds the GPU's gate at and compiles at (``_background``)
_LEVELS = {"held": 0, "compiling": 0}


def _background() -> None:
    """This process, and all it starts, at ``NICE``, or as nice as it was if more; the gate is
    held at the nice value it started with."""
    with contextlib.suppress(OSError):
        start = os.getpriority(os.PRIO_PROCESS, 0)
        os.nice(max(NICE - start, 0))
        _LEVELS.update(held=start, compiling=max(NICE, start))


def _at(level: str) -> None:
    """The calling thread's nice value (per thread on Linux) for ``level``, where it may be set:
    raising the priority needs root, and without it the thread keeps its own."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, _LEVELS[level])


@contextlib.contextmanager
def _gpu_held() -> Iterator[None]:
    """The GPU's gate, held by the parent for this process (loop/compile_ahead.py): asked for with
    a line ``{"gpu": true}``, given with a line ``go``, let go with ``{"gpu": false}`` once the
    GPU work inside is finished (``refworker._compiled`` syncs before it leaves). While it is
    asked for and held the thread runs at the normal priority: a timed phase waits for it."""
    _at("held")
    print(json.dumps({"gpu": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("compile ahead: the parent did not give the GPU")
    try:
        yield
    finally:
        print(json.dumps({"gpu": False}), flush=True)
        _at("compiling")


#: a shape whose one call moves more than this share of the GPU's memory is left to the judge:
#: compiled ahead, its draw took GBs beside a verdict's arena (on the H100 KernelBench's ReLU drew
#: 6 GiB of inputs while the verdicts prepared theirs, and both ran out of memory), for a few
#: seconds of code generation saved (4.9 GiB on an H100: every built-in shape, fused_moe's 3.3 GiB the largest, still goes ahead)
AHEAD_SHARE = 1 / 16


def call_bytes(task_ref: str, shape: Shape) -> int | None:
    """What one call of ``task_ref`` at ``shape`` moves, without drawing it: a built-in task's
    roofline bytes, or a KernelBench problem's inputs and weights made on the meta device; None
    where neither can be told (the shape is compiled ahead as before)."""
    import torch

    from kernforge.tasks import runtime
    from kernforge.tasks.loader import load_task

    task = load_task(task_ref)
    try:
        line = runtime.roofline(task, shape, task.dtype("cuda"))
        if line is not None:
            return int(line.bytes)
        module = runtime.reference_module(task)
        runtime.set_shape(module, shape)
        with torch.device("meta"):
            inputs = module.get_inputs()
            model = module.Model(*runtime.make_init_inputs(task, shape))
    except Exception:  # noqa: BLE001 - a draw the meta device cannot make: not told
        return None
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if isinstance(model, torch.nn.Module):
        tensors += [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def too_large(nbytes: int | None, memory_bytes: int) -> str | None:
    """Why a call of ``nbytes`` is left to the judge on a GPU of ``memory_bytes``, or None."""
    if nbytes is None or nbytes <= AHEAD_SHARE * memory_bytes:
        return None
    return (f"left to the judge: a call moves {nbytes / (1 << 30):.1f} GiB, more than 1/{round(1 / AHEAD_SHARE)} of the "
            "GPU's memory, too much to draw beside the verdicts")


def main() -> None:
    _background()  # before torch starts a thread: each inherits it
    from . import refworker

    device = sys.argv[1] if len(sys.argv) > 1 else "cuda:0"
    refworker.warm_up()  # the reference worker's precision settings: part of what a compile is keyed by
    while line := sys.stdin.readline():
        msg = json.loads(line)
        t0 = time.perf_counter()
        if msg.get("op") == "judge_kernels":
            judge_kernels(device, _gpu_held)
            print(json.dumps({"seconds": round(time.perf_counter() - t0, 3), "error": None}), flush=True)
            continue
        if device.startswith("cuda"):
            import torch

            why = too_large(call_bytes(msg["task_ref"], Shape.of(msg["shape"])),
                            torch.cuda.get_device_properties(torch.device(device)).total_memory)
            if why is not None:
                print(json.dumps({"seconds": 0.0, "error": why}), flush=True)
                continue
        with _gpu_held():  # the task's weights are drawn on the GPU
            model = refworker._model(msg["task_ref"], Shape.of(msg["shape"]), int(msg["init_seed"]), device)
        compiled = refworker._compiled(msg, model, device, held=_gpu_held)
        refworker._MODELS.clear()
        model = compiled.fn = None
        if device.startswith("cuda"):  # between compiles it holds no more of the GPU than its context
            import torch

            with _gpu_held():
                torch.cuda.empty_cache()
        error = None if compiled.error is None else f"{type(compiled.error).__name__}: {str(compiled.error)[:300]}"
        print(json.dumps({"seconds": round(compiled.seconds, 3), "error": error}), flush=True)


if __name__ == "__main__":
    main()
