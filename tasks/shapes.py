"""Hidden shapes for a plain KernelBench file: vary every size, never an operator setting.

A KernelBench file states one problem size in integer globals (``batch_size``, ``dim``,
``in_channels``, ``kernel_size``, ...). Some of them are sizes a kernel must not hard-code;
others are operator settings (a kernel size, a stride, a reduction axis) that define the
problem. Names alone cannot tell them apart (``dim = 16384`` is a size in one file and
``dim = 1`` an axis in the next), so each global is tried: the file is run on the ``meta``
device (shapes and dtypes, no data, no memory) with that global changed, and

* a global is a size when the change reaches the shape of an input or of a parameter or
  buffer of ``Model(*get_init_inputs())``, and construction and forward still succeed;
* a global whose change breaks construction or forward for every value tried, or changes
  nothing but values, is left alone; so are names that are settings by convention
  (``_SETTING``: kernel, stride, padding, dilation, groups, patch), which change a weight's
  shape without being a size.

Hidden shapes are then each size varied alone (an odd non-power-of-two near 3n/4, and 1 or 2
where valid) and all sizes varied together. Only values below the default are tried, and every
kept variant moves at most the default's bytes (inputs, outputs, parameters and buffers,
measured on meta), so a hidden shape never costs more memory or time than the public one.

Everything is deterministic: the values tried and their order depend only on the file, and the
probe budget counts probes and aten ops, never seconds. Where a file cannot be probed (it does
not run on meta, or its forward is too long to run there, such as an RNN unrolled per step),
only the batch is varied, as before (``batch_only``).
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Mapping

from .errors import TaskError
from .runtime import load_module, set_globals
from .spec import Shape

#: At most this many hidden shapes per file (each one is a reference run and a candidate run).
MAX_HIDDEN = 8
#: Probes per file that construct the model and draw its inputs on meta (cheap: no forward).
MAX_BUILDS = 32
#: Probes per file that also run a forward on meta, the default shape's included.
MAX_FORWARDS = 20
#: Aten calls one forward may make on meta. A recurrence unrolled per time step (an LSTM over
#: 512 steps is ~46k calls, seconds on meta) is not probed; ResNet-101's forward is 554 calls.
FORWARD_OPS = 1000
#: Distinct aten ops (cache misses, see _Meter) all forwards of one file may compute: no new
#: forward starts past it. A meta op costs ~20 us to ~5 ms (batch norm's Python kernel).
FILE_OPS = 1000

#: Names that are operator settings by convention. They change a weight's shape (a conv's
#: kernel_size, its groups, a ViT's patch_size) yet define the problem rather than size it.
_SETTING = re.compile(r"(^|_)(kernel|stride|padding|pad|dilation|groups|patch)(_|$)")


@dataclass(frozen=True)
class Plan:
    """The hidden shapes chosen for one file and what the probes found."""

    default: Shape
    shapes: tuple[Shape, ...]
    #: why the probes were not used and only the batch varies; None when they were
    fallback: str | None = None
    probes: int = 0
    ops: int = 0
    #: bytes of one call's inputs, outputs and weights at the default shape, measured on meta
    #: (0 where the default shape does not run there)
    default_bytes: int = 0

    @property
    def varied(self) -> tuple[str, ...]:
        """Globals some hidden shape sets to a value other than the default's."""
        default = self.default.as_dict()
        return tuple(k for k in default if any(s.as_dict()[k] != default[k] for s in self.shapes))


