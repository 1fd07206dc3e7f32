"""The candidate's side of verification: runs inside a sandbox worker, next to untrusted code.

Nothing here is trusted and nothing here decides. The facts a verdict rests on are taken outside
this process: the trusted reference worker writes each call's inputs into shared memory (the
arena, arena.py) and reads the outputs from there itself, and it clocks timed batches with its
own CUDA events. What this module reports about itself (types, threads, an op trace, replaced
functions, its own clock) are early signals that can reject a candidate and never accept one.

``warm_up`` runs before any candidate exists in the process: it imports torch and Triton, creates
the CUDA context, binds the originals the harness calls (integrity.py), wraps Triton's launchers
for the trace and snapshots what a candidate might patch. ``run`` then serves the judge:

* ``load``: receive the arena's descriptor, map it (on a GPU, route torch's allocations into its
  heap: heap.py), import the candidate.
* ``check``: view the call's inputs in the arena, call forward once under the trace, and report
  where the outputs lie (GPU) or copy them into the slots the judge gave (CPU).
* ``prepare_batch`` / ``run_batch`` (GPU): capture one CUDA graph of many calls, each on inputs
  of its own; replay it when the trusted side says go, and say done.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from .trace import CANDIDATE_MODULE as MODULE_NAME  # the name the trace tells the candidate's calls by

_STATE: dict[str, Any] = {}
#: a tensor's instance dictionary, read through the type's own descriptor (bound before any
#: candidate code runs; never an attribute lookup on the instance)
I_TENSOR_DICT: Any = None
MODULE_TYPE = type(sys)
#: how long a calibration round waits for the trusted side's go
CALIBRATION_WAIT_S = 15.0
POISON_BYTE = 0xFF  # all-ones: a NaN in every float format, and no kernel's canonical NaN


def warm_up() -> dict[str, float]:
    """Trusted start-up, before any candidate code: called by the sandbox worker. Returns where
    its time went (seconds per step), which the worker's ready message carries."""
    from .laps import Laps

    laps = Laps()
    import torch
    import torch._dynamo  # noqa: F401  (it rewraps torch.manual_seed & co. on import: do it now)
    import torch.profiler  # noqa: F401
    import triton  # noqa: F401  (imported now so its modules are snapshotted as they will stay)

    laps.lap("imports")
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")  # create the context now, not on the candidate's clock
        laps.lap("cuda_context")
        _first_triton_launch()
        laps.lap("triton_launch")
    if os.environ.get("TRITON_INTERPRET") == "1":
        from . import interpreter

        interpreter.install()
    from . import arena, heap, integrity, late_reads, messages, timing, trace  # noqa: F401  (bind originals)

    global I_TENSOR_DICT
    I_TENSOR_DICT = torch.Tensor.__dict__["__dict__"].__get__

    trace.install_launch_hooks()
    trace.follow_threads()
    trace.watch_evasions()
    _watch_capture_queries()
    _record_thread_starts()
    _STATE["snapshot"] = integrity.snapshot()
    _STATE["modules"] = [(name, owner) for name, owner in integrity.watched() if type(owner) is MODULE_TYPE]
    _STATE["threads"] = {t.ident for t in threading.enumerate()}
    import gc

    _STATE["gc_callbacks"] = {id(cb) for cb in gc.callbacks}
    trace.install_audit_hook()
    laps.lap("hooks")
    return laps.seconds


def _first_triton_launch() -> None:
    """Compile and launch one trivial kernel: Triton builds its launcher utilities once per
    cache directory (each worker has a private one), which must not land on a candidate. A
    pool's later workers find them built (triton_seed.py): taken from its first warm worker."""
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
    from . import integrity as I

    if "snapshot" not in _STATE:
        warm_up()
    _STATE["channel"] = channel
    handlers = {"attach": _attach, "calibrate": _calibrate, "load": _load, "check": _check,
                "prepare_batch": _prepare_batch, "run_batch": _run_batch, "release_batches": _release_batches,
                "profile": _profile}
    while True:
        msg = channel.recv()
        received = I.perf_counter()
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
        if reply.get("ok"):
            reply.setdefault("claimed_s", I.perf_counter() - received)
        channel.send(reply)


