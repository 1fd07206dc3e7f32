"""The judge's reference worker: trusted, long-lived, one per device; never runs candidate code.

It owns the shared arena (arena.py) and is the only process that writes inputs into it and reads
outputs out of it for a verdict. For each checked call it draws the inputs itself from a seed
only it and the judge know, writes them into the arena, computes the reference (high precision
and the task's dtype) and keeps it; after the candidate's call it snapshots the outputs where
they lie, compares every element, checks that no input changed, reads the outputs again a moment
later (late writes), and compares a repeated call with the first (THREATS #1-#4, #6, #11-#15,
#19). Expected outputs live only here: the candidate's process never holds them.

For a timed batch it draws fresh inputs for every call, then clocks the batch with its own CUDA
events: from before its write of the inputs into the arena until its own probe of the outputs has
run, after the candidate said done through a socket of their own. The window less the write's
floor, over the number of calls whose outputs it then verifies one by one, is the time of
record. It also times the PyTorch baselines the same way, and measures the hardware ceilings.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape, Tolerance

from . import host_load, late_reads
from .laps import Laps

_MODELS: dict[tuple, Any] = {}
#: tasks loaded during this verdict, by reference (``_task``)
_TASKS: dict[str, Any] = {}
_STATE: dict[str, Any] = {}
_WARM: list[bool] = []

#: elements of each output read right after a batch's "done" (the probe)
PROBE_ELEMENTS = 32
#: the write's floor uses this much headroom over the fastest write measured on this GPU
WRITE_HEADROOM = 1.01


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
    _STATE.update(channel=channel, device=device, calls={}, history={}, batches={})
    handlers = {
        "sizes": _sizes, "arena": _arena, "batch_socket": _batch_socket, "prepare": _prepare, "compare": _compare,
        "drop": _drop, "plan_batch": _plan_batch, "time_batch": _time_batch, "verify_batch": _verify_batch,
        "baseline": _baseline, "compile_baseline": _compile_baseline, "ceilings": _ceilings, "environment": _environment, "forget": _forget,
        "calibrate": _calibrate, "memory": _memory, "settle": _settle,
    }
    profiler = _profiler()
    while True:
        msg = channel.recv()
        op = msg.get("op")
        if op == "done":
            channel.send({"op": "done", "ok": True})
            return
        try:
            reply = handlers[op](device, msg) if profiler is None else profiler.runcall(op, handlers[op], device, msg)
            reply.setdefault("ok", True)
        except KeyError as err:
            reply = {"ok": False, "error": f"unknown op or field: {err}"}
        except Exception as err:  # a task's own bug, or a layout the judge should have refused
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        if op in DESCRIPTOR_REPLIES and not reply["ok"]:
            # the judge reads the descriptor channel first: an empty message there, then the error
            # (else it waits out its message timeout, ten minutes, for descriptors never sent)
            channel.send_fds([], "failed")
        reply["op"] = op
        if profiler is not None and op == "forget":  # a verdict's end: the record so far (the judge may kill it at "done")
            profiler.dump(Path(os.environ[PROFILE_ENV]))
        channel.send(reply)


#: a folder: each reference worker profiles its requests and writes its record there at the end
#: of every verdict (bench/, where a verdict's seconds go; never set in a run). The profiler's own
#: cost falls on every call it sees: a profiled verdict's seconds are not a figure
PROFILE_ENV = "KERNFORGE_REFWORKER_PROFILE"
#: which profiler: "cprofile" (the default: Python's, every function's seconds) or "torch"
#: (torch.profiler: each request's and each op's host time beside its kernels' device time, which
#: says whether a step is bound by the GPU or by launching its kernels)
PROFILER_ENV = "KERNFORGE_REFWORKER_PROFILER"


class _PythonProfile:
    """cProfile over each request; a ``.prof`` record per worker."""

    def __init__(self) -> None:
        import cProfile

        self._profile = cProfile.Profile()

    def runcall(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        return self._profile.runcall(fn, *args)

    def dump(self, folder: Path) -> None:
        self._profile.dump_stats(folder / f"refworker-{os.getpid()}.prof")


class _TorchProfile:
    """torch.profiler over each verdict's requests, each a range named ``ref.<op>``; at the verdict's
    end a table (by device time where there is a GPU) and the same as JSON (name: count, host and
    device microseconds, self and total), numbered by verdict, and a fresh record begins."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda.is_available()
        self._verdicts = 0
        self._start()

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._profile = profile(activities=activities)
        self._profile.__enter__()

    def runcall(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        from torch.profiler import record_function

        with record_function(f"ref.{op}"):
            return fn(*args)

    def dump(self, folder: Path) -> None:
        import json

        self._profile.__exit__(None, None, None)  # its events are read once it is stopped
        events = self._profile.key_averages()
        sort = "self_device_time_total" if self._cuda else "self_cpu_time_total"
        self._verdicts += 1
        name = f"refworker-{os.getpid()}-{self._verdicts}.torch"
        (folder / f"{name}.txt").write_text(events.table(sort_by=sort, row_limit=60))
        rows = {e.key: {"count": e.count, "cpu_us": e.cpu_time_total, "self_cpu_us": e.self_cpu_time_total,
                        "device_us": getattr(e, "device_time_total", 0.0),
                        "self_device_us": getattr(e, "self_device_time_total", 0.0)} for e in events}
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=1))
        self._start()


def _profiler() -> _PythonProfile | _TorchProfile | None:
    if not os.environ.get(PROFILE_ENV):
        return None
    return _TorchProfile() if os.environ.get(PROFILER_ENV) == "torch" else _PythonProfile()


#: ops whose answer starts with a message on the descriptor channel (sent by the handler itself)
DESCRIPTOR_REPLIES = frozenset({"arena"})


# ---- state -------------------------------------------------------------------------------------
@dataclass
class _Call:
    """One checked call: its pristine inputs, where they lie, the reference and its model (run
    again in lower precision to explain a wrong output, #15)."""

    shape_key: tuple
    inputs: list[Any]
    args: list[dict[str, Any]]
    high: list[Any]
    low: list[Any]
    model: Any = None
    snapshot: list[Any] = field(default_factory=list)
    #: its part of the input region, [start, end): where in-place outputs may wait for their second read
    part: tuple[int, int] = (0, 0)


@dataclass
class _Batch:
    shape: Shape
    task_ref: str
    init_seed: int
    dist: str
    region: Any = None  # the arena's input bytes the batch uses
    pristine: Any = None  # the same bytes as they must be written, in this worker's memory
    sets: list[list[dict[str, Any]]] = field(default_factory=list)
    #: each call's tensor inputs as views of ``pristine`` (None for a value), made once per layout:
    #: a fresh draw copies into them and the reference reads them (per call, a view made anew was
    #: three view ops more, thousands per verdict: bench/refworker_steps.py)
    views: list[list[Any]] = field(default_factory=list)
    inputs: list[list[Any]] = field(default_factory=list)
    #: each tensor input of every call as one view of ``pristine``, [calls, *shape] (the calls' places
    #: are evenly spaced): a batched draw fills it with one copy per input (None: the layout is not
    #: even, or a batched draw failed its checks, and every call is drawn on its own)
    stacked: list[Any] | None = None
    #: the same views of the arena's region, where the candidate's calls read them
    region_stacked: list[Any] | None = None
    #: whether a batched draw was checked on this layout (``_fill_batched``)
    stacked_checked: bool = False
    probe_index: Any = None
    #: where each output's probed bytes go in the probe, by layout (``_probe_plan``), made once while
    #: the places stay the same; each window draws its positions afresh (``_probe_draw``)
    probe_plan: Any = None
    probe: Any = None
    outputs: list[list[Any]] = field(default_factory=list)
    #: each call's outputs as views of the arena, while ``outputs`` names the same places (a
    #: captured batch's do, window after window); None: made at the next use
    out_views: list[list[Any]] | None = None
    #: each output of every call as one [calls, *shape] view of the arena (``_stacked_outputs``;
    #: False: the calls' outputs lie unevenly), or None: made at the next use
    out_stacked: Any = None
    start: Any = None  # the window's events
    written: Any = None
    host: dict[str, float] = field(default_factory=dict)
    #: the host's readings while done was awaited (host_load.Watch.facts), for the window's reply
    readings: dict[str, float] = field(default_factory=dict)
    #: the reference of every call, captured over the batch's input places (reference_graph.py);
    #: False once a capture was tried and gave none
    ref_graph: Any = None
    #: the reference of many calls at once (reference_batched.py), prepared on the first
    #: verification; False once tried and ruled out: the calls run one at a time
    ref_stacked: Any = None


def _task(task_ref: str) -> Any:
    """The task, loaded once per verdict (``_forget`` lets it go): a verdict's every checked call
    asks for it twice, and loading it (reading, parsing and compiling its files) took 2-6 ms
    each time, on the path of every checked call."""
    task = _TASKS.get(task_ref)
    if task is None:
        task = _TASKS[task_ref] = load_task(task_ref)
    return task


