"""Every reply a worker sends the judge, as a typed record, and the one parser that admits it.

A reply is an untrusted dictionary until ``parse(Type, data)`` has checked each field: exact
types (a ``bool`` is not an ``int``, a list is not a number), finite numbers within range,
bounded strings and lists, nested records. Anything else is a ``Malformed`` with a reason the
judge turns into a rejection (THREATS #9), never an exception: a candidate shares its worker's
process and can put anything on the channel. The trusted reference worker's replies go through
the same parser, so a bug there surfaces as a clear error too.

Requests travel the other way as plain dictionaries built by the judge; the worker code that
reads them is trusted.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar, Union

#: bytes per element of every dtype a tensor in shared memory may have (names as torch prints
#: them without the ``torch.`` prefix); kept here so the judge can check layouts without torch
ITEMSIZE: Mapping[str, int] = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}
MAX_DIMS = 16
MAX_LIST = 8192
MAX_STR = 8192
MAX_INT = 1 << 62


def _meta(**kw: Any) -> Any:
    return field(metadata=kw)


def _meta_default(default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING, **kw: Any) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=kw)
    return field(default=default, metadata=kw)


class Malformed(Exception):
    """A reply that does not fit its schema; ``str()`` says which field and why."""


# ---- records ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRef:
    """A tensor inside the shared arena: byte offset, dtype, shape and strides (in elements)."""

    offset: int = _meta(min=0)
    dtype: str = _meta(choices=tuple(ITEMSIZE))
    shape: list[int] = _meta(min=0, max_items=MAX_DIMS)
    strides: list[int] = _meta(min=0, max_items=MAX_DIMS)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def span(self) -> int:
        """Bytes from ``offset`` to the end of the last element (0 for an empty tensor)."""
        if self.numel == 0:
            return 0
        return (sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + 1) * self.itemsize

    def problem(self, limit: int) -> str | None:
        """Why this reference cannot be read from an arena of ``limit`` bytes (None: it can)."""
        if len(self.strides) != len(self.shape):
            return f"{len(self.shape)} sizes but {len(self.strides)} strides"
        if self.offset % self.itemsize:
            return f"offset {self.offset} is not a multiple of the {self.dtype} element size"
        if self.offset + self.span > limit:
            return f"bytes {self.offset}..{self.offset + self.span} lie outside the {limit}-byte shared memory"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "dtype": self.dtype, "shape": list(self.shape), "strides": list(self.strides)}


@dataclass(frozen=True)
class Signals:
    """What the candidate's worker noticed about itself: early, cheap signals that may reject a
    candidate, and are never a reason to accept one (code in that process can forge them)."""

    tampered: list[str] = _meta_default(factory=list, max_len=300)
    new_threads: list[str] = _meta_default(factory=list, max_len=300)
    task_globals: list[str] = _meta_default(factory=list, max_len=300)
    torch_ops: dict[str, int] = _meta_default(factory=dict, min=0, max_len=300)
    #: ops the dispatcher ran (the profiler's count, below the dispatch modes; CPU checks)
    dispatched_ops: dict[str, int] = _meta_default(factory=dict, min=0, max_len=300, max_items=4096)
    trace_evasions: list[str] = _meta_default(factory=list, max_len=100)
    launches: dict[str, int] = _meta_default(factory=dict, min=0, max_len=300)
    gpu_kernels: list[str] = _meta_default(factory=list, max_len=1000)
    aliases: list[list[int]] = _meta_default(factory=list, min=0)
    modes: list[str] = _meta_default(factory=list, max_len=300)
    capture_queries: int = _meta_default(0, min=0)
    l2_persisting_limit: int | None = _meta_default(None, min=0)


@dataclass(frozen=True)
class Failure:
    """The candidate's code failed (an import error, an exception in forward, out of memory)."""

    op: str = _meta(max_len=40)
    ok: bool = _meta(equals=False)
    stage: str = _meta(choices=("compile", "runtime", "oom", "protocol"))
    error: str = _meta_default("", max_len=MAX_STR)


@dataclass(frozen=True)
class Loaded:
    op: str = _meta(equals="load")
    ok: bool = _meta(equals=True)
    signals: Signals = _meta()


