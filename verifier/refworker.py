"""The judge's reference worker: trusted, long-lived, one per device; never runs candidate code.

It computes reference outputs (high precision and task dtype) for the (shape, distribution,
seed) the judge names, fingerprints the pristine inputs, compares candidate output files with
the references on the device, and times the PyTorch baselines (eager and torch.compile) and the
hardware ceilings with the same timing code the candidate is timed with. Expected outputs live
only here (THREATS #1, #10): the candidate's process never holds them.
"""

from __future__ import annotations

import random
import time
from typing import Any

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape, Tolerance

_REFS: dict[str, Any] = {}
_MODELS: dict[tuple, Any] = {}
_COMPILED: dict[tuple, Any] = {}


_WARM = []


def warm_up() -> None:
    import torch

    from . import reference

    if _WARM:
        return
    _WARM.append(True)

    reference.strict_precision()
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")


def run(channel: Any, payload: dict[str, Any]) -> None:
    warm_up()
    device = payload["device"]
    handlers = {
        "reference": _reference,
        "compare": _compare,
        "drop": _drop,
        "checksum": _checksum,
        "baseline": _baseline,
        "ceilings": _ceilings,
        "environment": _environment,
    }
    while True:
        msg = channel.recv()
        op = msg.get("op")
        if op == "done":
            channel.send({"op": "done", "ok": True})
            return
        try:
            reply = handlers[op](device, msg)
            reply.setdefault("ok", True)
        except KeyError as err:
            reply = {"ok": False, "error": f"unknown op or field: {err}"}
        except Exception as err:  # a task's own bug: reported to the judge, which reports it
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        reply["op"] = op
        channel.send(reply)


def _model(task_ref: str, shape: Shape, init_seed: int, device: str) -> Any:
    key = (task_ref, shape.params, init_seed)
    if key not in _MODELS:
        task = load_task(task_ref)
        module = runtime.reference_module(task)
        _MODELS[key] = runtime.build_model(module.Model, runtime.make_init_inputs(task, shape), init_seed, device)
    return _MODELS[key]


