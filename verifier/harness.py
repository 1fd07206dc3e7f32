"""The candidate's side of verification: runs inside a sandbox worker, next to untrusted code.

``warm_up`` runs before any candidate exists in the process: it imports torch and Triton,
creates the CUDA context, binds the original functions the harness will call (integrity.py),
wraps Triton's launchers for the trace, and records the identity of everything a candidate
might patch. ``run`` then serves the judge's requests one at a time:

* ``load``: write and import the candidate, report import errors and any tampering.
* ``check``: draw inputs from the (shape, distribution, seed) the judge reveals now, poison
  freed device memory, call the model once under the trace, report facts about the call, and
  write the outputs to files in the worker's private directory for the judge to compare.
* ``time`` / ``throughput``: timed calls (timing.py), their outputs and checksums.

Nothing here decides anything. Every reply is data for the judge, who treats it as untrusted:
the candidate shares this process and could forge any of it, which is why the decisive facts
(output values, input fingerprints, wall-clock bounds) are re-derived on the judge's side.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

_STATE: dict[str, Any] = {}
POISON_BYTE = 0xFF  # all-ones: a NaN in every float format, and no kernel's canonical NaN
MODULE_NAME = "kernforge_candidate"

#: how long after the device sync an output must stay unchanged (host threads writing late, #6)
LATE_WRITE_PAUSE_S = 0.02


def warm_up() -> None:
    """Trusted start-up, before any candidate code: called by the sandbox worker."""
    import torch
    import torch._dynamo  # noqa: F401  (it rewraps torch.manual_seed & co. on import: do it now)
    import torch.profiler  # noqa: F401
    import triton  # noqa: F401  (imported now so its modules are snapshotted as they will stay)

    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")  # create the context now, not on the candidate's clock
        _first_triton_launch()
    from . import digest, integrity, tensorio, timing, trace  # noqa: F401  (bind originals)

    trace.install_launch_hooks()
    _record_thread_starts()
    _STATE["snapshot"] = integrity.snapshot()
    _STATE["threads"] = {t.ident for t in threading.enumerate()}


def _first_triton_launch() -> None:
    """Compile and launch one trivial kernel: Triton builds its launcher utilities once per
    cache directory (each worker has a private one), which must not land on a candidate."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _warm(x_ptr):
        tl.store(x_ptr + tl.arange(0, 16), tl.arange(0, 16))

    x = torch.empty(16, dtype=torch.int32, device="cuda")
    _warm[(1,)](x)
    torch.cuda.synchronize()


def run(channel: Any, payload: dict[str, Any]) -> None:
    """Serve the judge until it says ``done``."""
    if "snapshot" not in _STATE:
        warm_up()
    handlers = {"load": _load, "check": _check, "time": _time, "throughput": _throughput}
    while True:
        msg = channel.recv()
        op = msg.get("op")
        if op == "done":
            channel.send({"op": "done", "ok": True})
            return
        handler = handlers.get(op)
        if handler is None:
            channel.send({"op": op, "ok": False, "stage": "protocol", "error": f"unknown op {op!r}"})
            continue
        try:
            reply = handler(payload, msg)
        except BaseException as err:  # the candidate's failure, reported with its traceback
            reply = {"ok": False, "stage": _stage_of(err), "error": _format_error(err)}
        reply["op"] = op
        channel.send(reply)