@dataclass(frozen=True)
class Checked:
    """One checked call: where its outputs are, and what the worker noticed."""

    op: str = _meta(equals="check")
    ok: bool = _meta(equals=True)
    types: list[str] = _meta(max_len=200)
    outputs: list[TensorRef] = _meta(max_items=256)
    signals: Signals = _meta()
    #: the worker's own clock, request in to reply out (diagnostics; compared with the judge's)
    claimed_s: float = _meta(min=0.0)
    steps: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=32)


@dataclass(frozen=True)
class BatchReady:
    """A batch of calls captured (or, failing that, to be run eagerly): each call's outputs."""

    op: str = _meta(equals="prepare_batch")
    ok: bool = _meta(equals=True)
    outputs: list[list[TensorRef]] = _meta(max_items=MAX_LIST)
    mode: str = _meta(choices=("graph", "eager"))
    fallback_reason: str = _meta_default("", max_len=2000)
    signals: Signals = _meta_default(factory=Signals)


@dataclass(frozen=True)
class BatchRan:
    op: str = _meta(equals="run_batch")
    ok: bool = _meta(equals=True)
    claimed_s: float = _meta(min=0.0)
    signals: Signals = _meta_default(factory=Signals)
    #: where each call's outputs lie, when the batch ran eagerly (a graph's are known before)
    outputs: list[list[TensorRef]] = _meta_default(factory=list, max_items=MAX_LIST)


@dataclass(frozen=True)
class BatchesReleased:
    op: str = _meta(equals="release_batches")
    ok: bool = _meta(equals=True)


# ---- the reference worker's replies (trusted code, same parser) ---------------------------------
@dataclass(frozen=True)
class Arg:
    """One positional input: a tensor in the arena, or a plain value (int, float, list...)."""

    ref: TensorRef | None = _meta_default(None)
    value: Any = _meta_default(None)


@dataclass(frozen=True)
class OutputMeta:
    dtype: str = _meta(choices=tuple(ITEMSIZE))
    shape: list[int] = _meta(min=0, max_items=MAX_DIMS)


@dataclass(frozen=True)
class Prepared:
    """A call's inputs written into the arena, its reference computed and kept by the worker."""

    op: str = _meta(equals="prepare")
    ok: bool = _meta(equals=True)
    args: list[Arg] = _meta(max_items=256)
    outputs: list[OutputMeta] = _meta(max_items=256)
    #: output slots the candidate's worker copies into (CPU); empty where outputs stay put (GPU)
    slots: list[TensorRef] = _meta_default(factory=list, max_items=256)
    input_regions: list[list[int]] = _meta_default(factory=list, min=0, max_items=256)
    steps: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=32)


@dataclass(frozen=True)
class OutputResult:
    """How one output compared with the reference (see compare.py)."""

    output: int = _meta(min=0)
    ok: bool = _meta()
    problem: str = _meta_default("", max_len=2000)
    details: dict[str, Any] = _meta_default(factory=dict, max_items=64)


@dataclass(frozen=True)
class LateRead:
    """An earlier checked call whose outputs changed after its reply, read again at a later
    request (late_reads.py)."""

    key: str = _meta(max_len=64)
    outputs: list[int] = _meta(min=0, max_items=256)


@dataclass(frozen=True)
class Settled:
    """Every checked call whose second read was still due, read again: those with a change."""

    op: str = _meta(equals="settle")
    ok: bool = _meta(equals=True)
    late: list[LateRead] = _meta_default(factory=list, max_items=MAX_LIST)


@dataclass(frozen=True)
class Compared:
    op: str = _meta(equals="compare")
    ok: bool = _meta(equals=True)
    results: list[OutputResult] = _meta(max_items=256)
    #: inputs whose bytes changed during the call (other than the task's own in-place outputs)
    mutated_inputs: list[int] = _meta_default(factory=list, min=0)
    #: outputs whose bytes changed after the reply, read twice by the reference worker
    late_writes: list[int] = _meta_default(factory=list, min=0)
    #: earlier calls read again at this compare (late_reads.py) whose outputs had changed
    late_earlier: list[LateRead] = _meta_default(factory=list, max_items=MAX_LIST)
    repeat: dict[str, Any] = _meta_default(factory=dict, max_items=16)
    earlier: str = _meta_default("", choices=("", "cached", "deferred"))
    steps: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=32)