def _reference(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from . import digest, reference, timing

    task = load_task(msg["task_ref"])
    shape = Shape.of(msg["shape"])
    model = _model(msg["task_ref"], shape, int(msg["init_seed"]), device)
    inputs = runtime.make_inputs(task, shape, msg["dist"], int(msg["seed"]), device)
    digests = [digest.digest(x) if isinstance(x, torch.Tensor) else None for x in inputs]
    high, low = reference.run_reference(model, inputs, task.mutated_inputs)
    _REFS[msg["key"]] = (high, low)
    return {
        "outputs": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in low],
        "input_digests": digests,
        "input_shapes": [list(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs],
        "output_bytes": [t.numel() * t.element_size() for t in low],
        "checksums": [[float(v) for v in c.tolist()] for c in timing.checksum(low)],
    }


def _compare(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from . import compare, tensorio, timing

    high, low = _REFS.pop(msg["key"])  # one comparison per reference, whatever it finds
    files = msg["files"]
    if len(files) != len(low):
        return {"results": [], "count_mismatch": f"{len(files)} outputs, the reference has {len(low)}"}
    results = []
    read_s = 0.0
    for j, (meta, h, lo) in enumerate(zip(files, high, low)):
        expect_dtype = str(lo.dtype).removeprefix("torch.")
        t0 = time.perf_counter()
        try:
            cand = tensorio.read_tensor(meta["file"], expect_dtype=expect_dtype, expect_shape=list(lo.shape), device=device)
        except (tensorio.TensorFileError, KeyError, TypeError) as err:
            results.append({"output": j, "ok": False, "unreadable": str(err)})
            continue
        finally:
            read_s += time.perf_counter() - t0
        tol = Tolerance(**msg["tolerances"].get(expect_dtype, msg["tolerances"]["default"]))
        mism = compare.compare(cand, h, tol, low=lo)
        entry = {"output": j, **mism.to_dict()}
        entry["checksum"] = [float(v) for v in timing.checksum([cand])[0].tolist()]
        hf = h.to(device).double()
        finite = hf[torch.isfinite(hf)]
        if finite.numel():  # the largest error the tolerance allows anywhere: bounds repeat drift
            entry["allowed_abs"] = float(tol.rtol * finite.abs().max() + tol.atol * finite.pow(2).mean().sqrt())
        if not mism.ok:
            entry["never_written"] = int((cand.contiguous().view(torch.uint8).reshape(cand.numel(), -1) == 0xFF).all(dim=1).sum()) if cand.numel() else 0
            entry["zeros_where_ref_nonzero"] = int(((cand == 0) & (h.to(device) != 0)).sum()) if cand.is_floating_point() else 0
            entry["lowered_precision"] = _lowered_precision(cand, h)
        results.append(entry)
    return {"results": results, "steps": {"read": read_s}}


def _lowered_precision(cand: Any, high: Any) -> str | None:
    """Name the precision the candidate's error looks like, if it looks like one (#15).

    An honest fp32 kernel errs by a few float32 roundings (~1e-7 relative). Errors spread over
    most elements at about tf32's (2^-11) or bf16's (2^-8) unit roundoff mean the work was done
    at that precision.
    """
    import torch

    if not cand.is_floating_point() or cand.dtype not in (torch.float32, torch.float64, torch.float16):
        return None
    c = cand.double()
    h = high.to(c.device).double()
    finite = torch.isfinite(c) & torch.isfinite(h)
    if finite.sum() < 16:
        return None
    scale = h[finite].pow(2).mean().sqrt().clamp_min(1e-30)
    rel = ((c - h).abs() / (h.abs() + 1e-3 * scale))[finite]
    median, worst = float(rel.median()), float(rel.max())
    if worst > 2**-4:  # far beyond any rounding: a plain wrong answer, not a precision choice
        return None
    if cand.dtype != torch.float16 and 2**-14 <= median:
        return "bf16" if median >= 2**-11 else "tf32"
    return None


def _checksum(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Checksums of output files, for diagnosis (no reference involved)."""
    from . import tensorio, timing

    sums = []
    for meta in msg["files"]:
        try:
            t = tensorio.read_tensor(meta["file"], device=device)
        except (tensorio.TensorFileError, KeyError, TypeError):
            sums.append(None)
            continue
        sums.append([float(v) for v in timing.checksum([t])[0].tolist()])
    return {"checksums": sums}


def _drop(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    _REFS.pop(msg["key"], None)
    return {}


def _baseline(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Eager and torch.compile of the reference, timed like a candidate."""
    import torch

    from . import timing

    task = load_task(msg["task_ref"])
    shape = Shape.of(msg["shape"])
    model = _model(msg["task_ref"], shape, int(msg["init_seed"]), device)
    sets = [runtime.make_inputs(task, shape, s["dist"], int(s["seed"]), device) for s in msg["sets"]]
    reps = int(msg.get("reps", 100))
    out: dict[str, Any] = {}
    if not device.startswith("cuda"):
        return {"eager": timing.time_on_cpu(model, sets[0], task.mutated_inputs, 2)[0].summary()}
    l2 = timing.L2Control(torch.device(device))
    rng = random.Random(0)
    eager, _ = timing.time_on_gpu(model, sets, task.mutated_inputs, reps, l2, rng)
    out["eager"] = eager.summary()
    key = (msg["task_ref"], shape.params, int(msg["init_seed"]))
    try:
        if key not in _COMPILED:
            _COMPILED[key] = torch.compile(model)
        t0 = time.perf_counter()
        compiled, _ = timing.time_on_gpu(_COMPILED[key], sets, task.mutated_inputs, reps, l2, rng)
        out["compile"] = compiled.summary()
        out["compile"]["compile_seconds"] = time.perf_counter() - t0
    except Exception as err:  # a reference torch.compile cannot handle: report, do not fail
        out["compile"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    return out


def _ceilings(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Copy bandwidth (bytes read + written) and bf16 matmul rate of this GPU, measured."""
    import torch

    if not device.startswith("cuda"):
        return {"bandwidth_gbps": None, "tflops": None}
    from . import integrity as I

    def median_ms(fn: Any, reps: int) -> float:
        for _ in range(3):
            fn()
        starts = [I.Event(enable_timing=True) for _ in range(reps)]
        ends = [I.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        I.synchronize()
        times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        return times[len(times) // 2]

    n = 1 << 30  # 1 GiB each way: far beyond L2
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), 20)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: a @ b, 20)
    return {"bandwidth_gbps": 2 * n / copy_ms / 1e6, "tflops": 2 * m**3 / mm_ms / 1e9}


def _environment(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    from . import environment

    return {"environment": environment.describe(device)}