# ---- requests ---------------------------------------------------------------------------------
def _load(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    from kernforge.tasks.loader import unbundle

    from . import integrity

    # The task arrives as text: its own path may not be visible inside the sandbox.
    _STATE["task"] = unbundle(payload["task"], Path(os.getcwd()) / "task")
    _STATE["device"] = payload["device"]
    _STATE["init_seed"] = int(payload["init_seed"])
    _STATE["models"] = {}
    path = Path(os.getcwd()) / "candidate.py"
    path.write_text(payload["source"])
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        return {"ok": False, "stage": "compile", "error": _format_error(err)}
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        return {"ok": False, "stage": "compile", "error": "the module defines no class `ModelNew`"}
    _STATE["ModelNew"] = model_new
    return {"ok": True, "tampered": integrity.tampered(_STATE["snapshot"]), "new_threads": _new_threads()}


def _model_for(shape: Any) -> Any:
    from kernforge.tasks import runtime

    key = shape.params
    if key not in _STATE["models"]:
        task = _STATE["task"]
        init = runtime.make_init_inputs(task, shape)
        _STATE["models"][key] = runtime.build_model(_STATE["ModelNew"], init, _STATE["init_seed"], _STATE["device"])
    return _STATE["models"][key]


def _inputs(shape: Any, dist: str, seed: int) -> list[Any]:
    from kernforge.tasks import runtime

    return runtime.make_inputs(_STATE["task"], shape, dist, seed, _STATE["device"])


def _check(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from kernforge.tasks.spec import Shape

    from . import digest, integrity as I, tensorio, trace

    task = _STATE["task"]
    device = _STATE["device"]
    on_gpu = device.startswith("cuda")
    shape = Shape.of(msg["shape"])
    steps = _Steps()
    model = _model_for(shape)
    inputs = _inputs(shape, msg["dist"], int(msg["seed"]))
    steps.mark("inputs")
    input_shapes = [list(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
    if on_gpu:
        _poison(msg.get("poison_bytes", []), device)
        _l2().reset_persisting()  # the limit is device-wide: clear what an earlier process left
    threads_before = _native_threads()
    kernels: list[str] = []
    with trace.recording() as rec:
        if on_gpu:
            with trace.gpu_kernels() as kernels:
                result = model(*inputs)
        else:
            result = model(*inputs)
    steps.mark("call")
    returned = list(result) if isinstance(result, (tuple, list)) else ([] if result is None else [result])
    types = [f"{I.type_(r).__module__}.{I.type_(r).__qualname__}" for r in returned]
    if not all(I.type_(r) is I.Tensor for r in returned):
        return {"ok": True, "types": types, "outputs": []}
    outputs = returned + [inputs[i] for i in task.mutated_inputs]
    # Fingerprint right after return, then again after a device sync and a pause: a value that
    # changes in between was written by work the call left running (#5, #6). The outputs are
    # written out during the pause; a late write makes the files moot, since it rejects the call.
    first = [I.tensor_clone(o) for o in outputs]
    I.synchronize()
    synced = I.perf_counter()
    steps.mark("settle")
    files = []
    for j, out in enumerate(outputs):
        # one of two files per output, alternating: the judge reads the other meanwhile
        files.append(tensorio.write_tensor(Path(os.getcwd()) / f"out_s{int(msg.get('slot', 0)) % 2}_{j}.bin", out))
    steps.mark("write")
    I.sleep(max(0.0, LATE_WRITE_PAUSE_S - (I.perf_counter() - synced)))
    late = [not I.bits_equal(a, o) for a, o in zip(first, outputs)]
    aliases = _aliases(returned, inputs)
    digests = [digest.digest(x) if isinstance(x, torch.Tensor) else None for x in inputs]
    steps.mark("settle")

    pinned = _l2().persisting_limit() if on_gpu else None
    repeat = []
    if msg.get("repeat", True):
        again_inputs = _inputs(shape, msg["dist"], int(msg["seed"]))
        again = model(*again_inputs)
        again_list = list(again) if isinstance(again, (tuple, list)) else ([] if again is None else [again])
        again_list += [again_inputs[i] for i in task.mutated_inputs]
        I.synchronize()
        for a, b in zip(outputs, again_list):
            same = I.type_(b) is I.Tensor and a.shape == b.shape and a.dtype == b.dtype
            diff = float((a.double() - b.double()).abs().max()) if same and a.numel() and a.is_floating_point() else 0.0
            diff = diff if diff == diff else float("inf")  # NaN in different places: a difference
            repeat.append({"equal": bool(same and I.bits_equal(a, b)), "max_diff": diff, "comparable": same})
        steps.mark("repeat")
    return {
        "ok": True,
        "types": types,
        "outputs": files,
        "late_writes": late,
        "aliases": aliases,
        "input_digests": digests,
        "input_shapes": input_shapes,
        "torch_ops": dict(rec.ops),
        "launches": dict(rec.launches),
        "gpu_kernels": sorted(set(kernels)),
        "new_threads": _new_threads(),
        "native_threads_delta": _native_threads() - threads_before,
        "repeat": repeat,
        "l2_persisting_limit": pinned,
        "tampered": I.tampered(_STATE["snapshot"]),
        "steps": steps.seconds,
    }


def _l2() -> Any:
    import torch

    from . import timing

    if "l2" not in _STATE:
        _STATE["l2"] = timing.L2Control(torch.device(_STATE["device"]))
    return _STATE["l2"]


def _time(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    from kernforge.tasks.spec import Shape

    from . import integrity as I, tensorio, timing

    task = _STATE["task"]
    shape = Shape.of(msg["shape"])
    steps = _Steps()
    model = _model_for(shape)
    sets = [_inputs(shape, s["dist"], int(s["seed"])) for s in msg["sets"]]
    steps.mark("inputs")
    reps = int(msg.get("reps", 100))
    if _STATE["device"].startswith("cuda"):
        rng = random.Random(int(msg["order_seed"]))
        timed, finals = timing.time_on_gpu(
            model, sets, task.mutated_inputs, reps, _l2(), rng, use_graph=bool(msg.get("use_graph", True))
        )
    else:
        timed, last = timing.time_on_cpu(model, sets[0], task.mutated_inputs, reps)
        finals = [last]
    steps.mark("timing")
    files = []
    for k, outs in enumerate(finals):
        files.append([
            tensorio.write_tensor(Path(os.getcwd()) / f"time_{k}_{j}.bin", o) for j, o in enumerate(outs)
        ])
    steps.mark("write")
    return {
        "ok": True,
        "mode": timed.mode,
        "times_us": timed.times_us,
        "order": timed.order,
        "checksums": timed.checksums,
        "fallback_reason": timed.fallback_reason,
        "graph_kernels": timed.graph_kernels,
        "l2_persisting_limit": timed.persisting_after,
        "outputs": files,
        "steps": steps.seconds,
        "tampered": I.tampered(_STATE["snapshot"]),
        "new_threads": _new_threads(),
    }


def _throughput(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    from kernforge.tasks.spec import Shape

    from . import timing

    shape = Shape.of(msg["shape"])
    model = _model_for(shape)
    inputs = _inputs(shape, msg["dist"], int(msg["seed"]))
    calls = timing.throughput_on_gpu(model, inputs, _STATE["task"].mutated_inputs, int(msg["calls"]), int(msg["unroll"]))
    return {"ok": True, "calls": calls}


# ---- helpers ----------------------------------------------------------------------------------
class _Steps:
    """Seconds per step of one request, for the judge's time breakdown (diagnostics only)."""

    def __init__(self) -> None:
        from . import integrity as I

        self._clock = I.perf_counter
        self._last = self._clock()
        self.seconds: dict[str, float] = {}

    def mark(self, step: str) -> None:
        now = self._clock()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._last
        self._last = now


def _poison(sizes: list[int], device: str) -> None:
    """Fill blocks the caching allocator will hand out next with all-ones bytes, then free
    them: an output the candidate allocates but never writes shows the poison (#1, #19)."""
    import torch

    from . import integrity as I

    blocks = [torch.full((int(n),), POISON_BYTE, dtype=torch.uint8, device=device) for n in sizes if n > 0]
    # Any other free block the allocator caches may be handed out instead (best fit, lowest
    # address first), holding an earlier call's data: take every one of them too, largest first.
    index = torch.device(device).index or 0
    free = [b["size"] for seg in I.memory_snapshot() if seg.get("device") == index
            for b in seg.get("blocks", []) if b.get("state") == "inactive"]
    for n in sorted(free, reverse=True):
        blocks.append(torch.full((int(n),), POISON_BYTE, dtype=torch.uint8, device=device))
    del blocks


def _aliases(returned: list[Any], inputs: list[Any]) -> list[list[int]]:
    """For each returned tensor, the inputs whose storage it overlaps (#17)."""
    import torch

    def span(t: torch.Tensor) -> tuple[int, int]:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.data_ptr() + storage.nbytes()

    result = []
    for out in returned:
        lo, hi = span(out)
        hits = []
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.numel() and out.numel():
                xlo, xhi = span(x)
                if lo < xhi and xlo < hi:
                    hits.append(i)
        result.append(hits)
    return result


def _record_thread_starts() -> None:
    """Remember every thread started from Python, even one that has already finished (#6)."""
    started: list[str] = _STATE.setdefault("started", [])
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        return original(self)

    threading.Thread.start = start


def _new_threads() -> list[str]:
    known = _STATE.get("threads", set())
    alive = {t.name for t in threading.enumerate() if t.ident not in known}
    return sorted(alive | set(_STATE.get("started", [])))


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _stage_of(err: BaseException) -> str:
    name = type(err).__name__
    text = str(err)
    if name in ("CompilationError", "CompileTimeAssertionFailure", "PTXASError") or "Error building extension" in text:
        return "compile"
    if isinstance(err, MemoryError) or "out of memory" in text.lower():
        return "oom"
    return "runtime"


def _format_error(err: BaseException, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return text if len(text) <= limit else "...\n" + text[-limit:]