@dataclass(frozen=True)
class BatchPlanned:
    op: str = _meta(equals="plan_batch")
    ok: bool = _meta(equals=True)
    #: each call's arguments where they lie: a batch's first plan (a plan again keeps them; empty)
    sets: list[list[Arg]] = _meta(max_items=MAX_LIST)


@dataclass(frozen=True)
class BatchTimed:
    """The trusted clock over one batch: CUDA events of the reference worker's own stream."""

    op: str = _meta(equals="time_batch")
    ok: bool = _meta(equals=True)
    done: bool = _meta()
    window_ms: float = _meta(min=0.0)
    write_ms: float = _meta(min=0.0)
    write_floor_ms: float = _meta(min=0.0)
    #: why nothing was timed: another process kept the GPU busy (refworker._quiet_gpu)
    busy: str = _meta_default("", max_len=500)
    steps: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=32)
    #: the host's readings while the worker's done was awaited (host_load.Watch.facts)
    host: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=4)


@dataclass(frozen=True)
class Attached:
    op: str = _meta(equals="attach")
    ok: bool = _meta(equals=True)


@dataclass(frozen=True)
class CalibrationRan:
    """The candidate's worker's side of the calibration: rounds it ran (its word, diagnostics)."""

    op: str = _meta(equals="calibrate")
    ok: bool = _meta(equals=True)
    rounds: int = _meta(min=0)


@dataclass(frozen=True)
class Profiled:
    op: str = _meta(equals="profile")
    ok: bool = _meta(equals=True)


@dataclass(frozen=True)
class Calibrated:
    """The reference worker's windows over calibration rounds, and their writes (ms)."""

    op: str = _meta(equals="calibrate")
    ok: bool = _meta(equals=True)
    windows_ms: list[float] = _meta(min=0.0, max_items=64)
    writes_ms: list[float] = _meta(min=0.0, max_items=64)


@dataclass(frozen=True)
class BatchVerified:
    op: str = _meta(equals="verify_batch")
    ok: bool = _meta(equals=True)
    #: the first call whose outputs are wrong (-1: all right), and how
    failed_call: int = _meta(min=-1)
    results: list[OutputResult] = _meta_default(factory=list, max_items=256)
    #: calls whose probed elements (read right after "done") disagree with their final values
    incomplete_calls: list[int] = _meta_default(factory=list, min=0, max_items=MAX_LIST)
    mutated_inputs: list[int] = _meta_default(factory=list, min=0)
    max_abs_err: float = _meta_default(0.0, min=0.0, nonfinite=True)
    max_rel_err: float = _meta_default(0.0, min=0.0, nonfinite=True)
    steps: dict[str, float] = _meta_default(factory=dict, min=0.0, max_items=32)


T = TypeVar("T")


# ---- the parser ---------------------------------------------------------------------------------
def parse(cls: type[T], data: Any) -> T:
    """``data`` as a ``cls`` record; raises Malformed with the path of the first bad field, and
    for anything else the reply makes the reading raise (an integer too large for a float, data
    nested past the interpreter's depth): a malformed reply is a rejection, never a crash."""
    try:
        return _record(cls, data, cls.__name__)
    except Malformed:
        raise
    except (OverflowError, RecursionError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise Malformed(f"{cls.__name__} cannot be read: {type(err).__name__}: {str(err)[:200]}") from None


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, Mapping[str, Any], bool], ...]:
    """Each field of a record: its name, type, metadata and whether a reply may leave it out
    (worked out once per record type: a batch's reply holds thousands of records)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.metadata,
                  f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


@functools.cache
def _form(tp: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """A type's origin, its arguments and whether it is a record (worked out once per type)."""
    return typing.get_origin(tp), typing.get_args(tp), dataclasses.is_dataclass(tp)


def _record(cls: type, data: Any, path: str) -> Any:
    if type(data) is not dict:
        raise Malformed(f"{path} is a {type(data).__name__}, not an object")
    values = {}
    for name, hint, meta, optional in _fields(cls):
        if name not in data:
            if not optional:
                raise Malformed(f"{path}.{name} is missing")
            continue
        values[name] = _value(hint, data[name], f"{path}.{name}", meta)
    return cls(**values)