# ---- requests ---------------------------------------------------------------------------------
def _attach(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Map the arena, take the batch socket and route torch's allocations into the heap:
    everything but the candidate's module, which ``load`` imports afterwards."""
    from kernforge.tasks.loader import unbundle

    from . import late_reads
    from .arena import Arena, Layout

    if "arena" in _STATE:
        raise RuntimeError("the arena is already attached")
    channel = _STATE["channel"]
    device = payload["device"]
    tag, fds = channel.recv_fds()
    if tag != "arena" or len(fds) != 1:
        raise RuntimeError(f"expected the arena's descriptor, got {tag!r} with {len(fds)} descriptors")
    layout = Layout(**payload["layout"])
    _STATE["arena"] = Arena.open(fds[0], layout, device)
    if device.startswith("cuda"):
        from .heap import HeapPool

        tag, fds = channel.recv_fds()
        if tag != "go" or len(fds) != 1:
            raise RuntimeError(f"expected the batch signal socket, got {tag!r}")
        _STATE["go"] = socket.socket(fileno=fds[0])
        base = _STATE["arena"].data.data_ptr()
        _STATE["pool"] = HeapPool(base + layout.input_bytes, layout.size - layout.input_bytes)
    # The task arrives as text: its own path may not be visible inside the sandbox.
    # No hidden shapes here, not even those the judge derives from a bare reference: this process
    # learns each shape only when a call is made at it (THREATS #14)
    _STATE["task"] = unbundle(payload["task"], Path(os.getcwd()) / "task", derive_hidden=False)
    _STATE["device"] = device
    _STATE["init_seed"] = int(payload["init_seed"])
    _STATE["models"] = {}
    _STATE["keep"] = collections.deque()  # the last calls' outputs stay put until read again (_keep)
    _STATE["defer_bytes"] = int(payload.get("defer_bytes", late_reads.DEFER_BYTES))  # the judge's Deferral
    _STATE["task_globals"] = _task_globals()
    _kernels_ahead(payload.get("triton_cache") or {})
    return {"ok": True}


def _kernels_ahead(files: dict[str, str]) -> None:
    """The candidate's own Triton kernels and their launchers, compiled ahead at the public shapes
    by another worker (triton_ahead.py, which checked every name and size), written into this
    worker's Triton cache before the candidate is imported. A group file names its members by
    absolute path: those of the worker that wrote them, here this cache's. No file is written over
    one this cache has (the warm-up's own kernel and Triton's modules, loaded): trusted code in this
    process compiles no Triton kernel after this, so a key it could need is never one the
    candidate's files fill."""
    import base64
    import json

    from .triton_files import cache_name, kernel_file

    root = Path(os.environ.get("TRITON_CACHE_DIR") or Path(os.getcwd()) / ".triton")
    have = set(os.listdir(root)) if root.is_dir() else set()  # never written over: loaded, some of them
    for name, data in files.items():
        key, _, leaf = name.partition("/")
        if not cache_name(name) or key in have:
            continue
        folder = root / key
        folder.mkdir(parents=True, exist_ok=True)
        body = base64.b64decode(data)
        if leaf.startswith("__grp__"):
            try:
                group = json.loads(body)
                members = {child: Path(path).name for child, path in group["child_paths"].items()}
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # not a group Triton wrote: its kernel compiles when launched
            if not all(kernel_file(m) for m in members.values()):
                continue  # a member that is no kernel's file (``..``, a shared object): the same
            group["child_paths"] = {child: str(folder / m) for child, m in members.items()}
            body = json.dumps(group).encode()
        try:
            fd = os.open(folder / leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(body)


def _calibrate(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Batches of one tiny captured kernel, before the candidate's module exists: the trusted
    clock's fixed cost per batch (its go, this process's wake-up, launch and sync, its done,
    the GPU's switches between the two processes and the probe), which the judge takes off the
    candidate's windows. The code that runs here is the harness's own, nothing the candidate
    wrote; a round whose go does not come in time ends the calibration.""" 
    import torch

    from . import integrity as I

    if "ModelNew" in _STATE or "go" not in _STATE:
        raise RuntimeError("calibration runs after attach and before the module is loaded")
    go: socket.socket = _STATE["go"]
    with _pool():
        cell = torch.zeros(64, dtype=torch.int32, device=_STATE["device"])
        cell.add_(1)
    I.synchronize()
    graph = I.CUDAGraph()
    with I.cuda_graph_ctx(graph, pool=_STATE["pool"].id):
        cell.add_(1)
    I.synchronize()
    rounds = 0
    for _ in range(int(msg.get("rounds", 0))):
        go.sendall(b"r")
        if _wait_byte(go, CALIBRATION_WAIT_S) != b"g":
            break
        I.graph_replay(graph)
        I.synchronize()
        go.sendall(b"d")
        rounds += 1
    return {"ok": True, "rounds": rounds}


def _load(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    if "arena" not in _STATE:
        raise RuntimeError("load comes after attach")
    try:
        module = import_candidate(payload["source"])
    except BaseException as err:
        return {"ok": False, "stage": "compile", "error": _format_error(err)}
    model_new = getattr(module, "ModelNew", None)
    if not isinstance(model_new, type):
        return {"ok": False, "stage": "compile", "error": "the module defines no class `ModelNew`"}
    _STATE["ModelNew"] = model_new
    return {"ok": True, "signals": _signals()}


def import_candidate(source: str) -> Any:
    """The candidate's module, imported from a file in this worker's folder (Triton reads its
    kernels' source there) under the name the trace tells its calls by."""
    path = Path(os.getcwd()) / "candidate.py"
    path.write_text(source, encoding="utf-8")  # the judge refused any other declared encoding
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


def _model_for(shape: Any) -> Any:
    from kernforge.tasks import runtime

    key = shape.params
    if key not in _STATE["models"]:
        task = _STATE["task"]
        init = runtime.make_init_inputs(task, shape)
        with _pool():
            _STATE["models"][key] = runtime.build_model(_STATE["ModelNew"], init, _STATE["init_seed"], _STATE["device"])
    return _STATE["models"][key]


def _args(refs: list[dict[str, Any]]) -> list[Any]:
    """The call's inputs: views of the arena the trusted side wrote, or plain values."""
    from .messages import TensorRef

    arena = _STATE["arena"]
    return [arena.view(TensorRef(**a["ref"])) if a.get("ref") else a.get("value") for a in refs]


def _check(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    from kernforge.tasks.spec import Shape

    from . import integrity as I, trace

    task = _STATE["task"]
    on_gpu = _STATE["device"].startswith("cuda")
    shape = Shape.of(msg["shape"])
    steps = _Steps()
    _let_go()
    model = _model_for(shape)
    inputs = _args(msg["args"])
    steps.mark("inputs")
    if on_gpu:
        _poison(int(msg.get("poison_bytes", 0)))
        _l2().reset_persisting()  # the limit is device-wide: clear what an earlier process left
    steps.mark("poison")
    with trace.recording() as rec, _pool():
        with trace.dispatched(cuda=on_gpu) as (census, kernels):
            result = model(*inputs)
    hooked = _clear_hooks()  # first: a hook left set would run the candidate's code inside what follows
    modes = _active_modes()
    steps.mark("call")
    # Types first, by type() and before anything touches the values: a container or tensor
    # subclass would run the candidate's code on iteration or on a copy (#7).
    container = I.type_(result)
    if result is None:
        returned, types = [], []
    elif container in (tuple, list):
        returned = list(result)
        types = [_type_name(I.type_(r)) for r in returned]
    else:
        returned, types = [result], [_type_name(container)]
    # An exact tensor can still carry code: attributes of its own (``y.stride = f``), or an input
    # whose class forward swapped; touched, they would run the candidate's code (#7).
    dressed = [f"output {j}" for j, r in enumerate(returned) if I.type_(r) is I.Tensor and _own_attributes(r)]
    dressed += [f"input {i}" for i, x in enumerate(inputs) if I.isinstance_(x, I.Tensor) and
                (I.type_(x) is not I.Tensor or _own_attributes(x))]
    if any(I.type_(r) is not I.Tensor for r in returned) or dressed:
        types += [f"{d} carries attributes or a class of its own" for d in dressed]
        return {"ok": True, "types": types, "outputs": [],
                "signals": _signals(rec=rec, modes=modes, census=census, hooked=hooked, inputs=_elements(inputs))}
    I.synchronize()
    steps.mark("sync")
    aliases = _aliases(returned, inputs)
    held: list[Any] = [result, inputs]
    refs = _outputs(returned, msg["args"], msg.get("slots", []), task.mutated_inputs, on_gpu, held)
    steps.mark("outputs")
    _keep(held, sum(r.numel() * r.element_size() for r in returned))
    pinned = _l2().persisting_limit() if on_gpu else None
    return {"ok": True, "types": types, "outputs": refs, "steps": steps.seconds,
            "signals": _signals(rec=rec, kernels=kernels, aliases=aliases, modes=modes, pinned=pinned, census=census,
                                hooked=hooked, inputs=_elements(inputs))}


def _keep(held: list[Any], nbytes: int) -> None:
    """A call's outputs (and what they were copied from) stay where they lie until the reference
    worker has read them again (late_reads.py); ``_let_go`` hands back those no read can reach."""
    _STATE["keep"].append((held, nbytes))


def _let_go(everything: bool = False) -> None:
    """Before a call, the outputs of earlier calls that no compare can read any more go back to
    the pool. The judge sends call n only once the compare of call n-2 has ended, and that of
    call n-1 runs beside call n, reading call n-1 and the deferred calls n-2 and n-3 (a call is
    read again at the latest two compares after its own, and deferred only where its outputs
    take at most the verdict's ``defer_bytes``: late_reads.Deferral). So call n-1's outputs
    stay, and those of calls n-2 and n-3 only where they are that small. Larger outputs: one
    earlier call's beside the new one, as the judge sizes the heap (two calls' outputs, where it
    made no room for more); a KernelBench ReLU kept two earlier calls' 6 GiB and ran out of a
    14 GiB heap at its repeat call. ``everything``: a timed batch (the judge settled every read
    before its timed phase)."""
    from . import late_reads

    keep = _STATE["keep"]
    calls = [] if everything else list(keep)[-late_reads.KEPT_CALLS:]
    keep.clear()
    limit = _STATE.get("defer_bytes", late_reads.DEFER_BYTES)
    keep.extend([c for c in calls[:-1] if c[1] <= limit] + calls[-1:])


def _outputs(returned: list[Any], args: list[dict[str, Any]], slots: list[dict[str, Any]],
             mutated: tuple[int, ...], on_gpu: bool, held: list[Any]) -> list[dict[str, Any]]:
    """Where each output lies in the arena. GPU: where forward left it (copied into the heap if
    it lies elsewhere); CPU: copied into the judge's slot. In-place inputs stay in their slots."""
    from .messages import TensorRef

    arena = _STATE["arena"]
    refs = []
    for j, out in enumerate(returned):
        if on_gpu:
            ref = arena.ref_of(out)
            if ref is None:  # allocated outside the pool (another thread, cudaMalloc): bring it in
                with _pool():
                    copy = out.clone()
                held.append(copy)
                ref = arena.ref_of(copy)
            refs.append((ref or _nowhere()).to_dict())
            continue
        dtype = str(out.dtype).removeprefix("torch.")
        slot = TensorRef(**slots[j]) if j < len(slots) else None
        if slot is None or slot.dtype != dtype or list(slot.shape) != list(out.shape):
            refs.append({"offset": slot.offset if slot else 0, "dtype": dtype if dtype in _itemsizes() else "uint8",
                         "shape": list(out.shape), "strides": list(out.stride())})
            continue
        arena.view(slot).copy_(out)
        refs.append(slot.to_dict())
    for i in mutated:
        refs.append(dict(args[i]["ref"]))
    return refs


def _prepare_batch(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Capture one CUDA graph of ``len(sets)`` calls, each on its own inputs (or fall back to
    eager calls, flagged). A shape is timed by two batches of different sizes (``id``), both
    kept until ``release_batches``; their outputs come from the batch pool, a fresh pool over
    the arena's heap that the release hands back whole (the next shape needs the room)."""
    from kernforge.tasks.runtime import collect_outputs
    from kernforge.tasks.spec import Shape

    from . import integrity as I, trace

    task = _STATE["task"]
    shape = Shape.of(msg["shape"])
    if "batch_pool" not in _STATE:  # a shape's first batch: every checked call before it was read again (settled)
        _let_go(everything=True)
        _renew_pool()
    model = _model_for(shape)
    sets = [_args(s) for s in msg["sets"]]
    batches = _STATE.setdefault("batches", {})
    batches.pop(msg["id"], None)
    pool = _batch_pool()
    with trace.recording() as rec, pool.use():
        for _ in range(2):  # compile, autotune and warm every specialisation before capture
            model(*sets[0])
    I.synchronize()
    arena = _STATE["arena"]
    graph, outputs, reason = I.CUDAGraph(), [], ""
    try:
        with trace.recording() as rec, I.cuda_graph_ctx(graph, pool=pool.id):
            for inputs in sets:
                outputs.append(collect_outputs(model(*inputs), inputs, task.mutated_inputs))
        I.synchronize()
    except Exception as err:  # any capture failure: the batch runs eagerly, flagged
        reason = f"CUDA-graph capture failed ({type(err).__name__}: {str(err)[:300]})"
        graph, outputs = None, []
        _end_capture_allocation(pool)
        I.synchronize()
    refs = []
    if graph is not None:
        for outs in outputs:
            call = []
            for out in outs:
                ref = arena.ref_of(out) if I.type_(out) is I.Tensor else None
                call.append((ref or _nowhere()).to_dict())
            refs.append(call)
    batches[msg["id"]] = {"graph": graph, "outputs": outputs, "sets": sets, "model": model}
    return {"ok": True, "outputs": refs, "mode": "graph" if graph is not None else "eager", "fallback_reason": reason,
            "signals": _signals(rec=rec)}


def _renew_pool() -> None:
    """Hand the checked calls' pool back (the blocks it cached, to the heap) and use a fresh one
    from now on: a pool keeps the blocks freed in it to itself, so the outputs the checked calls
    left (two of a KernelBench ReLU's: 12 GiB) were out of the timed batches' reach, and its
    batches ran out of their 27 GiB heap. What still lives in the old pool (the models' weights,
    whatever the candidate cached) stays where it lies."""
    pool = _STATE.get("pool")
    if pool is not None:
        _STATE["pool"] = pool.fresh()
        pool.release()


def _batch_pool() -> Any:
    """The pool the batches of the shape being timed allocate from (created on first use)."""
    if "batch_pool" not in _STATE:
        _STATE["batch_pool"] = _STATE["pool"].fresh()
    return _STATE["batch_pool"]


def _end_capture_allocation(pool: Any) -> None:
    """A capture that raised can leave its pool still recording allocations: end that, so the
    eager fallback (and the next capture) can use the pool again."""
    import torch

    index = torch.device(_STATE["device"]).index or 0
    with contextlib.suppress(RuntimeError):
        torch._C._cuda_endAllocateToPool(index, pool.id)


def _release_batches(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Drop every batch of the shape just timed, and hand its pool's memory back to the heap."""
    from . import integrity as I

    _STATE.pop("batches", None)
    pool = _STATE.pop("batch_pool", None)
    I.synchronize()
    if pool is not None:
        pool.release()
    return {"ok": True}


def _run_batch(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Wait for the trusted side's go, run the batch, wait for the device, say done."""
    from kernforge.tasks.runtime import collect_outputs

    from . import integrity as I

    batch = _STATE["batches"][msg["id"]]
    go: socket.socket = _STATE["go"]
    _wait_byte(go)
    start = I.perf_counter()
    refs = []
    try:
        if batch["graph"] is not None:
            I.graph_replay(batch["graph"])
        else:
            task, model = _STATE["task"], batch["model"]
            with _batch_pool().use():
                batch["outputs"] = [collect_outputs(model(*inputs), inputs, task.mutated_inputs) for inputs in batch["sets"]]
        I.synchronize()
    finally:  # a batch that failed is done too: the trusted side's window closes and the failure is the reply
        go.sendall(b"d")
    claimed = I.perf_counter() - start
    if batch["graph"] is None:
        arena = _STATE["arena"]
        for outs in batch["outputs"]:
            refs.append([(arena.ref_of(o) or _nowhere()).to_dict() if I.type_(o) is I.Tensor else _nowhere().to_dict() for o in outs])
    reply: dict[str, Any] = {"ok": True, "claimed_s": claimed, "signals": _signals()}
    if refs:
        reply["outputs"] = refs
    return reply


def _profile(payload: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """Calls for Nsight Compute (a profiled worker only): one warm call, then ``calls`` calls,
    each inside the NVTX range the profiler records."""
    import torch

    from kernforge.tasks.spec import Shape

    from . import integrity as I
    from .ncu import RANGE

    model = _model_for(Shape.of(msg["shape"]))
    inputs = _args(msg["args"])
    with _pool():
        model(*inputs)
        I.synchronize()
        for _ in range(int(msg["calls"])):
            torch.cuda.nvtx.range_push(RANGE)
            model(*inputs)
            I.synchronize()
            torch.cuda.nvtx.range_pop()
    return {"ok": True}


def _wait_byte(sock: socket.socket, timeout_s: float | None = None) -> bytes:
    """Spin until one byte arrives (the trusted clock is already running); that byte, or b""
    after ``timeout_s``."""
    from . import integrity as I

    deadline = None if timeout_s is None else I.perf_counter() + timeout_s
    sock.setblocking(False)
    try:
        while deadline is None or I.perf_counter() < deadline:
            try:
                byte = sock.recv(1)
                if byte:
                    return byte
                raise EOFError("the trusted side closed the batch socket")
            except BlockingIOError:
                continue
        return b""
    finally:
        sock.setblocking(True)


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


def _pool() -> Any:
    """This thread's torch allocations into the arena's heap (GPU); nothing to route on the CPU."""
    pool = _STATE.get("pool")
    return pool.use() if pool is not None else contextlib.nullcontext()


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _nowhere() -> Any:
    """A place no output can be: what the worker reports for one outside the arena (refused)."""
    from .messages import TensorRef

    return TensorRef(offset=0, dtype="uint8", shape=[1 << 62], strides=[1])


def _itemsizes() -> Any:
    from .messages import ITEMSIZE

    return ITEMSIZE


def _signals(*, rec: Any = None, kernels: list[str] | None = None, aliases: list[list[int]] | None = None,
             modes: list[str] | None = None, pinned: int | None = None, census: dict[str, int] | None = None,
             hooked: list[str] | None = None, inputs: int | None = None) -> dict[str, Any]:
    """``inputs``: how many elements the call's tensor inputs hold (what its host copies are
    measured against)."""
    from . import integrity as I, trace

    # A watched module given a class of its own runs the candidate's code on every attribute read,
    # the integrity check's own included: looked at first, by type() alone.
    swapped = [f"{name}.__class__ (a class of the candidate's)" for name, module in _STATE.get("modules", ())
               if type(module) is not MODULE_TYPE]
    return {
        "tampered": ((hooked or []) + trace.hooks_set() + (swapped or I.tampered(_STATE["snapshot"])))[:300],
        "new_threads": _new_threads()[:300],
        "task_globals": _changed_task_globals(),
        "torch_ops": dict(rec.ops) if rec is not None else {},
        "dispatched_ops": dict(list((census or {}).items())[:4096]),
        "trace_evasions": sorted(set(rec.evasions if rec is not None else ()) | set(trace.audited())
                                 | set(trace.host_compute(rec, inputs) if rec is not None and inputs is not None else ()))[:100],
        "launches": dict(rec.launches) if rec is not None else {},
        "gpu_kernels": sorted(set(kernels or []))[:1000],
        "aliases": aliases or [],
        "modes": modes or [],
        "capture_queries": _STATE.get("capture_queries", 0),
        "l2_persisting_limit": pinned,
    }


def _clear_hooks() -> list[str]:
    """Trace and profile hooks the candidate left set, and garbage-collector callbacks it added:
    removed at once (they would run its code inside the harness's own work) and named."""
    import gc
    import sys
    import threading

    found = []
    for name, get, put in (("sys.settrace", sys.gettrace, sys.settrace), ("sys.setprofile", sys.getprofile, sys.setprofile),
                           ("threading.settrace", getattr(threading, "gettrace", lambda: None), threading.settrace),
                           ("threading.setprofile", getattr(threading, "getprofile", lambda: None), threading.setprofile)):
        if get() is not None:
            put(None)
            found.append(f"{name} (a hook left set after forward)")
    known = _STATE.get("gc_callbacks", ())
    if any(id(cb) not in known for cb in gc.callbacks):
        gc.callbacks[:] = [cb for cb in gc.callbacks if id(cb) in known]
        found.append("gc.callbacks (a callback added by the candidate)")
    return found


def _elements(inputs: list[Any]) -> int:
    from . import integrity as I

    return sum(int(x.numel()) for x in inputs if I.type_(x) is I.Tensor)


def _own_attributes(t: Any) -> bool:
    """Whether a tensor object carries attributes of its own (its instance dictionary)."""
    try:
        return bool(I_TENSOR_DICT(t))
    except (AttributeError, TypeError):
        return False


def _l2() -> Any:
    import torch

    from . import timing

    if "l2" not in _STATE:
        _STATE["l2"] = timing.L2Control(torch.device(_STATE["device"]))
    return _STATE["l2"]


def _poison(nbytes: int) -> None:
    """Fill memory the next allocations can come from with all-ones bytes: the pool's free cached
    blocks, and the heap's lowest free spans (first fit hands those out as new segments) up to
    ``nbytes``. An output the candidate allocates but never writes then shows the poison (#1, #19)."""
    import torch

    pool, arena = _STATE["pool"], _STATE["arena"]
    device = _STATE["device"]
    index = torch.device(device).index or 0
    try:
        segments = pool.pool.snapshot()
    except (AttributeError, RuntimeError):  # a torch without pool snapshots: the heap's spans still are
        segments = []
    free = [b["size"] for seg in segments if seg.get("device") == index for b in seg.get("blocks", []) if b.get("state") == "inactive"]
    with pool.use():
        blocks = [torch.full((int(n),), POISON_BYTE, dtype=torch.uint8, device=device) for n in sorted(free, reverse=True)]
    del blocks
    base, left = arena.data.data_ptr(), int(nbytes)
    for start, size in pool.region.free_spans():
        if left <= 0:
            break
        n = min(size, left)
        arena.data[start - base: start - base + n].fill_(POISON_BYTE)
        left -= n


def _aliases(returned: list[Any], inputs: list[Any]) -> list[list[int]]:
    """For each returned tensor, the inputs whose bytes it overlaps (#17). Byte extents, not
    storages: every input is a view of the one shared arena, whose storage spans everything."""
    import torch

    def span(t: torch.Tensor) -> tuple[int, int]:
        extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1
        return t.data_ptr(), t.data_ptr() + extent * t.element_size()

    result = []
    for out in returned:
        hits = []
        if out.numel():
            lo, hi = span(out)
            for i, x in enumerate(inputs):
                if isinstance(x, torch.Tensor) and x.numel():
                    xlo, xhi = span(x)
                    if lo < xhi and xlo < hi:
                        hits.append(i)
        result.append(hits)
    return result


def _active_modes() -> list[str]:
    """Torch function and dispatch modes still pushed after forward returned (#7)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    stack = list(_get_current_function_mode_stack()) + list(_get_current_dispatch_mode_stack())
    return [type(m).__qualname__ for m in stack][:20]


def _task_globals() -> dict[str, Any]:
    """The task module's plain globals and functions, as the candidate found them (#22)."""
    from kernforge.tasks import runtime

    module = runtime.reference_module(_STATE["task"])
    _STATE["task_module"] = module
    return {k: (v if isinstance(v, (int, float, str, bool)) else id(v)) for k, v in vars(module).items()
            if not k.startswith("__") and (isinstance(v, (int, float, str, bool)) or callable(v))}


def _changed_task_globals() -> list[str]:
    before = _STATE.get("task_globals")
    module = _STATE.get("task_module")
    if before is None or module is None:
        return []
    changed = []
    now = vars(module)
    sized = _shape_names()
    for k, v in before.items():
        if k in sized:
            continue  # the harness itself sets the size globals per shape
        cur = now.get(k)
        cur = cur if isinstance(cur, (int, float, str, bool)) else id(cur)
        if cur != v:
            changed.append(k)
    return changed[:50]


def _shape_names() -> set[str]:
    task = _STATE.get("task")
    if task is None:
        return set()
    names: set[str] = set()
    for s in task.cpu_public_shapes + task.cpu_hidden_shapes + task.public_shapes + task.hidden_shapes:
        names |= {k for k, _ in s.params}
    return names


def _watch_capture_queries() -> None:
    """Count the candidate's own calls asking whether the stream is being captured (#13);
    library code asking for itself does not count."""
    import torch

    from . import trace

    original = torch.cuda.is_current_stream_capturing

    def counted() -> bool:
        if sys._getframe(1).f_globals.get("__name__") == trace.CANDIDATE_MODULE:
            _STATE["capture_queries"] = _STATE.get("capture_queries", 0) + 1
        return original()

    torch.cuda.is_current_stream_capturing = counted


def _record_thread_starts() -> None:
    """Remember every thread started, even one that has already finished (#6): through
    ``threading`` by name, and raw ``_thread`` starts as such."""
    import _thread

    started: list[str] = _STATE.setdefault("started", [])
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        _STATE["via_threading"] = _STATE.get("via_threading", 0) + 1
        try:
            return original(self)
        finally:
            _STATE["via_threading"] -= 1

    threading.Thread.start = start

    def recording(raw: Any) -> Any:
        def start_raw(function: Any, *args: Any, **kwargs: Any) -> Any:
            if not _STATE.get("via_threading"):
                started.append(f"raw thread running {getattr(function, '__qualname__', '?')}")
            return raw(function, *args, **kwargs)
        return start_raw

    # every name a raw start is reached by: threading keeps its own reference to _thread's
    # (red team: ``threading._start_new_thread`` started a thread no record saw)
    for owner, name in ((_thread, "start_new_thread"), (_thread, "start_new"), (_thread, "start_joinable_thread"),
                        (threading, "_start_new_thread"), (threading, "_start_joinable_thread")):
        if hasattr(owner, name):
            setattr(owner, name, recording(getattr(owner, name)))


def _new_threads() -> list[str]:
    known = _STATE.get("threads", set())
    alive = {t.name for t in threading.enumerate() if t.ident not in known}
    return sorted(alive | set(_STATE.get("started", [])))


def _text(err: BaseException) -> str:
    """``str(err)``, which runs the candidate's ``__str__``: whatever it raises, a text."""
    try:
        text = str(err)
        return text if type(text) is str else "(an error whose text is not text)"
    except BaseException as inner:  # noqa: BLE001 - the candidate's __str__ may raise anything
        return f"(an error whose __str__ raised {type(inner).__name__})"


def _stage_of(err: BaseException) -> str:
    name = type(err).__name__
    text = _text(err)
    if name in ("CompilationError", "CompileTimeAssertionFailure", "PTXASError") or "Error building extension" in text:
        return "compile"
    if isinstance(err, MemoryError) or "out of memory" in text.lower():
        return "oom"
    return "runtime"


def _format_error(err: BaseException, limit: int = 4000) -> str:
    try:
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    except BaseException:  # noqa: BLE001 - a candidate's exception whose text cannot be formatted
        text = f"{type(err).__name__}: {_text(err)}"
    return text if len(text) <= limit else "...\n" + text[-limit:]