def batch_only(globals_: Mapping[str, int]) -> tuple[Shape, ...]:
    """Vary the batch, the one size always safe to vary (the fallback, and the CPU's shapes)."""
    batch = globals_.get("batch_size")
    if not batch:
        return (Shape.of(globals_),)
    odd = batch + 1 if batch % 2 == 0 else batch + 2
    sizes = sorted({1, odd, max(1, batch // 2 - 1)})
    return tuple(Shape.of({**globals_, "batch_size": b}) for b in sizes)


_PLANS: dict[tuple[Any, ...], Plan] = {}


def int_globals(module: ModuleType) -> dict[str, int]:
    """A module's integer globals: its sizes and settings (KernelBench reads sizes from globals)."""
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_") and isinstance(v, int) and not isinstance(v, bool)
    }


def plan(path: Path, public: Iterable[Shape] = ()) -> Plan:
    """Hidden shapes for the KernelBench file at ``path``, none of them one of ``public``.

    The file is probed in a private copy of its module (probing sets its globals; the copy the
    runtime shares is never touched), and the plan is kept per process by the file's content:
    ``load_task`` runs often (the reference worker calls it per request)."""
    path = Path(path).resolve()
    try:
        digest = hashlib.sha1(path.read_bytes()).hexdigest()
    except OSError as err:
        raise TaskError(f"{path}: cannot be read ({err})") from None
    key = (str(path), digest)
    if key not in _PLANS:
        import torch

        with torch.random.fork_rng(devices=[]):  # the file's import may seed torch
            module = load_module(path, fresh=True)
        _PLANS[key] = _Planner(module, int_globals(module)).run()
    found, public = _PLANS[key], set(public)
    if found.fallback is not None or not public & set(found.shapes):
        return found
    kept = tuple(s for s in found.shapes if s not in public)
    if kept:
        return replace(found, shapes=kept)
    return replace(found, shapes=batch_only(found.default.as_dict()), fallback="every variant found is a public shape")


# ---- probing -----------------------------------------------------------------------------------
class _OpLimit(Exception):
    pass


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    signature: tuple[Any, ...] = ()
    nbytes: int = 0
    ops: int = 0
    error: str = ""


class _Meter:
    """Runs a forward's aten ops on meta: counts them, stops past a limit, and computes each
    distinct op once per file.

    A meta kernel's result is a function of its arguments' shapes, strides and dtypes and its
    other arguments. So an op seen again with the same metadata is not run again: one whose
    outputs are fresh tensors gets fresh tensors of the recorded metadata, and an in-place one
    that left its tensor's metadata alone the first time returns that tensor. Views and anything
    else run every time. A ResNet repeats its blocks, and a variant that changes one late size
    repeats every op before it, while a Python meta kernel (batch norm's) costs ~5 ms a call.
    """

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}
        self.kinds: dict[Any, str | None] = {}

    def mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        meter = self

        class Count(TorchDispatchMode):
            calls = 0  # aten calls since the limit was set
            misses = 0  # the ones computed (not found in the cache)
            limit: int | None = None

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.calls += 1
                if self.limit is not None and self.calls > self.limit:
                    raise _OpLimit(f"more than {self.limit} aten ops")
                return meter.call(self, func, args, kwargs or {})

        return Count()

    def kind(self, func: Any) -> str | None:
        if func not in self.kinds:
            schema = func._schema
            rets, params = schema.returns, schema.arguments
            if rets and all(r.alias_info is None and str(r.type) == "Tensor" for r in rets):
                self.kinds[func] = "fresh"
            elif (len(rets) == 1 and rets[0].alias_info is not None and rets[0].alias_info.is_write and params
                  and params[0].alias_info is not None and params[0].alias_info.is_write):
                self.kinds[func] = "inplace"
            else:
                self.kinds[func] = None
        return self.kinds[func]

    def call(self, counter: Any, func: Any, args: Any, kwargs: Any) -> Any:
        import torch

        if func is torch.ops.aten.native_batch_norm.default:
            return _batch_norm(*args, **kwargs)
        kind = self.kind(func)
        key = None
        if kind is not None:
            try:
                key = (func, _meta_key(args), _meta_key(tuple(sorted(kwargs.items()))), torch.get_default_dtype())
            except TypeError:
                kind = None  # an argument that is not plain data: run the op every time
        if kind is not None and key in self.cache:
            spec = self.cache[key]
            return args[0] if spec == "self" else _rebuild(spec)
        counter.misses += 1
        before = _meta_key(args[0]) if kind == "inplace" else None
        out = func(*args, **kwargs)
        if kind == "fresh":
            spec = _spec(out)
            if spec is not None:
                self.cache[key] = spec
        elif kind == "inplace" and out is args[0] and _meta_key(out) == before:
            self.cache[key] = "self"
        return out


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: A002
    """``aten.native_batch_norm`` on meta, by its shape rule. Its meta kernel is a Python
    decomposition of ~5 ms a call, most of a CNN's probe; the rule is: the output is like the
    input, the saved mean and inverse std are per channel (float32 for a half input), and every
    per-channel tensor has one entry per channel (the batch-of-one check is F.batch_norm's own,
    before this)."""
    import torch

    if input.dim() < 2:
        raise RuntimeError(f"batch norm needs at least 2 dimensions, got input of shape {tuple(input.shape)}")
    channels = input.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and t.numel() != channels:
            raise RuntimeError(f"batch norm: {name} should contain {channels} elements not {t.numel()}")
    stats = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    save = [torch.empty((channels,), dtype=stats, device=input.device) for _ in range(2)]
    return torch.empty_like(input), *save


def _meta_key(value: Any) -> Any:
    """What a meta kernel's result can depend on, hashable; TypeError for anything else. An int
    stands for itself (sizes, dims); other scalars carry their type (``x * 1.0`` is not ``x * 1``)."""
    import torch

    cls = type(value)
    if cls is int:
        return value
    if isinstance(value, torch.Tensor):
        return (value.shape, value.stride(), value.storage_offset(), value.dtype, value.device)
    if cls is list or cls is tuple:
        return tuple([_meta_key(v) for v in value])
    if value is None or isinstance(value, (bool, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format, torch.Size)):
        return (cls, value)
    raise TypeError(cls.__name__)


def _spec(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.stride(), out.dtype) if out.is_meta else None
    if isinstance(out, tuple):
        specs = tuple(_spec(o) for o in out)
        return None if any(s is None for s in specs) else ("tuple", specs)
    return None


def _rebuild(spec: Any) -> Any:
    import torch

    if spec[0] == "tuple":
        return tuple(_rebuild(s) for s in spec[1])
    shape, stride, dtype = spec
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _probe(module: ModuleType, values: Mapping[str, int], limit: int | None, meter: _Meter,
           made: tuple[Any, list[Any]] | None = None) -> tuple[_Outcome, tuple[Any, list[Any]] | None]:
    """Construct ``Model`` and draw its inputs on meta with the globals set to ``values`` (or take
    ``made``, what an earlier probe of the same values built); run one forward too unless
    ``limit`` is None (at most ``limit`` aten calls). Also returns the model and inputs, unused."""
    import torch

    set_globals(module, values)
    counter = meter.mode()
    outputs: list[Any] = []
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad(), torch.device("meta"):
            warnings.simplefilter("ignore")
            with counter:
                if made is None:
                    model = module.Model(*module.get_init_inputs())
                    inputs = list(module.get_inputs())
                else:
                    model, inputs = made
                if limit is not None:
                    counter.calls, counter.limit = 0, limit
                    outputs = _tensors(model(*inputs))
    except _OpLimit as err:
        return _Outcome(False, ops=counter.misses, error=f"too long to probe on meta ({err})"), None
    # The file's own code fails in its own ways (an assert on divisibility, a shape mismatch,
    # .item() on meta, an einops error): each is a reason to leave the value alone, kept as text.
    except Exception as err:  # noqa: BLE001
        return _Outcome(False, ops=counter.misses, error=f"{type(err).__name__}: {str(err)[:200]}"), None
    real = [str(t.device) for t in _tensors(inputs) if not t.is_meta]
    if real:  # get_inputs names a device itself: every probe would allocate real memory
        return _Outcome(False, ops=counter.misses, error=f"get_inputs puts tensors on {real[0]}, not meta"), None
    if limit is not None and counter.calls > limit:  # the file caught _OpLimit itself
        error = f"too long to probe on meta (more than {limit} aten ops)"
        return _Outcome(False, ops=counter.misses, error=error), None
    if limit is not None and not outputs:
        return _Outcome(False, ops=counter.misses, error="forward returned no tensor"), None
    state = []
    if isinstance(model, torch.nn.Module):
        state = [*model.named_parameters(), *model.named_buffers()]
    in_tensors = _tensors(inputs)
    signature = (
        tuple((tuple(t.shape), t.dtype) for t in in_tensors),
        tuple((name, tuple(t.shape)) for name, t in state),
    )
    nbytes = sum(t.numel() * t.element_size() for t in [*in_tensors, *outputs, *(t for _, t in state)])
    return _Outcome(True, signature, nbytes, counter.misses), (None if limit is not None else (model, inputs))


def _tries(n: int) -> list[tuple[str, int]]:
    """Values to try for a size whose default is ``n``, as (slot, value), in order.

    Slot "odd": an odd non-power-of-two near 3n/4 (it needs tail handling and matches no
    hard-coded size), then 3n/4, n/2 and n/4 for a size another global must divide. Slot
    "small": 1, then 2. The slots alternate, so a size whose odd value is invalid gets its
    small one early. Only values below ``n``: a hidden shape never outgrows the public one."""
    odd = (3 * n // 4) | 1
    lanes = (
        [("odd", odd if odd < n else n - 1), ("odd", 3 * n // 4), ("odd", n // 2), ("odd", n // 4)],
        [("small", 1), ("small", 2)],
    )
    seen: set[int] = set()
    out: list[tuple[str, int]] = []
    for i in range(max(map(len, lanes))):
        for lane in lanes:
            if i < len(lane) and 0 < lane[i][1] < n and lane[i][1] not in seen:
                seen.add(lane[i][1])
                out.append(lane[i])
    return out


class _Planner:
    """One file's probes, in the order that spends a tight budget best:

    1. the default shape, with a forward (the file runs on meta at all; the bytes to stay under);
    2. each global's values without a forward (cheap), round-robin, until one constructs: a
       global whose value constructs with no input or weight changing shape is a setting;
    3. every size at once, with a forward: one probe may cover them all;
    4. each size alone, with forwards, round-robin: every size without a valid value gets its
       next value before any size gets a second one (then all sizes at once again, from the
       values that ran alone);
    5. sizes that never ran alone, together with the sizes of the same default value (a
       depthwise conv's in_channels and out_channels, attention's embed_dim and channels);
    6. each size's other slot (1 or 2 beside the odd value), then all sizes at once once more,
       adding them one at a time where all at once fails.
    """

    def __init__(self, module: ModuleType, default: dict[str, int]) -> None:
        self.module = module
        self.default = default
        self.builds = 0
        self.forwards = 0
        self.ops = 0
        self.base = _Outcome(False)
        self.seen: dict[tuple[frozenset[tuple[str, int]], bool], _Outcome] = {}
        self.meter = _Meter()
        self.made: dict[frozenset[tuple[str, int]], tuple[Any, list[Any]]] = {}

    @property
    def probes(self) -> int:
        return self.builds + self.forwards

    def build(self, changes: Mapping[str, int]) -> _Outcome | None:
        """Construct and draw inputs only; None when the budget is spent."""
        key = (frozenset(changes.items()), False)
        if key not in self.seen:
            if self.builds >= MAX_BUILDS:
                return None
            self.builds += 1
            self.seen[key], made = _probe(self.module, {**self.default, **changes}, None, self.meter)
            if made is not None:
                self.made[key[0]] = made  # its forward, if it gets one, needs no second build
        return self.seen[key]

    def run_(self, changes: Mapping[str, int]) -> _Outcome | None:
        """Construct and run a forward; None when the budget is spent."""
        key = frozenset(changes.items())
        built = self.seen.get((key, False))
        if built is not None and not built.ok:
            return built  # it cannot run if it cannot even be built
        if (key, True) not in self.seen:
            if self.forwards >= MAX_FORWARDS or self.ops >= FILE_OPS:
                return None
            values, made = {**self.default, **changes}, self.made.pop(key, None)
            outcome, _ = _probe(self.module, values, FORWARD_OPS, self.meter, made)
            self.forwards += 1
            self.ops += outcome.ops
            self.seen[(key, True)] = outcome
        return self.seen[(key, True)]

    def fits(self, outcome: _Outcome | None) -> bool:
        return outcome is not None and outcome.ok and outcome.nbytes <= self.base.nbytes

    def run(self) -> Plan:
        default = Shape.of(self.default)
        base = self.run_({})
        if base is None or not base.ok:
            reason = f"the default shape does not run on meta: {base.error if base else 'no budget'}"
            return Plan(default, batch_only(self.default), fallback=reason, probes=self.probes, ops=self.ops)
        self.base = base
        built, stuck = self.sizes([k for k, v in self.default.items() if v >= 2 and not _SETTING.search(k)])
        sizes = list(built)
        if not sizes:
            reason = "no integer global changes an input's or a weight's shape on meta"
            return self._plan(batch_only(self.default), reason)

        # Accepted variants, each a dict of changes: singles (one size, or sizes tied by their
        # default) by slot, and all-at-once variants.
        found: dict[str, dict[str, int]] = {k: {} for k in sizes}
        ties: list[dict[str, int]] = []
        combos: list[dict[str, int]] = []
        self.combine(built, combos)
        self.singles(sizes, found, all_slots=False,
                     after_first_round=lambda: self.combine(self.values(found, ties), combos))
        self.tie(sizes, stuck, found, ties)
        self.combine(self.values(found, ties), combos)

        def enough() -> bool:
            return bool(combos) + len(ties) + sum(map(len, found.values())) >= MAX_HIDDEN

        self.singles(sizes, found, all_slots=True, stop=enough)
        self.combine(self.values(found, ties), combos, greedy=True)

        singles = [{k: found[k][slot]} for slot in ("odd", "small") for k in sizes if slot in found[k]]
        chosen: list[Shape] = []
        combos.sort(key=len, reverse=True)  # the one that varies the most sizes first
        for changes in [*combos[:1], *ties, *singles, *combos[1:]]:
            shape = Shape.of({**self.default, **changes})
            if shape != default and shape not in chosen:
                chosen.append(shape)
        if not chosen:
            reason = "no variant ran on meta within the probe budget"
            return self._plan(batch_only(self.default), reason)
        return self._plan(tuple(sorted(chosen[:MAX_HIDDEN])))

    def _plan(self, shapes: tuple[Shape, ...], fallback: str | None = None) -> Plan:
        """The plan of these shapes, once the default shape ran, with what the probes counted."""
        return Plan(Shape.of(self.default), shapes, fallback=fallback, probes=self.probes, ops=self.ops,
                    default_bytes=self.base.nbytes)

    def sizes(self, names: list[str]) -> tuple[dict[str, int], list[str]]:
        """Step 2: the globals whose value changes an input's or a weight's shape, each with the
        first of its values that builds; and the globals with no value that builds alone."""
        pending = {k: deque(v for _, v in _tries(self.default[k])) for k in names}
        built: dict[str, int] = {}
        stuck: list[str] = []
        while pending:
            for name in list(pending):
                value = pending[name].popleft()
                outcome = self.build({name: value})
                if outcome is None:
                    pending.clear()
                    break
                if outcome.ok and outcome.signature != self.base.signature:
                    built[name] = value
                if not outcome.ok and not pending[name]:
                    stuck.append(name)
                if outcome.ok or not pending[name]:
                    del pending[name]  # a size, a setting, or nothing builds
        return {k: built[k] for k in names if k in built}, [k for k in names if k in stuck]

    def singles(self, sizes: list[str], found: dict[str, dict[str, int]], *, all_slots: bool,
                after_first_round: Any = None, stop: Any = None) -> None:
        """Steps 4 and 6: each size alone, round-robin, one value per size per round, until
        ``stop()`` says there are enough."""
        queues = {k: deque(_tries(self.default[k])) for k in sizes}
        first = True
        while any(queues.values()):
            for name in sizes:
                if stop is not None and stop():
                    return
                queue = queues[name]
                while queue and (queue[0][0] in found[name] or (found[name] and not all_slots)):
                    queue.popleft()  # that slot has its value (or, for now, the size has one)
                if not queue:
                    continue
                slot, value = queue.popleft()
                outcome = self.run_({name: value})
                if outcome is None:
                    return  # the budget is spent
                if self.fits(outcome):
                    found[name][slot] = value
            if first and after_first_round is not None:
                after_first_round()
            first = False

    def tie(self, sizes: list[str], stuck: list[str], found: dict[str, dict[str, int]],
            ties: list[dict[str, int]]) -> None:
        """Step 5: a size that never ran alone (or a global that never built alone), varied
        with the sizes of the same default."""
        names = [*sizes, *stuck]
        for name in names:
            if found.get(name) or any(name in t for t in ties):
                continue
            group = [k for k in names if self.default[k] == self.default[name]]
            alone = [k for k in group if not found.get(k)]
            # The others that never ran alone first (both sides of a constraint), then all.
            for members in ([alone] if len(alone) >= 2 else []) + ([group] if len(group) > len(alone) else []):
                if self.tie_group(members, ties) is None:
                    return
                if any(name in t for t in ties):
                    break

    def tie_group(self, members: list[str], ties: list[dict[str, int]]) -> bool | None:
        """Vary ``members`` to one value together; None when the budget is spent."""
        for _, value in _tries(self.default[members[0]]):
            outcome = self.run_({k: value for k in members})
            if outcome is None:
                return None
            if self.fits(outcome) and outcome.signature != self.base.signature:
                ties.append({k: value for k in members})
                return True
        return False

    @staticmethod
    def values(found: dict[str, dict[str, int]], ties: list[dict[str, int]]) -> dict[str, int]:
        """One value per size that ran: its odd one where it has one; a tie's over a single's."""
        values = {k: slots.get("odd", slots.get("small")) for k, slots in found.items() if slots}
        for tie in ties:
            values.update(tie)
        return values

    def combine(self, values: dict[str, int], combos: list[dict[str, int]], *, greedy: bool = False) -> None:
        """All of ``values`` at once; with ``greedy``, where that fails, add them one at a time
        and keep each one that still runs."""
        if len(values) < 2 or any(set(values) <= set(c) for c in combos):
            return  # one that varies all of these at once already runs
        if self.fits(self.run_(values)):
            combos.append(dict(values))
            return
        if not greedy:
            return
        kept: dict[str, int] = {}
        for name, value in values.items():
            trial = {**kept, name: value}
            if len(trial) == 1 or self.fits(self.run_(trial)):
                kept = trial  # one size alone already ran as a single
        if len(kept) >= 2:
            combos.append(kept)
