"""Dispatch from (GPU architecture, dtype, shape bucket) to the best verified kernel.

Written by ``kernforge export`` unchanged into every package; all it knows comes from
manifest.json beside it. A call goes through five steps, and stops at the first that fails,
running the task's PyTorch reference instead and counting the fallback under that step's name:

1. ``arch``: the architecture of the tensors' device, ``sm_XY`` for CUDA. CPU tensors count as
   the Triton interpreter ("interpreter") only while ``TRITON_INTERPRET=1``: Triton kernels
   cannot run on the CPU otherwise, and the interpreter is for tests, far slower than PyTorch.
2. ``dtype``: the dtype of the first floating-point tensor argument selects, with the
   architecture, a group of entries verified together (e.g. sm_90 / bfloat16).
3. ``inputs``: every tensor argument has the dtype and rank it was verified with, is contiguous
   and is on the same device: the verifier only ever drew such inputs.
4. ``size``: the dispatch vector (every dimension of every tensor argument, then the scalar
   arguments) must match the group where every verified shape had one value (a *fixed* axis):
   no kernel was checked at another value there.
5. ``bucket``: the nearest verified shape, by the sum over the other axes of
   ``|log2(1 + a) - log2(1 + b)|``, names the kernel, or keeps the reference where no kernel
   measured fast enough at that shape.

Counters are per process and counted when an op's Python body runs: once per call in eager
mode and under ``torch.compile``, once at capture for a CUDA graph (a replay runs no Python).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

REASONS = ("arch", "dtype", "inputs", "size", "bucket")
INTERPRETER = "interpreter"

_lock = threading.Lock()
_hits: Counter = Counter()
_fallbacks: Counter = Counter()
_manifest: dict[str, Any] | None = None
_ops: dict[str, "OpDispatch"] = {}
_archs: dict[int, str] = {}
_triton: list[Any] = []


def manifest() -> dict[str, Any]:
    """The package's manifest.json (read once)."""
    global _manifest
    if _manifest is None:
        _manifest = json.loads(Path(__file__).with_name("manifest.json").read_text())
    return _manifest


def op(name: str) -> "OpDispatch":
    """The dispatcher of one op of this package."""
    if name not in _ops:
        _ops[name] = OpDispatch(name, manifest()["ops"][name], package=__package__)
    return _ops[name]


def counters() -> dict[str, dict[str, dict[str, int]]]:
    """Calls so far: ``{"hits": {op: {kernel: n}}, "fallbacks": {op: {reason: n}}}``."""
    with _lock:
        hits, falls = dict(_hits), dict(_fallbacks)
    out: dict[str, dict[str, dict[str, int]]] = {"hits": {}, "fallbacks": {}}
    for (name, kernel), n in sorted(hits.items()):
        out["hits"].setdefault(name, {})[kernel] = n
    for (name, reason), n in sorted(falls.items()):
        out["fallbacks"].setdefault(name, {})[reason] = n
    return out


def reset_counters() -> None:
    with _lock:
        _hits.clear()
        _fallbacks.clear()


def interpreting() -> bool:
    """Whether Triton kernels would run under its interpreter now (TRITON_INTERPRET=1)."""
    if not _triton:
        try:
            import triton
        except ImportError:
            triton = None
        _triton.append(triton)
    triton = _triton[0]
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def arch_of(device: torch.device) -> str | None:
    """``sm_XY`` for a CUDA device, "interpreter" for the CPU under the Triton interpreter."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _archs:
            major, minor = torch.cuda.get_device_capability(index)
            _archs[index] = f"sm_{major}{minor}"
        return _archs[index]
    if device.type == "cpu" and interpreting():
        return INTERPRETER
    return None


def vector_of(values: Sequence[Any]) -> tuple[int | float, ...]:
    out: list[int | float] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.extend(int(d) for d in v.shape)
        else:
            out.append(v if isinstance(v, float) else int(v))
    return tuple(out)


class Group:
    """The entries of one (architecture, dtype): a verified input layout, fixed axes, buckets."""

    CACHE = 4096

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.arch = spec["arch"]
        self.inputs = [None if i is None else (getattr(torch, i["dtype"]), i["ndim"]) for i in spec["inputs"]]
        self.fixed = {int(k): v for k, v in spec["fixed"].items()}
        self.buckets = list(spec["buckets"])
        width = len(self.buckets[0]["vector"])
        self.free = [i for i in range(width) if i not in self.fixed]
        self._logs = [[_log(b["vector"][i]) for i in self.free] for b in self.buckets]
        self._cache: dict[tuple, Mapping[str, Any]] = {}

    def check(self, args: Sequence[Any], device: torch.device, vector: tuple) -> str | None:
        """None when the call may use this group's kernels, else the fallback reason."""
        for arg, spec in zip(args, self.inputs):
            if spec is None:
                continue
            if (not isinstance(arg, torch.Tensor) or arg.dtype != spec[0] or arg.dim() != spec[1]
                    or arg.device != device or not arg.is_contiguous()):
                return "inputs"
        if len(vector) != len(self.buckets[0]["vector"]):
            return "inputs"
        if any(vector[i] != v for i, v in self.fixed.items()):
            return "size"
        return None

    def nearest(self, vector: tuple) -> Mapping[str, Any]:
        found = self._cache.get(vector)
        if found is None:
            logs = [_log(vector[i]) for i in self.free]
            distance = [sum(abs(a - b) for a, b in zip(logs, row)) for row in self._logs]
            found = self.buckets[min(range(len(distance)), key=distance.__getitem__)]
            if len(self._cache) < self.CACHE:
                self._cache[vector] = found
        return found