def _model(task_ref: str, shape: Shape, init_seed: int, device: str) -> Any:
    key = (task_ref, shape.params, init_seed)
    if key not in _MODELS:
        task = _task(task_ref)
        module = runtime.reference_module(task)
        _MODELS[key] = runtime.build_model(module.Model, runtime.make_init_inputs(task, shape), init_seed, device)
    return _MODELS[key]


def _arena_of() -> Any:
    arena = _STATE.get("arena")
    if arena is None:
        raise RuntimeError("no arena: the judge must ask for one first")
    return arena


# ---- sizes and the arena ----------------------------------------------------------------------
def _sizes(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Bytes of one call's inputs and outputs, and the outputs' dtypes and shapes, per shape."""
    import torch

    task = _task(msg["task_ref"])
    out = []
    kept = set(_MODELS)
    for shape_d in msg["shapes"]:
        shape = Shape.of(shape_d)
        inputs = runtime.make_inputs(task, shape, task.distributions[0], 0, device)
        model = _model(msg["task_ref"], shape, int(msg["init_seed"]), device)
        with torch.no_grad():
            low = runtime.collect_outputs(model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]), inputs,
                                          task.mutated_inputs)
        state = [*model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else []
        out.append({"shape": shape_d,
                    "input_bytes": sum(_padded(x) for x in inputs if isinstance(x, torch.Tensor)),
                    "output_bytes": sum(_padded(t) for t in low),
                    "param_bytes": sum(_padded(t) for t in state),
                    "outputs": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in low]})
        del inputs, low, model, state
    # A run sizes every task before its first verdict: the models built here (weights drawn for
    # this question alone) and the blocks their calls left cached would otherwise hold the GPU's
    # memory that the first verdict's arena needs (on the H200 a KernelBench run of 43 problems
    # could not make one). A verdict's drawn shape alone (a call no larger than the task's
    # declared ones) keeps what the cache may keep between verdicts (``_forget``'s rule): a
    # collection and an emptied cache before every verdict were a tenth of a second or more
    for key in set(_MODELS) - kept:
        del _MODELS[key]
    if len(out) > 1:
        _release_all(device)
    else:
        _release_cache(device)
    return {"sizes": out}


def _padded(t: Any) -> int:
    from .arena import ALIGN

    return -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN + ALIGN


def _arena(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Make (or keep, when it is large enough) the arena, zeroed, and hand its descriptor to the judge."""
    from .arena import Arena, Layout

    want = Layout(int(msg["size"]), int(msg["input_bytes"]))
    _STATE["deferral"] = late_reads.Deferral(int(msg.get("defer_bytes", late_reads.DEFER_BYTES)), int(msg.get("input_parts", 2)))
    arena = _STATE.get("arena")
    kept = not (arena is None or arena.layout.size < want.size or _oversized(arena.layout.size, want.size))
    if not kept:
        if arena is not None:
            arena.close()
            _STATE.pop("arena")
        _release_all(device)  # the arena is mapped outside torch's allocator: its cached blocks are no room
        arena = Arena.create(want, device)
    arena.layout = Layout(arena.layout.size, want.input_bytes)
    # every byte of it, whoever wrote it last: the previous candidate could address the whole
    # arena, and what it left would reach the next one (red team: the shapes a worker was called
    # at, hidden ones included, relayed to the next candidate; a mark that told an audit from its
    # routine verdict). Fresh device memory is not zeroed either; a fresh memfd is. A fill at memory speed.
    if device.startswith("cuda"):
        import torch

        arena.data.zero_()
        torch.cuda.synchronize(arena.data.device)  # done before another process can see the memory
    elif kept:
        arena.data.zero_()
    _STATE["arena"] = arena
    fd = arena.export()
    try:
        _STATE["channel"].send_fds([fd], "arena")
    finally:
        import os

        os.close(fd)
    return {"size": arena.layout.size, "input_bytes": arena.layout.input_bytes}


#: an arena is made again, smaller, when it holds this many bytes more than a verdict asks for
#: (a large task's arena would otherwise keep the next, smaller task's batch from fitting)
ARENA_SLACK_BYTES = 8 << 30


def _oversized(have: int, want: int) -> bool:
    return have - want > max(ARENA_SLACK_BYTES, want)


def _batch_socket(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The socket the next candidate's worker signals batch completion on (from the judge)."""
    tag, fds = _STATE["channel"].recv_fds()
    if tag != "go" or len(fds) != 1:
        raise RuntimeError(f"expected the batch socket, got {tag!r}")
    old = _STATE.pop("go", None)
    if old is not None:
        old.close()
    _STATE["go"] = socket.socket(fileno=fds[0])
    return {}


def _forget(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """A verdict is over: drop every call and batch it left, and its diagnosis history."""
    _STATE["calls"].clear()
    _STATE["history"].clear()
    _STATE["batches"].clear()
    _STATE.pop("stacked", None)  # the stacked references decided per shape, on this verdict's weights
    _late_reads(device).clear()
    go = _STATE.pop("go", None)
    if go is not None:
        go.close()
    _MODELS.clear()  # every verdict draws its own weights (init_seed): a kept model is never used again
    _TASKS.clear()  # read afresh by the next verdict (a task's files may have changed between verdicts)
    _STATE.pop("compiled", None)  # a compile ahead whose baseline never came (the candidate failed first)
    if not device.startswith("cuda"):
        return {"restart": False}
    import torch

    _release_cache(device)
    if torch.cuda.memory_reserved(device) > HELD_LIMIT_BYTES:
        gc.collect()  # a graph or a batch held only by a reference cycle keeps its memory until then
        _release_cache(device)
    held = torch.cuda.memory_reserved(device)
    return {"held_bytes": held, "restart": held > HELD_LIMIT_BYTES}


def _memory(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The device's free and total bytes, this worker's allocated and reserved bytes, its arena's."""
    arena = _STATE.get("arena")
    got = {"arena_bytes": arena.layout.size if arena is not None else 0}
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        got.update(free_bytes=free, total_bytes=total, allocated_bytes=torch.cuda.memory_allocated(device),
                   reserved_bytes=torch.cuda.memory_reserved(device))
    return got


#: device memory the worker's allocator may keep cached between verdicts; more goes back to the
#: driver, so that the next task's batch (another size, another task) finds it free
KEEP_CACHED_BYTES = 8 << 30
#: what this worker may still hold once a verdict is over and its cache went back; more (memory
#: a CUDA graph's pool kept, or cached segments pinned by a small allocation inside each: on the
#: H200, 110 GiB held for 11 GiB allocated after three seeds) and the judge starts a fresh one
HELD_LIMIT_BYTES = KEEP_CACHED_BYTES + (4 << 30)


def _release_all(device: str) -> None:
    """Every block torch's allocator keeps cached on ``device`` back to the driver."""
    if device.startswith("cuda"):
        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _release_cache(device: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    if torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) > KEEP_CACHED_BYTES:
        torch.cuda.empty_cache()


# ---- checked calls -----------------------------------------------------------------------------
def _regions(part: int) -> tuple[Any, Any]:
    """A checked call's part of the input region and half of the heap: calls rotate through the
    verdict's ``input_parts`` parts and alternate halves, so one is written while the others are
    still being read (late_reads.py says why in-place tasks get four parts)."""
    from .arena import Slots

    arena = _arena_of()
    parts = _deferral().input_parts
    inputs, size = arena.layout.input_bytes, arena.layout.size
    step, at = inputs // parts, part % parts
    mid_heap = inputs + (size - inputs) // 2
    ins = Slots(at * step, inputs if at == parts - 1 else (at + 1) * step)
    return ins, Slots(inputs, mid_heap) if part % 2 == 0 else Slots(mid_heap, size)


def _deferral() -> late_reads.Deferral:
    """What this verdict's compares may defer (late_reads.Deferral), as the judge said with its arena."""
    return _STATE.get("deferral") or late_reads.Deferral()


def _prepare(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from . import reference, timing

    arena = _arena_of()
    task = _task(msg["task_ref"])
    shape = Shape.of(msg["shape"])
    started = time.perf_counter()
    repeat_of = msg.get("repeat_of")
    if repeat_of:  # the same inputs again, written elsewhere: a deterministic kernel agrees with itself
        first = _STATE["calls"][repeat_of]
        inputs, high, low, model = first.inputs, first.high, first.low, first.model
    else:
        inputs = runtime.make_inputs(task, shape, msg["dist"], int(msg["seed"]), device)
        model = _model(msg["task_ref"], shape, int(msg["init_seed"]), device)
        high, low = reference.run_reference(model, inputs, task.mutated_inputs)
    ins, heap = _regions(int(msg["part"]))
    args, regions = [], []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            ref = arena.place(ins, x)
            args.append({"ref": ref.to_dict()})
            regions.append([ref.offset, ref.offset + ref.span])
        else:
            args.append({"value": x})
            regions.append([0, 0])
    slots = []
    n_returned = len(low) - len(task.mutated_inputs)
    if not device.startswith("cuda"):  # the CPU worker copies its outputs into slots, poisoned here
        for t in low[:n_returned]:
            ref = arena.slot(heap, str(t.dtype).removeprefix("torch."), list(t.shape))
            arena.data[ref.offset: ref.offset + ref.span].fill_(0xFF)
            slots.append(ref.to_dict())
    key = msg["key"]
    _STATE["calls"][key] = _Call(shape.params, inputs, args, high, low, model, part=(ins.start, ins.end))
    history = _STATE["history"].setdefault(shape.params, {"outputs": [], "references": []})
    history.setdefault("pending", {})[key] = [[float(v) for v in c.tolist()] for c in timing.checksum(low)]
    return {"args": args, "outputs": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in low],
            "slots": slots, "input_regions": regions, "steps": {"prepare": time.perf_counter() - started}}


def _compare(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Judge one call's outputs where they lie in the arena (refs checked by the judge)."""
    from . import integrity, timing
    from .messages import TensorRef

    arena = _arena_of()
    call: _Call = _STATE["calls"][msg["key"]]
    refs = [TensorRef(**r) for r in msg["outputs"]]
    started = time.perf_counter()
    # Snapshot first: these bytes are what the call left; everything is judged on them.
    snapshot = [arena.view(r).clone() for r in refs]
    taken = time.perf_counter()
    task = _task(msg["task_ref"])
    mutated = []
    for i, (x, a) in enumerate(zip(call.inputs, call.args)):
        if a.get("ref") and i not in task.mutated_inputs and not integrity.bits_equal(arena.view(TensorRef(**a["ref"])), x):
            mutated.append(i)
    tolerances = msg["tolerances"]
    bound = bool(msg.get("keep") or msg.get("repeat_of"))  # a repeat compares two calls within that bound
    results = [_judge_output(j, out, h, lo, tolerances, bound=bound) for j, (out, h, lo) in enumerate(zip(snapshot, call.high, call.low))]
    # Diagnosis of a wrong output: an earlier call's output (cached) or answer (deferred)?
    history = _STATE["history"][call.shape_key]
    sums = [[float(v) for v in c.tolist()] for c in timing.checksum(snapshot)] if snapshot else []
    earlier = ""
    if not all(r["ok"] for r in results):
        if any(_same(sums, e) for e in history["outputs"]):
            earlier = "cached"
        elif any(_same(sums, e) for e in history["references"]):
            earlier = "deferred"
        else:  # no earlier result: was it computed in lower precision?
            _explain_precision(results, snapshot, call.high, call.low, call.model, call.inputs, task.mutated_inputs)
    history["outputs"].append(sums)
    history["references"].append(history["pending"].pop(msg["key"], []))
    repeat: dict[str, Any] = {}
    if msg.get("repeat_of"):
        repeat = _repeat(_STATE["calls"][msg["repeat_of"]].snapshot, snapshot, results)
    # Read again after a pause: bytes that change now were written by work the call left running.
    # On a GPU a call that passed is read again at a later compare (late_reads.py): the pause
    # then overlaps the candidate's next calls; earlier calls due now are read first.
    reads = _late_reads(device)
    places = [arena.view(r) for r in refs]
    failed = bool(mutated) or not all(r["ok"] for r in results) or bool(repeat) and not repeat.get("same", True)
    if late_reads.deferrable(device.startswith("cuda"), failed, [(r.offset, r.span) for r in refs], arena.layout.input_bytes,
                             call.part, _deferral()):
        found = reads.at_compare()
        reads.defer(msg["key"], places, snapshot, taken)
    else:  # this call and every earlier one read now, one wait for all
        reads.defer(msg["key"], places, snapshot, taken)
        found = reads.settle()
    late = next((outs for key, outs in found if key == msg["key"]), [])
    earlier_late = [(key, outs) for key, outs in found if key != msg["key"]]
    if msg.get("keep"):
        call.snapshot = snapshot
    else:
        _STATE["calls"].pop(msg["key"], None)
    return {"results": results, "mutated_inputs": mutated, "late_writes": late, "repeat": repeat, "earlier": earlier,
            "late_earlier": [{"key": key, "outputs": outs} for key, outs in earlier_late],
            "steps": {"snapshot": taken - started, "compare": time.perf_counter() - taken}}


def _late_reads(device: str) -> late_reads.LateReads:
    """This worker's deferred second reads (late_reads.py), made on first use."""
    if "late_reads" not in _STATE:
        sync: Callable[[], None] = lambda: None  # noqa: E731
        if device.startswith("cuda"):
            import torch

            sync = torch.cuda.synchronize
        _STATE["late_reads"] = late_reads.LateReads(sync=sync)
    return _STATE["late_reads"]


def _settle(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The end of a group of checked calls: every deferred second read made now."""
    return {"late": [{"key": key, "outputs": outs} for key, outs in _late_reads(device).settle()]}


def _judge_output(j: int, cand: Any, high: Any, low: Any, tolerances: dict[str, Any], *, bound: bool = False) -> dict[str, Any]:
    """One output against its reference; ``bound`` adds the largest error the tolerance allows
    anywhere (what a repeated call may drift by)."""
    from . import compare

    tol = _tolerance(low, tolerances)
    mism = compare.compare(cand, high, tol, low=low)
    details = mism.to_dict()
    details.pop("ok", None)
    if bound and high.is_floating_point() and high.numel():
        largest, rms = compare.magnitude(high, cand.device)
        details["allowed_abs"] = float(tol.rtol * largest + tol.atol * rms)
    if not mism.ok:  # every statistic a block at a time: a multi-GB output has no room for copies
        details["never_written"], details["zeros_where_ref_nonzero"] = compare.untouched_counts(cand, high)
    return {"output": j, "ok": mism.ok, "details": details}


def _explain_precision(results: list[dict[str, Any]], outs: Sequence[Any], high: Sequence[Any], low: Sequence[Any],
                       model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> None:
    """Lowered precision (#15), on evidence, for the first wrong output (the one a verdict names,
    and whose verdict it ends): the reference run again in lower precision (precision.py)."""
    from . import precision

    wrong = next((r for r in results if not r["ok"]), None)
    if wrong is None or model is None:
        return
    j = wrong["output"]
    wide = high[j].dtype != low[j].dtype  # high came from the model one step wider
    wrong["details"].update(precision.diagnose(outs[j], high[j], j, model, inputs, mutated, wide=wide))


def _tolerance(low: Any, tolerances: dict[str, Any]) -> Tolerance:
    dtype = str(low.dtype).removeprefix("torch.")
    return Tolerance(**tolerances.get(dtype, tolerances["default"]))


def _repeat(first: list[Any], again: list[Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    from . import compare, integrity

    for j, (a, b) in enumerate(zip(first, again)):
        if integrity.bits_equal(a, b):
            continue
        diff = compare.max_abs_difference(a, b)  # NaN in different places: inf, a difference
        allowed = results[j]["details"].get("allowed_abs", 0.0) if j < len(results) else 0.0
        if diff > allowed:
            return {"same": False, "output": j, "max_diff": diff, "allowed": allowed}
    return {"same": True}


def _same(a: list[list[float]], b: list[list[float]], rel: float = 1e-3) -> bool:
    if not a or len(a) != len(b):
        return False
    for (s1, a1), (s2, a2) in zip(a, b):
        scale = rel * max(abs(a1), abs(a2)) + 1e-12
        if abs(s1 - s2) > scale or abs(a1 - a2) > scale:
            return False
    return True


def _drop(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    call = _STATE["calls"].pop(msg["key"], None)
    if call is not None:
        history = _STATE["history"].get(call.shape_key)
        if history:
            history.get("pending", {}).pop(msg["key"], None)
    _STATE["batches"].pop(msg["key"], None)
    return {}


# ---- timed batches -----------------------------------------------------------------------------
def _plan_batch(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Draw fresh inputs for every call of a batch and lay them out in the input region (the
    bytes are written into the arena only inside the timed window). A batch already planned
    keeps its layout: its calls were captured on those places.

    A new batch's first draw is also written into the region at once: the candidate's worker
    warms its kernels up on those places before it captures them, and an index input must hold
    valid indices there (a block table, a slot mapping), not what an earlier layout left. The
    judge draws again before every timed window, so no timed call sees what the capture saw:
    that reply holds no layout (it is the first plan's)."""
    import torch

    from . import reference

    arena = _arena_of()
    task = _task(msg["task_ref"])
    key = msg["key"]
    shape = Shape.of(msg["shape"])
    batch = _STATE["batches"].get(key)
    seeds = [int(s) for s in msg["seeds"]]
    if batch is None:
        batch = _Batch(shape, msg["task_ref"], int(msg["init_seed"]), msg["dist"])
        _STATE["batches"][key] = batch
        # two calls drawn alone: the layout of every call where they agree, and what a batched
        # draw is checked against (_fill_batched); else every call drawn and laid out alone. Calls
        # too large to draw two at once (_fill_batched) are never held two at a time: the memory
        # this worker's allocator keeps is memory the candidate's worker lacks (an honest
        # fused_moe audit ran out of it on the H200 while a pair of 3 GB calls was held)
        first = runtime.make_inputs(task, shape, batch.dist, seeds[0], device)
        small = len(seeds) >= 2 and _calls_per_part(reference.nbytes(first, False)) >= 2
        pair = [first] + ([runtime.make_inputs(task, shape, batch.dist, seeds[1], device)] if small else [])
        del first
        even = small and _signature(pair[0]) == _signature(pair[1])
        if even:
            _lay_out(batch, arena, (pair[0] for _ in seeds))
        if not (even and _fill_batched(batch, task, seeds, device, pair)):
            # each call's draw is let go once laid out (pair[k] handed over, not kept here)
            drawn = _lay_out(batch, arena, (pair.pop(0) if pair else runtime.make_inputs(task, shape, batch.dist, seed, device)
                                            for seed in seeds))
            if even:
                batch.stacked = None  # a batched draw failed its checks on this layout: not tried again
            _fill(batch, task, seeds, device, drawn if all(d is not None for d in drawn) else None, batched=False)
            del drawn
        del pair
        batch.region.copy_(batch.pristine)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return {"sets": batch.sets}
    if len(seeds) != len(batch.sets):
        raise RuntimeError("a planned batch keeps its number of calls")
    _fill(batch, task, seeds, device)
    return {"sets": []}  # the judge has the layout; a batch of 512 calls made a reply of thousands of records


def _signature(inputs: list[Any]) -> list[Any]:
    """One call's inputs as the layout sees them: each tensor's dtype and shape, each value."""
    import torch

    return [(x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor) else ("value", x) for x in inputs]


def _lay_out(batch: _Batch, arena: Any, calls: Any) -> list[Any]:
    """Places in the input region for every call's inputs (``calls``: each call's inputs, in
    order), and the batch's pristine bytes, views and stacked views over them; returns what each
    call drew where the batch is small enough to keep it (``DRAWN_KEEP_BYTES``), else None."""
    import torch

    from .arena import Slots

    slots = Slots(0, arena.layout.input_bytes)
    layout, drawn = [], []
    for inputs in calls:
        args = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                ref = arena.slot(slots, str(x.dtype).removeprefix("torch."), list(x.shape))
                args.append({"ref": ref.to_dict()})
            else:
                args.append({"value": x})
        layout.append(args)
        # small calls keep what they drew for the pristine bytes (drawn once, not twice)
        drawn.append(inputs if slots.next <= DRAWN_KEEP_BYTES else None)
        del inputs
    end = -(-slots.next // 512) * 512
    batch.region = arena.data[:end]
    # zeros: the padding between inputs is never drawn, and is written into the arena the
    # candidate reads (this worker's earlier bytes must not reach it)
    batch.pristine = torch.zeros(end, dtype=torch.uint8, device=batch.region.device)
    batch.sets = layout
    batch.views = [[_pristine_view(batch, a) if a.get("ref") else None for a in args] for args in layout]
    # the reference's arguments: each call's values are the layout's (its tensors are the views)
    batch.inputs = [[None if view is not None else a["value"] for a, view in zip(args, views)]
                    for args, views in zip(layout, batch.views)]
    batch.stacked = _stacked_views(batch)
    batch.region_stacked = _stacked_views(batch, batch.region) if batch.stacked is not None else None
    return drawn


#: a batch whose inputs take at most this many bytes keeps the inputs its layout drew, to write
#: them into its pristine bytes (a larger one draws them again, one call at a time)
DRAWN_KEEP_BYTES = 256 << 20


#: at most this many bytes of inputs drawn at once by a batched draw (the calls of a larger batch
#: are drawn in parts; a batch whose calls do not fit two to a part is drawn one call at a time)
MANY_BYTES = 256 << 20


def _calls_per_part(per_call: int) -> int:
    """Calls a batched draw takes at once (below 2: calls this large gain nothing drawn together,
    and their draw's scratch memory would double; they are drawn one at a time)."""
    return MANY_BYTES // max(per_call, 1)


def _fill(batch: _Batch, task: Any, seeds: list[int], device: str, drawn: list[list[Any]] | None = None,
          batched: bool = True) -> None:
    """Fresh inputs for every call, into the batch's pristine bytes at its layout (``drawn``:
    each seed's inputs, already drawn). Where ``batched`` and the layout allow, the calls are
    drawn together (``_fill_batched``), else one call at a time."""
    if batched and drawn is None and _fill_batched(batch, task, seeds, device):
        return
    batch.pristine.fill_(0)
    for k, seed in enumerate(seeds):
        inputs = drawn[k] if drawn is not None else runtime.make_inputs(task, batch.shape, batch.dist, seed, device)
        for x, view in zip(inputs, batch.views[k]):
            if view is not None:
                view.copy_(x)


def _fill_batched(batch: _Batch, task: Any, seeds: list[int], device: str, pair: list[list[Any]] | None = None) -> bool:
    """Every call's inputs drawn in one pass per part (``runtime.make_many``) and copied into the
    stacked views, one copy per input; False where the batch cannot be drawn so, and the caller
    then draws every call again, one at a time (a layout that fails the check below drops
    ``batch.stacked`` for good; a later failure, say out of memory, costs only that window).

    The first such draw on a layout is checked before it is used: each input must come back with
    every call's shape and dtype, and an input that differed between two calls drawn one at a
    time from different seeds (``pair``; else the layout's first two calls in pristine, drawn
    so) must differ between two calls of this one too. A task whose draw vmap would repeat
    across calls (its randomness lost) falls back rather than give a window of identical calls,
    which a kernel that caches could pass."""
    import torch

    from . import reference

    stacked, calls = batch.stacked, len(batch.sets)
    if stacked is None or calls < 2:
        return False
    part = _calls_per_part(reference.nbytes([v[0] for v in stacked], False))
    if part < 2:
        return False
    varies = None
    if not batch.stacked_checked:
        if pair is not None:
            alone = [[x for x in call if isinstance(x, torch.Tensor)] for call in pair]
            varies = [not torch.equal(a, b) for a, b in zip(*alone)]
        else:  # the layout's first draw, one call at a time, is still in pristine
            varies = [not torch.equal(v[0], v[1]) for v in stacked]
    for start in range(0, calls, part):
        n = min(part, calls - start)
        drawn = runtime.make_many(task, batch.shape, batch.dist, seeds[start], n, device)
        ok = drawn is not None and len(drawn) == len(stacked) and all(
            x.shape == v[start: start + n].shape and x.dtype == v.dtype for x, v in zip(drawn, stacked))
        if ok and varies is not None and n >= 2:
            ok = all(not d or not torch.equal(x[0], x[1]) for d, x in zip(varies, drawn))
        if not ok:
            if varies is not None:
                batch.stacked = None
            return False
        for x, view in zip(drawn, stacked):
            view[start: start + n].copy_(x)
        del drawn
    batch.stacked_checked = True
    return True


def _stacked_views(batch: _Batch, over: Any = None) -> list[Any] | None:
    """Each tensor input of every call as one [calls, *shape] view of ``pristine`` (or of
    ``over``, bytes laid out as it is: the arena's region), where every call has its tensors at
    the same offsets from its own start, the calls evenly spaced; else None."""
    from .messages import TensorRef

    refs = [[TensorRef(**a["ref"]) if a.get("ref") else None for a in args] for args in batch.sets]
    if any([r is None for r in call] != [r is None for r in refs[0]] for call in refs):
        return None  # calls with their tensors at different positions: drawn one at a time
    return _even_stack([[r for r in call if r is not None] for call in refs], batch.pristine if over is None else over)


def _stacked_outputs(batch: _Batch, arena: Any) -> list[Any] | None:
    """Each output of every call as one [calls, *shape] view of the arena, where the calls left
    them evenly spaced (made once while the places stay the same); else None."""
    if batch.out_stacked is None:
        batch.out_stacked = _even_stack(batch.outputs, arena.data) or False
    return batch.out_stacked or None


def _even_stack(refs: list[list[Any]], data: Any) -> list[Any] | None:
    """The j-th tensor of every call (``refs``: each call's TensorRefs into ``data``, bytes) as
    one [calls, *shape] view, for every j, where each call's tensors lie at the same offsets from
    its own start, the calls evenly spaced; else None."""
    from .messages import ITEMSIZE

    if len(refs) < 2 or not refs[0] or len(refs[1]) != len(refs[0]):
        return None
    step = refs[1][0].offset - refs[0][0].offset
    stacked = []
    for j, ref in enumerate(refs[0]):
        size = ITEMSIZE[ref.dtype]
        if step <= 0 or step % size or ref.offset % size or data.numel() % size:
            return None
        for k, call in enumerate(refs):
            r = call[j] if len(call) == len(refs[0]) else None
            if r is None or r.dtype != ref.dtype or r.shape != ref.shape or r.strides != ref.strides or r.offset != ref.offset + k * step:
                return None
        stacked.append(data.view(_dtype(ref.dtype)).as_strided((len(refs), *ref.shape), (step // size, *ref.strides), ref.offset // size))
    return stacked


def _time_batch(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The trusted clock over one batch. Events on this worker's stream: before the write of
    the inputs into the arena, and after the probe of the outputs, which runs once the
    candidate's worker said done. Its kernels cannot run while this write does (one GPU runs
    one process's kernels at a time), so the window less the write's floor bounds its work.

    A batch run eagerly places its outputs only as it runs: its window stays open after done
    (``probe_later``) until the judge has relayed where they are and the probe has read them."""
    import torch

    from . import timing
    from .messages import TensorRef

    batch: _Batch = _STATE["batches"][msg["key"]]
    arena = _arena_of()
    # the trusted write's rate from the ceilings (measured before any candidate's worker existed):
    # measured here, a candidate's work beside it could lower it and so raise the floor that a
    # preempted write is taken off by (clock.write_allowance)
    if not msg.get("write_gbps"):
        raise ValueError("a timed batch needs the trusted write's rate (write_gbps) from the ceilings")
    floor_ms = 2 * batch.region.numel() / (float(msg["write_gbps"]) * 1e9 * WRITE_HEADROOM) * 1e3
    if msg.get("probe"):  # the second half of an eager batch's window
        _place_outputs(batch, [[TensorRef(**r) for r in call] for call in msg["outputs"]])
        batch.probe_index = _draw_probe(batch, arena.data.device)
        return _close_window(batch, arena, floor_ms, done=True)
    go: socket.socket = _STATE["go"]
    _placed_outputs(batch, msg)
    batch.probe_index = _draw_probe(batch, arena.data.device)
    _drain(go)  # a byte sent before this window is nobody's "done"
    try:
        quiet_s = _quiet_gpu(device)
    except GpuBusy as busy:
        return {"done": False, "busy": str(busy), "window_ms": 0.0, "write_ms": 0.0, "write_floor_ms": floor_ms, "steps": {}}
    l2 = _l2(device)
    l2.reset_persisting()
    l2.flush()
    batch.start, batch.written = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    batch.start.record()
    timing.write(batch.region, batch.pristine)
    batch.written.record()
    while not batch.written.query():  # spin: every microsecond here is on the clock
        pass
    t1 = time.perf_counter()
    watch = host_load.Watch()
    go.sendall(b"g")
    done = _wait_byte(go, deadline=time.perf_counter() + float(msg["timeout_s"]), watch=watch)
    batch.host = {"quiet": quiet_s, "write_wait": t1 - t0, "go_to_done": time.perf_counter() - t1}
    if not done or msg.get("probe_later"):
        watch.look()
        batch.readings = watch.facts()
        return {"done": done, "window_ms": 0.0, "write_ms": 0.0, "write_floor_ms": floor_ms, "steps": batch.host,
                "host": batch.readings}
    closed = _close_window(batch, arena, floor_ms, done=True)
    watch.look()  # the host's runnable tasks once more, off the window
    batch.readings = closed["host"] = watch.facts()
    return closed


def _placed_outputs(batch: _Batch, msg: dict[str, Any]) -> None:
    """Where a window's calls leave their outputs, before it opens: a captured batch's places
    come with its first window and stay for the next ones (its graph writes where it was
    captured; resent, thousands of records were encoded, decoded and compared again every
    window), an eager batch's ``[]`` until the probe's half of its window says where they went.
    A window with no places sent and none kept is refused: nothing of it could be verified."""
    from .messages import TensorRef

    if "outputs" in msg:
        _place_outputs(batch, [[TensorRef(**r) for r in call] for call in msg["outputs"]])
    elif not batch.outputs:
        raise ValueError("a timed batch's first window needs its outputs' places: none were sent and none are kept")


def _place_outputs(batch: _Batch, outputs: list[list[Any]]) -> None:
    """Where this window's calls leave their outputs; the views of the last window's kept where
    they are the same places."""
    if outputs != batch.outputs:
        batch.outputs, batch.out_views, batch.out_stacked, batch.probe_plan = outputs, None, None, None


def _draw_probe(batch: _Batch, device: Any) -> Any:
    """This window's probe positions (``_probe_draw``) over the batch's places, planned at the
    first window that placed them."""
    if batch.probe_plan is None:
        batch.probe_plan = _probe_plan(batch.outputs)
    return _probe_draw(batch.probe_plan, device)


def _output_views(batch: _Batch, arena: Any) -> list[list[Any]]:
    """Every call's outputs as views of the arena (made once while the places stay the same)."""
    if batch.out_views is None:
        batch.out_views = [[arena.view(r) for r in call] for call in batch.outputs]
    return batch.out_views


#: bytes the calibration writes and probes: a stand-in for a batch's write and probe
CALIBRATION_BYTES = 4096

#: a one-element kernel's launch-to-finish on an idle GPU is tens of microseconds (H200: 14 us
#: median, 150 us at most); behind another process's running or queued work it waits for that
#: process's time slice (H200: 2.4 ms), stopped or not (bench/quiet_probe.py)
QUIET_US = 500.0
#: how long the reference worker waits for another process's work to end before it times
QUIET_WAIT_S = 20.0


class GpuBusy(RuntimeError):
    """Another process kept GPU work running or queued for ``QUIET_WAIT_S``: nothing is timed."""


def _probe_us(device: str) -> float:
    """Host microseconds from launching one tiny kernel until the GPU has run it."""
    import torch

    flag = _STATE.get("quiet_probe")
    if flag is None:
        flag = _STATE["quiet_probe"] = torch.zeros(1, device=device)
    t0 = time.perf_counter()
    flag.add_(1)
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e6


def _quiet_gpu(device: str, probe: Any = None) -> float:
    """Wait until no other process has work on the GPU (the least of three probes is quick);
    the seconds waited. Every timed measurement starts so: a neighbour lane's worker is stopped
    while this one times (Session.pause), but what it queued before runs on, and one GPU runs
    one process's kernels at a time, so that work would land in the window (or in a baseline,
    or the clock's calibration, making a candidate look faster). GpuBusy after ``QUIET_WAIT_S``."""
    if not device.startswith("cuda"):
        return 0.0
    probe = probe or _probe_us
    start = time.perf_counter()
    while True:
        least = min(probe(device) for _ in range(3))
        waited = time.perf_counter() - start
        if least < QUIET_US:
            return waited
        if waited > QUIET_WAIT_S:
            raise GpuBusy(f"another process kept the GPU busy for {waited:.0f} s (a tiny kernel waited {least / 1e3:.1f} ms "
                          "to run): nothing can be timed beside it")
        time.sleep(0.005)


def _calibrate(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The clock's fixed cost per batch, with the candidate's worker before its module is
    loaded: windows exactly like ``_time_batch``'s (L2 flushed, events around a write, go,
    done, a probe), over one tiny captured kernel. Each round starts only once that worker has
    said it is ready ("r"), so no start-up of its own is on the clock; a round it does not
    start in time ends the calibration."""
    import torch

    from . import timing

    arena = _arena_of()
    go: socket.socket = _STATE["go"]
    _drain(go)
    try:
        _quiet_gpu(device)
    except GpuBusy:  # no rounds: nothing is taken off any window (clock.fixed_cost)
        return {"windows_ms": [], "writes_ms": []}
    region = arena.data[:CALIBRATION_BYTES]
    pristine = torch.zeros(CALIBRATION_BYTES, dtype=torch.uint8, device=region.device)
    heap = arena.layout.input_bytes
    index = torch.arange(heap, heap + PROBE_ELEMENTS * 4, device=region.device)
    l2 = _l2(device)
    windows, writes = [], []
    for _ in range(int(msg["rounds"])):
        if not _wait_byte(go, deadline=time.perf_counter() + float(msg["timeout_s"])):
            break  # the harness gives up on its own (it waits longer than this for its go)
        l2.flush()
        start, written, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        start.record()
        timing.write(region, pristine)
        written.record()
        while not written.query():
            pass
        go.sendall(b"g")
        if not _wait_byte(go, deadline=time.perf_counter() + float(msg["timeout_s"])):
            break
        arena.data[index]
        end.record()
        torch.cuda.synchronize()
        windows.append(start.elapsed_time(end))
        writes.append(start.elapsed_time(written))
    return {"windows_ms": windows, "writes_ms": writes}


def _close_window(batch: _Batch, arena: Any, floor_ms: float, done: bool) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    batch.probe = arena.data[batch.probe_index] if batch.probe_index is not None else None
    end = torch.cuda.Event(enable_timing=True)
    end.record()
    torch.cuda.synchronize()
    steps = dict(batch.host, probe=time.perf_counter() - t0)
    return {"done": done, "window_ms": batch.start.elapsed_time(end), "write_ms": batch.start.elapsed_time(batch.written),
            "write_floor_ms": floor_ms, "steps": steps, "host": batch.readings}


@dataclass(frozen=True)
class _ProbeGroup:
    """The outputs of one layout: their byte offsets, and where each one's probed bytes begin in
    the probe (in call order, then output order)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    itemsize: int
    bases: Any
    starts: Any


def _probe_plan(refs: list[list[Any]]) -> tuple[list[_ProbeGroup], int] | None:
    """Every output's place in the probe, grouped by layout (outputs of the same layout are drawn
    together): one walk over the calls, made once per batch's places, not once per window
    (``_probe_draw``); None where no output has an element."""
    import torch

    groups: dict[tuple, tuple[list[int], list[int]]] = {}
    at = 0
    for call in refs:
        for r in call:
            if r.numel:
                bases, starts = groups.setdefault((tuple(r.shape), tuple(r.strides), r.itemsize), ([], []))
                bases.append(r.offset)
                starts.append(at)
                at += min(PROBE_ELEMENTS, r.numel) * r.itemsize
    if not at:
        return None
    return [_ProbeGroup(shape, strides, itemsize, torch.tensor(bases, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64))
            for (shape, strides, itemsize), (bases, starts) in groups.items()], at


def _probe_draw(plan: tuple[list[_ProbeGroup], int] | None, device: Any) -> Any:
    """Fresh random positions over ``plan``: PROBE_ELEMENTS random elements of each output (as
    many draws as it has elements, where fewer), each element's bytes whole, at the output's
    place in the probe."""
    import torch

    if plan is None:
        return None
    groups, total = plan
    gen = torch.Generator().manual_seed(secrets.randbits(62))
    index = torch.empty(total, dtype=torch.int64)
    for g in groups:
        n = math.prod(g.shape)
        count = min(PROBE_ELEMENTS, n)
        flat = torch.randint(0, n, (len(g.bases), count), generator=gen)
        offset = torch.zeros_like(flat)
        rest = flat.clone()
        for size, stride in zip(reversed(g.shape), reversed(g.strides)):
            offset += (rest % size) * stride
            rest //= size
        byte = g.bases[:, None] + offset * g.itemsize
        byte = (byte[..., None] + torch.arange(g.itemsize)).reshape(len(g.bases), -1)
        index[g.starts[:, None] + torch.arange(byte.shape[1])] = byte
    return index.to(device)


def _drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)


#: seconds between two readings of the host's runnable tasks while a batch's done is awaited
LOOK_EVERY_S = 5e-4


def _wait_byte(sock: socket.socket, deadline: float, watch: host_load.Watch | None = None) -> bool:
    """Spin until a byte arrives: False when the socket closed or ``deadline`` passed. With a
    ``watch``, the host's runnable tasks are read at the start and every ``LOOK_EVERY_S`` (the
    caller reads them once more at the end, off its clock), and the longest pause between two
    polls is kept (host_load: was the host quiet)."""
    sock.setblocking(False)
    if watch is not None:
        watch.look()
    last = looked = time.perf_counter()
    try:
        while last < deadline:
            try:
                data = sock.recv(1)
                return bool(data)
            except BlockingIOError:
                pass
            now = time.perf_counter()
            if watch is not None:
                watch.stalled(now - last)
                if now - looked >= LOOK_EVERY_S:
                    watch.look()
                    looked = now = time.perf_counter()
            last = now
        return False
    finally:
        if watch is not None:
            watch.stalled(time.perf_counter() - last)
        sock.setblocking(True)


#: stacked outputs and references per comparison chunk (timed batches of many small calls)
CHUNK_BYTES = 256 << 20


def _verify_batch(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Every output of every call of the last timed batch, against its own reference; the
    probe against the final bytes; the inputs against what was written. Many small calls are
    compared a part or chunk at a time, stacked; the first failing call is then explained in full."""
    from . import integrity

    batch: _Batch = _STATE["batches"][msg["key"]]
    arena = _arena_of()
    task = _task(batch.task_ref)
    started = time.perf_counter()
    laps = Laps()
    incomplete = []
    if batch.probe is not None:
        final = arena.data[batch.probe_index]
        if not integrity.bits_equal(final, batch.probe):
            incomplete = _changed_calls(batch, final)
    mutated = _batch_mutations(batch, arena, task)
    laps.lap("inputs")
    if mutated:
        return {"failed_call": -1, "results": [], "incomplete_calls": incomplete, "mutated_inputs": mutated,
                "steps": {"verify": time.perf_counter() - started}}
    model = _model(batch.task_ref, batch.shape, batch.init_seed, device)
    laps.lap("model")
    first = batch.ref_stacked is None
    stacked = _stacked_reference(batch, model, task, msg["tolerances"])
    laps.lap("stack_check" if first else "stacked")
    found = None
    if stacked is not None:
        try:
            found = _failing_stacked(batch, arena, stacked, msg["tolerances"], laps)
        except Exception:  # noqa: BLE001 - say, out of memory: this window's calls one at a time
            laps.lap("stacked_failed")
    failing, reference_of = found or _failing_per_call(batch, arena, model, task, device, msg["tolerances"], laps)
    hits = failing.nonzero()
    failed = int(hits[0]) if hits.numel() else -1
    laps.lap("check")
    views = _output_views(batch, arena)
    results, worst = [], (0.0, 0.0)
    if failed >= 0:
        high, low = reference_of(failed)
        outs = views[failed]
        results = [_judge_output(j, o, h, lo, msg["tolerances"]) for j, (o, h, lo) in enumerate(zip(outs, high, low))]
        _explain_precision(results, outs, high, low, model, _call_inputs(batch, failed), task.mutated_inputs)
    else:  # the errors of one call, for the record
        high, low = reference_of(len(batch.sets) - 1)
        for j, (o, h, lo) in enumerate(zip(views[-1], high, low)):
            d = _judge_output(j, o, h, lo, msg["tolerances"])["details"]
            worst = (max(worst[0], d.get("max_abs_err", 0.0)), max(worst[1], d.get("max_rel_err", 0.0)))
    laps.lap("errors")
    return {"failed_call": failed, "results": results, "incomplete_calls": incomplete, "mutated_inputs": [],
            "max_abs_err": worst[0], "max_rel_err": worst[1], "steps": {"verify": time.perf_counter() - started, **laps.seconds}}


Reference = tuple[list[Any], list[Any]]


def _stacked_reference(batch: _Batch, model: Any, task: Any, tolerances: dict[str, Any]) -> Any:
    """The batch's reference run over many calls at once (reference_batched.py), prepared on its
    first verification; None where its calls are run one at a time."""
    from . import reference_batched

    if batch.ref_stacked is None:
        batch.ref_stacked = False
        if batch.stacked is not None:
            calls = [_call_inputs(batch, k) for k in range(len(batch.sets))]
            # the verdict's other batch at this shape decided already: its decision, sized for these calls
            key = (batch.task_ref, batch.shape.params, batch.init_seed, batch.dist)
            decided = _STATE.setdefault("stacked", {}).get(key)
            found = reference_batched.reuse(decided, batch.stacked, calls) if decided is not None else None
            if found is None:
                found = reference_batched.prepare(model, batch.stacked, calls, task.mutated_inputs,
                                                  lambda t: _tolerance(t, tolerances))
                if found is not None:
                    _STATE["stacked"][key] = found
            batch.ref_stacked = found or False
    return batch.ref_stacked or None


def _failing_stacked(batch: _Batch, arena: Any, stacked: Any, tolerances: dict[str, Any],
                     laps: Laps, *, exact: bool = False) -> tuple[Any, Callable[[int], Reference]]:
    """Which calls fail (a bool per call, on the device), the reference a part of the calls at a
    time (``stacked``), each output of the part compared at once; and each call's reference.
    Not ``exact``: the low answers derived from the high ones where the batch allows
    (reference_batched.py; a low answer the same tensor as its high one is left out of the
    compare), and where a call is out then, the window again with the low answers run."""
    import torch

    from . import compare

    views = _output_views(batch, arena)  # every place checked to lie in the arena
    outs_stacked = _stacked_outputs(batch, arena)
    failing = torch.zeros(len(batch.sets), dtype=torch.bool, device=arena.data.device)
    last: tuple[int, Reference] = (0, ([], []))
    for start, count in stacked.parts(len(batch.sets)):
        highs, lows = stacked.run(batch.stacked, start, count, exact=exact)
        laps.lap("reference")
        if len(highs) != len(views[0]):  # never an output left uncompared (the judge checked the count)
            raise ValueError(f"{len(views[0])} outputs against the reference's {len(highs)}")
        for j, (high, low) in enumerate(zip(highs, lows)):
            if outs_stacked is not None:
                outs = outs_stacked[j][start: start + count]
            else:  # the candidate's outputs lie unevenly: copied together
                outs = torch.stack([views[k][j] for k in range(start, start + count)])
            laps.lap("gather")
            failing[start: start + count] |= ~compare.within_tolerance(outs, high, _tolerance(low, tolerances),
                                                                        None if low is high else low)
            laps.lap("check")
        last = (start, (highs, lows))  # the last call's, for the record, without running its part again
        del highs, lows

    def reference_of(k: int) -> Reference:
        """Call k's (high, low) as the comparison saw them (its part run again, but the last's)."""
        start = k - k % stacked.part
        highs, lows = last[1] if start == last[0] else stacked.run(batch.stacked, start, min(stacked.part, len(batch.sets) - start),
                                                                   exact=exact)
        return [h[k - start] for h in highs], [lo[k - start] for lo in lows]

    if not exact and stacked.low_dtypes is not None and bool(failing.any()):
        laps.lap("derived_out")  # out by the tighter allowance: the low answers run decide
        return _failing_stacked(batch, arena, stacked, tolerances, laps, exact=True)
    return failing, reference_of


def _failing_per_call(batch: _Batch, arena: Any, model: Any, task: Any, device: str, tolerances: dict[str, Any],
                      laps: Laps, *, exact: bool = False) -> tuple[Any, Callable[[int], Reference]]:
    """Which calls fail (a bool per call, on the device), each call's reference run on its own
    (replayed from the batch's captured graph where it has one); and each call's reference. Not
    ``exact``, an eager reference whose low answer is its high one rounded at the window's first
    call (reference_batched.py says why that is sound) runs its high answer alone at the others,
    and where a call is out then, the window runs again with the low answers run."""
    import torch

    from . import compare, compare_kernel, reference, reference_batched

    chunk: list[tuple[int, list[Any], list[Any], list[Any]]] = []
    held = 0
    # which calls failed, filled chunk by chunk on the device and read once at the end: a read per
    # chunk made the CPU wait for the GPU and the GPU for the CPU at every chunk (a call of a large
    # shape is a chunk of its own: hundreds per verdict)
    failing = torch.zeros(len(batch.sets), dtype=torch.bool, device=arena.data.device)

    def flush() -> None:
        """Compare the chunk's calls (consecutive ones) output by output, marking those that fail."""
        bad = torch.zeros(len(chunk), dtype=torch.bool, device=arena.data.device)

        def stacked(part: int, j: int, device: Any = None) -> Any:  # one call: a view, not a copy of GBs
            ts = [c[part][j] if device is None else c[part][j].to(device) for c in chunk]
            return ts[0].unsqueeze(0) if len(ts) == 1 else torch.stack(ts)

        for j in range(len(chunk[0][1])):
            outs = stacked(1, j)
            highs, lows = stacked(2, j, outs.device), stacked(3, j, outs.device)
            laps.lap("gather")
            bad |= ~compare.within_tolerance(outs, highs, _tolerance(lows, tolerances), lows)
            # the PyTorch ops' pass is several times the fused kernel's: a verdict's steps say which ran
            laps.lap("check" if compare_kernel.applies(outs, highs, lows) else "check_pytorch_ops")
        failing[chunk[0][0]: chunk[-1][0] + 1] |= bad
        laps.lap("check")

    first = batch.ref_graph is None
    captured = _batch_reference(batch, model, task, device)
    if captured is not None:  # the reference's device time is its own step, not the comparison's
        torch.cuda.synchronize(arena.data.device)
    laps.lap("capture" if first else "replay")

    rule: dict[str, Any] = {}  # the window's first eager call's: the wider model, and the lows' dtypes where derived

    def reference_of(k: int) -> Reference:
        """Call k's (high, low): from the batch's graph where it has one, else run now."""
        if captured is not None:
            return captured[k]
        inputs = _call_inputs(batch, k)
        if exact:
            return reference.run_reference(model, inputs, task.mutated_inputs)
        if not rule:
            hi_model, high, low = reference.decide_wider(model, inputs, task.mutated_inputs)
            rounds = hi_model is not None and reference_batched.rounded(high, low)
            rule.update(hi=hi_model, dtypes=[lo.dtype for lo in low] if rounds else None)
            return high, low
        if rule["dtypes"] is None:
            return reference.run_reference(model, inputs, task.mutated_inputs)
        try:
            high = reference.run_wide(rule["hi"], inputs, task.mutated_inputs)
        except RuntimeError:  # say, out of memory beside this call's: its low answer runs too, as before
            return reference.run_reference(model, inputs, task.mutated_inputs)
        return high, [h.to(d) for h, d in zip(high, rule["dtypes"])]

    views = _output_views(batch, arena)
    for k in range(len(batch.sets)):
        high, low = reference_of(k)
        outs = views[k]  # in-place inputs last, in their slots
        chunk.append((k, outs, high, low))
        held += sum(h.numel() * 4 for h in high)
        if held >= CHUNK_BYTES or k == len(batch.sets) - 1:
            flush()
            chunk, held = [], 0
    laps.lap("gather")
    if rule.get("dtypes") is not None and bool(failing.any()):
        laps.lap("derived_out")  # out by the tighter allowance: the low answers run decide
        return _failing_per_call(batch, arena, model, task, device, tolerances, laps, exact=True)
    return failing, reference_of


def _batch_reference(batch: _Batch, model: Any, task: Any, device: str) -> list[Any] | None:
    """Every call's (high, low) from the batch's captured reference, captured on its first
    verification; None where the eager reference must run (reference_graph.py says when)."""
    from . import reference_graph

    if not device.startswith("cuda") or batch.ref_graph is False:
        return None
    if batch.ref_graph is None:
        calls = [_call_inputs(batch, k) for k in range(len(batch.sets))]
        batch.ref_graph = reference_graph.capture(model, calls, batch.inputs, task.mutated_inputs) or False
        if batch.ref_graph is False:
            return None
    return batch.ref_graph.run(batch.inputs)


def _call_inputs(batch: _Batch, k: int) -> list[Any]:
    """Call k's arguments as the reference reads them: its tensors in the batch's pristine bytes."""
    return [view if view is not None else v for view, v in zip(batch.views[k], batch.inputs[k])]


def _pristine_view(batch: _Batch, arg: dict[str, Any]) -> Any:
    from .messages import TensorRef

    ref = TensorRef(**arg["ref"])
    return batch.pristine[ref.offset: ref.offset + ref.span].view(_dtype(ref.dtype)).as_strided(tuple(ref.shape), tuple(ref.strides))


def _batch_mutations(batch: _Batch, arena: Any, task: Any) -> list[int]:
    """Inputs (by position) that differ from what was written, in any call; the task's in-place
    inputs excepted. One comparison of the whole region when nothing is written in place."""
    from . import integrity
    from .messages import TensorRef

    if not task.mutated_inputs and integrity.bits_equal(batch.region, batch.pristine):
        return []
    found: set[int] = set()
    if batch.stacked is not None and all(v.numel() * v.element_size() <= MANY_BYTES for v in batch.stacked):
        # each input of every call in one comparison (a copy of each side: bounded like a batched draw)
        positions = [i for i, a in enumerate(batch.sets[0]) if a.get("ref")]
        for i, now, want in zip(positions, batch.region_stacked, batch.stacked):
            if i not in task.mutated_inputs and not integrity.bits_equal(now, want):
                found.add(i)
        return sorted(found)
    for args in batch.sets:
        for i, a in enumerate(args):
            if a.get("ref") and i not in task.mutated_inputs and not integrity.bits_equal(arena.view(TensorRef(**a["ref"])), _pristine_view(batch, a)):
                found.add(i)
    return sorted(found)


def _changed_calls(batch: _Batch, final: Any) -> list[int]:
    """Which calls' probed bytes changed after the probe read them."""
    changed = (final != batch.probe).cpu().tolist()
    calls, at = [], 0
    for k, call in enumerate(batch.outputs):
        n = sum(min(PROBE_ELEMENTS, r.numel) * r.itemsize for r in call if r.numel)
        if any(changed[at: at + n]):
            calls.append(k)
        at += n
    return calls


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _l2(device: str) -> Any:
    import torch

    from . import timing

    if "l2" not in _STATE:
        _STATE["l2"] = timing.L2Control(torch.device(device))
    return _STATE["l2"]


# ---- baselines and the machine ----------------------------------------------------------------
def _baseline(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Eager and torch.compile of the reference, timed like a candidate's batch (as many of its
    calls as fit beside the arena, inputs of their own per call, written inside the window). torch.compile is compiled
    afresh per shape with static sizes: after compiles at other shapes dynamo would reuse
    symbolic-size kernels, which are slower than what a user gets for this shape."""
    from . import library, timing

    task = _task(msg["task_ref"])
    shape = Shape.of(msg["shape"])
    model = _model(msg["task_ref"], shape, int(msg["init_seed"]), device)
    seeds = [int(s) for s in msg["seeds"]]
    first = runtime.make_inputs(task, shape, msg["dist"], seeds[0], device)
    if not device.startswith("cuda"):
        t0 = time.perf_counter()
        model(*first)
        return {"eager": {"median_us": (time.perf_counter() - t0) * 1e6, "mode": "interpreter"}}
    # each installed library's output against the reference's on the first call's inputs, before
    # the batch takes the memory: one that computes another op is no baseline (library.py)
    disagrees = library.disagreements(task, model, first)
    seeds = seeds[:_baseline_calls(model, first, task.mutated_inputs, len(seeds), device)]
    layout = _baseline_layout(task, shape, msg["dist"], seeds, device, first)
    del first
    _quiet_gpu(device)  # GpuBusy: no figures (and none kept) rather than inflated ones
    l2 = _l2(device)
    out: dict[str, Any] = {"eager": timing.time_batch(model, layout, l2, int(msg["batches"]))}
    compiled = _compiled_for(msg, model, device)
    try:
        if compiled.error is not None:
            raise compiled.error
        out["compile"] = timing.time_batch(compiled.fn, layout, l2, int(msg["batches"]))
        out["compile"]["compile_seconds"] = compiled.seconds
        out["compile"]["mode_note"] = "torch.compile(dynamic=False), default mode, compiled for this shape alone"
    except Exception as err:  # a reference torch.compile cannot handle: report, do not fail
        out["compile"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    # a production kernel library where the task names one and it is installed, timed the same way
    lib = library.measure(task, lambda fn: timing.time_batch(fn, layout, l2, int(msg["batches"])), disagrees)
    if lib is not None:
        out["library"] = lib
    for figures in out.values():
        if isinstance(figures, dict) and "error" not in figures:
            figures["calls"] = len(layout.calls)
    return out


@dataclass
class _Compiled:
    """torch.compile of the reference for one shape, compiled and run once (``error``: why not)."""
    key: tuple
    fn: Any
    seconds: float
    error: Exception | None = None


def _compiled_key(msg: dict[str, Any]) -> tuple:
    return (msg["task_ref"], Shape.of(msg["shape"]).params, int(msg["init_seed"]))


def _compiled(msg: dict[str, Any], model: Any, device: str, held: Callable[[], ContextManager[None]] | None = None) -> _Compiled:
    """A fresh, static torch.compile of ``model`` for the message's shape, run once on inputs of
    that shape so that Inductor's code generation and Triton's compiles are done; the task's
    library baseline is called once on them too (library.warm), for the same reason.

    ``held``: where the caller does not hold the GPU for the whole compile (a compile made ahead,
    verifier/compile_ahead.py), a context manager held around each step that runs GPU work: the
    inputs' draw and layout, and the compiled graph's first run (where Inductor's kernels
    autotune), but not the code generation between them, seconds of CPU work that then keeps no
    timed phase waiting. Inductor is the backend either way (the same graph, the same cache entry)."""
    import torch

    from . import library

    task = load_task(msg["task_ref"])  # also in a compile-ahead process, which never forgets
    shape = Shape.of(msg["shape"])
    hold = held or contextlib.nullcontext
    t0 = time.perf_counter()
    try:
        torch._dynamo.reset()  # after compiles at other shapes dynamo would reuse symbolic-size kernels
        backend = "inductor" if held is None else _held_inductor(held, device)
        fn = torch.compile(model, dynamic=False, backend=backend)
        # one call laid out as the baseline's batch lays its calls out (views of a region per
        # dtype): guards that hold there too, so the timing does not compile again
        seed = int(msg["seeds"][0])
        with hold():
            layout = _baseline_layout(task, shape, msg["dist"], [seed], device,
                                      runtime.make_inputs(task, shape, msg["dist"], seed, device))
            layout.write()
            if device.startswith("cuda"):
                torch.cuda.synchronize(torch.device(device))
        fn(*layout.calls[0])
        if held is not None:  # the library's Triton kernels compiled before the GPU is held for its first call
            library.compile_ahead(task, layout.calls[0])
        with hold():
            library.warm(task, layout.calls[0])  # its kernels compiled here too, not in the timing
            del layout
            if device.startswith("cuda"):
                torch.cuda.synchronize(torch.device(device))
        return _Compiled(_compiled_key(msg), fn, time.perf_counter() - t0)
    except Exception as err:  # reported by the baseline that uses it
        return _Compiled(_compiled_key(msg), None, time.perf_counter() - t0, err)


def _held_inductor(held: Callable[[], ContextManager[None]], device: str) -> Callable[..., Any]:
    """A dynamo backend that is Inductor's (``compile_fx``, as ``backend="inductor"`` calls it
    with no options) with every run of the compiled graph inside ``held()``, finished before it
    is let go."""
    import torch

    def backend(gm: Any, example_inputs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(gm, example_inputs)

        def run(*args: Any) -> Any:
            with held():
                out = compiled(*args)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(torch.device(device))
                return out

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
        return run

    return backend


def _compile_baseline(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The torch.compile baseline's compile, asked for ahead of the baseline's timing: the judge
    asks for it before it takes the GPU alone, so that the seconds of code generation and Triton
    compiles (CPU work) hold no other verdict's timed phase back. The next ``baseline`` of the
    same shape times it; any other baseline compiles afresh."""
    compiled = _compiled(msg, _model(msg["task_ref"], Shape.of(msg["shape"]), int(msg["init_seed"]), device), device)
    _STATE["compiled"] = compiled
    return {"seconds": compiled.seconds, "error": None if compiled.error is None else
            f"{type(compiled.error).__name__}: {str(compiled.error)[:300]}"}


def _compiled_for(msg: dict[str, Any], model: Any, device: str) -> _Compiled:
    """The compile asked for ahead (``compile_baseline``) when it is of this baseline's task,
    shape and weights; else one made now. Either way none is kept for a later baseline."""
    ahead = _STATE.pop("compiled", None)
    if ahead is not None and ahead.key == _compiled_key(msg):
        return ahead
    del ahead
    return _compiled(msg, model, device)


def _baseline_layout(task: Any, shape: Shape, dist: str, seeds: list[int], device: str,
                     first: list[Any]) -> Any:
    """The baselines' batch (timing.BatchLayout): a region per dtype for every call's inputs of
    that dtype, its pristine copy (fresh inputs, one call's drawn at a time: a multi-GB call
    leaves no room for them all twice) and each call's arguments as views of the regions, each
    ALIGN-aligned. ``first``: the first seed's inputs, already drawn."""
    import torch

    from .arena import ALIGN
    from .timing import BatchLayout

    def aligned(x: Any) -> int:  # elements, so that the next input starts ALIGN-aligned too
        return -(-(x.numel() * x.element_size()) // ALIGN) * ALIGN // x.element_size()

    def elements(inputs: list[Any]) -> dict[Any, int]:
        """Elements one call's inputs take in each dtype's region."""
        need: dict[Any, int] = {}
        for x in inputs:
            if isinstance(x, torch.Tensor):
                need[x.dtype] = need.get(x.dtype, 0) + aligned(x)
        return need

    regions = {dtype: torch.empty(n * len(seeds), dtype=dtype, device=device) for dtype, n in elements(first).items()}
    pristine = {dtype: torch.empty_like(region) for dtype, region in regions.items()}
    at = dict.fromkeys(regions, 0)
    calls: list[list[Any]] = []
    for k, seed in enumerate(seeds):
        inputs = first if k == 0 else runtime.make_inputs(task, shape, dist, seed, device)
        room = {dtype: region.numel() - at[dtype] for dtype, region in regions.items()}
        if calls and any(n > room.get(dtype, 0) for dtype, n in elements(inputs).items()):
            break  # inputs whose sizes vary with the seed: fewer calls, all of them in the regions
        call = []
        for x in inputs:
            if isinstance(x, torch.Tensor):
                start, end = at[x.dtype], at[x.dtype] + x.numel()
                call.append(regions[x.dtype][start: end].view(x.shape))
                pristine[x.dtype][start: end].view(x.shape).copy_(x)
                at[x.dtype] += aligned(x)
            else:
                call.append(x)
        calls.append(call)
    return BatchLayout(tuple(regions.values()), tuple(pristine.values()), tuple(calls))


#: device memory the baselines leave free beside their batch (the compiler's own work, the library's)
BASELINE_RESERVE = 4 << 30


def _baseline_calls(model: Any, inputs: list[Any], mutated: Sequence[int], most: int, device: str) -> int:
    """How many of the candidate's ``most`` calls per batch the baselines can time here (one call
    of ``inputs`` measures its outputs): each call needs its inputs twice (the region and its
    pristine copy) and its outputs, the batch holds them all at once, and the reference worker's
    arena is already taken. At least one: a call that does not fit once is the task's problem
    (fits.py), not the baseline's."""
    import torch

    from . import reference

    with torch.no_grad():  # on copies: the inputs go on to be the batch's first call
        outputs = reference.run_low(model, inputs, mutated)
    per_call = 2 * reference.nbytes(inputs, False) + reference.nbytes(outputs, False)
    del outputs
    torch.cuda.empty_cache()  # blocks cached by earlier steps count as room
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    # the next call's inputs are drawn while the first's are still held (a draw may make a copy)
    drawing = 2 * reference.nbytes(inputs, False)
    return max(1, min(most, (int(free) - BASELINE_RESERVE - drawing) // max(per_call, 1)))


def _ceilings(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Copy bandwidth (bytes read + written), the trusted write's own rate, and the bf16
    matmul rate of this GPU, measured."""
    import torch

    from . import integrity as I
    from . import timing

    if not device.startswith("cuda"):
        return {"bandwidth_gbps": None, "tflops": None, "write_gbps": None}
    _quiet_gpu(device)  # the ceilings bound every verdict's floor: measured on a quiet GPU only

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
    write_bps = timing.write_throughput(torch.device(device))  # the fastest trusted write
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: a @ b, 20)
    return {"bandwidth_gbps": 2 * n / copy_ms / 1e6, "tflops": 2 * m**3 / mm_ms / 1e9, "write_gbps": write_bps / 1e9}


def _environment(device: str, msg: dict[str, Any]) -> dict[str, Any]:
    from . import environment

    return {"environment": environment.describe(device)}