def _value(tp: Any, v: Any, path: str, meta: Mapping[str, Any]) -> Any:
    origin, args, record = _form(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [o for o in args if o is not type(None)]
        return _value(inner, v, path, meta)
    if tp is Any:
        return _plain(v, path, depth=0)
    if record:
        return _record(tp, v, path)
    if origin is list:
        (inner,) = args
        if type(v) is not list:
            raise Malformed(f"{path} is a {type(v).__name__}, not a list")
        if len(v) > meta.get("max_items", MAX_LIST):
            raise Malformed(f"{path} has {len(v)} items (at most {meta.get('max_items', MAX_LIST)})")
        item_meta = {k: meta[k] for k in ("min", "max", "max_len", "choices", "nonfinite") if k in meta}
        return [_value(inner, x, f"{path}[{i}]", item_meta) for i, x in enumerate(v)]
    if origin is dict:
        _, inner = args
        if type(v) is not dict:
            raise Malformed(f"{path} is a {type(v).__name__}, not an object")
        if len(v) > meta.get("max_items", 1024):
            raise Malformed(f"{path} has {len(v)} entries")
        item_meta = {k: meta[k] for k in ("min", "max", "max_len", "nonfinite") if k in meta}
        out = {}
        for k, x in v.items():
            if type(k) is not str or len(k) > 200:
                raise Malformed(f"{path} has a key that is not a short string")
            out[k] = _value(inner, x, f"{path}[{k!r}]", item_meta)
        return out
    if tp is bool:
        if type(v) is not bool:
            raise Malformed(f"{path} is a {type(v).__name__}, not a boolean")
    elif tp is int:
        if type(v) is not int:
            raise Malformed(f"{path} is a {type(v).__name__}, not an integer")
        _range(v, path, meta, default=(-MAX_INT, MAX_INT))
    elif tp is float:
        if type(v) not in (int, float):
            raise Malformed(f"{path} is a {type(v).__name__}, not a number")
        if type(v) is int and abs(v) > MAX_INT:
            raise Malformed(f"{path} is an integer of {len(str(abs(v)))} digits, not a measurement")
        v = float(v)
        if not math.isfinite(v):
            if not meta.get("nonfinite"):
                raise Malformed(f"{path} is {v}, not a finite number")
        else:
            _range(v, path, meta, default=(-math.inf, math.inf))
    elif tp is str:
        if type(v) is not str:
            raise Malformed(f"{path} is a {type(v).__name__}, not a string")
        if len(v) > meta.get("max_len", MAX_STR):
            raise Malformed(f"{path} is {len(v)} characters long")
    else:  # pragma: no cover - a schema bug, not a reply's
        raise TypeError(f"no rule for {tp!r} at {path}")
    if "choices" in meta and v not in meta["choices"]:
        raise Malformed(f"{path} is {str(v)[:40]!r}, not one of {list(meta['choices'])[:8]}")
    if "equals" in meta and v != meta["equals"]:
        raise Malformed(f"{path} is {str(v)[:40]!r}, expected {meta['equals']!r}")
    return v


def _range(v: float, path: str, meta: Mapping[str, Any], default: tuple[float, float]) -> None:
    lo, hi = meta.get("min", default[0]), meta.get("max", default[1])
    if not lo <= v <= hi:
        raise Malformed(f"{path} is {v}, outside [{lo}, {hi}]")


def _plain(v: Any, path: str, depth: int) -> Any:
    """JSON data of bounded size (values of non-tensor inputs)."""
    if depth > 8:
        raise Malformed(f"{path} nests too deeply")
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is float:
        return v
    if type(v) is list and len(v) <= MAX_LIST:
        return [_plain(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)]
    if type(v) is dict and len(v) <= 256:
        return {str(k): _plain(x, f"{path}[{k!r}]", depth + 1) for k, x in v.items()}
    raise Malformed(f"{path} is not plain data")


def failure_or(cls: type[T], data: Any) -> "T | Failure":
    """A reply that is either ``cls`` or the worker's report of a failure (``ok`` false)."""
    if type(data) is dict and data.get("ok") is False:
        return parse(Failure, data)
    return parse(cls, data)