def _log(value: int | float) -> float:
    return math.log2(1.0 + abs(value))


class OpDispatch:
    """One op: chooses, counts, runs the kernel or the reference, and gives torch.compile its fake."""

    def __init__(self, name: str, spec: Mapping[str, Any], *, package: str | None) -> None:
        self.name = name
        self.package = package
        sig = spec["signature"]
        self.args = sig["args"]
        self.n_forward = sum(1 for a in self.args if not a["init"])
        self.n_outputs = sig["n_outputs"]
        self.returns_tuple = sig["returns_tuple"]
        self.groups = {(g["arch"], g["key_dtype"]): Group(g) for g in spec["groups"]}
        self.archs = {g["arch"] for g in spec["groups"]}
        self._models: dict[tuple, Any] = {}

    # ---- choosing ------------------------------------------------------------------------
    def choose(self, args: Sequence[Any]) -> tuple[str | None, str | None, Mapping[str, Any] | None]:
        """(kernel id or None, fallback reason or None, bucket or None) for one call."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors:
            return None, "inputs", None
        device = tensors[0].device
        arch = arch_of(device)
        if arch is None or arch not in self.archs:
            return None, "arch", None
        floating = [t.dtype for t in tensors if t.is_floating_point()]
        key = (floating or [tensors[0].dtype])[0]
        group = self.groups.get((arch, str(key).removeprefix("torch.")))
        if group is None:
            return None, "dtype", None
        vector = vector_of(args)
        reason = group.check(args, device, vector)
        if reason is not None:
            return None, reason, None
        bucket = group.nearest(vector)
        if bucket["kernel"] is None:
            return None, "bucket", bucket
        return bucket["kernel"], None, bucket

    def explain(self, args: Sequence[Any]) -> dict[str, Any]:
        kernel, reason, bucket = self.choose(args)
        return {"op": self.name, "kernel": kernel, "fallback": reason,
                "bucket": None if bucket is None else dict(bucket["shape"])}

    # ---- running -------------------------------------------------------------------------
    def call(self, args: Sequence[Any]) -> Any:
        kernel, reason, _ = self.choose(args)
        with _lock:
            if kernel is None:
                _fallbacks[(self.name, reason)] += 1
            else:
                _hits[(self.name, kernel)] += 1
        forward, init = list(args[: self.n_forward]), tuple(args[self.n_forward:])
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return self._finish(self._model(kernel, init, device)(*forward), forward)

    def reference(self, args: Sequence[Any]) -> Any:
        """The task's PyTorch reference on these arguments, as the op's fallback runs it."""
        forward, init = list(args[: self.n_forward]), tuple(args[self.n_forward:])
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        return self._finish(self._model(None, init, device)(*forward), forward)

    def fake(self, args: Sequence[Any]) -> Any:
        """Output metadata without computing: the reference run on fake tensors (torch.compile)."""
        if self.n_outputs == 0:
            return None
        forward, init = list(args[: self.n_forward]), args[self.n_forward:]
        out = self._module(None).Model(*init)(*forward)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        fresh = [o.new_empty(o.shape) for o in outs]
        return tuple(fresh) if self.returns_tuple else fresh[0]

    def _module(self, kernel: str | None):
        leaf = "reference" if kernel is None else f"kernels.{kernel}"
        return importlib.import_module(f"{self.package}.tasks.{self.name}.{leaf}")

    def _model(self, kernel: str | None, init: tuple, device: torch.device):
        key = (kernel, init, device)
        model = self._models.get(key)
        if model is None:
            module = self._module(kernel)
            model = (module.Model if kernel is None else module.ModelNew)(*init)
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            self._models[key] = model
        return model

    def _finish(self, out: Any, forward: Sequence[Any]) -> Any:
        """Outputs as the op's schema promises: fresh, contiguous tensors that alias no input."""
        if self.n_outputs == 0:
            return None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != self.n_outputs:
            raise RuntimeError(f"{self.name}: expected {self.n_outputs} output(s), got {len(outs)}")
        inputs = {a.untyped_storage().data_ptr() for a in forward if isinstance(a, torch.Tensor) and a.numel()}
        fixed = []
        for o in outs:
            if not o.is_contiguous():
                o = o.contiguous()
            elif o.numel() and o.untyped_storage().data_ptr() in inputs:
                o = o.clone()
            fixed.append(o)
        return tuple(fixed) if self.returns_tuple else fixed[0]
