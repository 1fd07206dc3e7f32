"""Originals captured before a candidate loads, and an early check that nobody swapped them since.

The harness and the timing code call the function objects bound here at import time (which
happens during the worker's warm-up, before any candidate code exists in the process), so a
candidate that replaces ``torch.cuda.Event.elapsed_time`` or ``time.perf_counter`` does not
change what the harness calls (THREATS #8). ``snapshot``/``tampered`` also notice the swap
itself: every callable attribute of the watched modules and classes is recorded by identity.
"""

from __future__ import annotations

import builtins
import socket
import time
from types import ModuleType
from typing import Any

import torch

# Bound once, at import: the harness uses these, never the live attributes.
perf_counter = time.perf_counter
sleep = time.sleep
Tensor = torch.Tensor
tensor_cpu = torch.Tensor.cpu
tensor_clone = torch.Tensor.clone
tensor_contiguous = torch.Tensor.contiguous
tensor_equal = torch.equal
tensor_sum = torch.sum
vector_norm = torch.linalg.vector_norm
isinstance_ = builtins.isinstance
type_ = builtins.type


#: bytes compared at once: torch.equal holds a flag per element, which for a batch's whole input
#: region (gigabytes) would be as large again as the region
BITS_CHUNK = 256 << 20


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes: NaN equals NaN with the same bits (torch.equal says no).
    Compared a chunk at a time, as 8-byte words where the sizes allow."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    if x.numel() % 8 == 0 and x.data_ptr() % 8 == 0 and y.data_ptr() % 8 == 0:
        x, y = x.view(torch.int64), y.view(torch.int64)
    step = max(1, BITS_CHUNK // x.element_size())
    return all(tensor_equal(x[i: i + step], y[i: i + step]) for i in range(0, x.numel(), step))


if torch.cuda.is_available():
    Event = torch.cuda.Event
    event_record = torch.cuda.Event.record
    event_elapsed = torch.cuda.Event.elapsed_time
    synchronize = torch.cuda.synchronize
    CUDAGraph = torch.cuda.CUDAGraph
    graph_replay = torch.cuda.CUDAGraph.replay
    cuda_graph_ctx = torch.cuda.graph
    current_stream = torch.cuda.current_stream
    gpu_sleep = torch.cuda._sleep
    memory_snapshot = torch.cuda.memory_snapshot
else:  # the interpreter path never times on a device
    Event = event_record = event_elapsed = CUDAGraph = graph_replay = cuda_graph_ctx = current_stream = gpu_sleep = None
    memory_snapshot = None

    def synchronize(device: Any = None) -> None:
        return None


def watched() -> list[tuple[str, Any]]:
    """The namespaces whose callables the snapshot records, by name."""
    import triton

    owners: list[tuple[str, Any]] = [
        ("time", time),
        ("builtins", builtins),
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch.cuda", torch.cuda),
        ("torch.linalg", torch.linalg),
        ("torch.nn.functional", torch.nn.functional),
        ("torch.nn.Module", torch.nn.Module),
        ("triton", triton),
    ]
    if torch.cuda.is_available():
        owners += [("torch.cuda.Event", torch.cuda.Event), ("torch.cuda.CUDAGraph", torch.cuda.CUDAGraph),
                   ("torch.cuda.Stream", torch.cuda.Stream)]
    import threading

    from kernforge.tasks import runtime as task_runtime

    from . import arena, harness, heap, integrity, messages, timing, trace

    owners += [("threading", threading), ("threading.Thread", threading.Thread), ("kernforge.tasks.runtime", task_runtime)]
    owners += [(f"kernforge.verifier.{m.__name__.rsplit('.', 1)[-1]}", m) for m in (arena, harness, heap, integrity, messages, timing, trace)]
    owners += [("kernforge.verifier.arena.Arena", arena.Arena), ("kernforge.verifier.heap.HeapPool", heap.HeapPool),
               ("kernforge.verifier.heap.Region", heap.Region), ("socket.socket", socket.socket)]
    try:
        from triton.runtime import jit as triton_jit

        owners += [("triton.runtime.jit", triton_jit), ("triton.runtime.jit.JITFunction", triton_jit.JITFunction)]
    except ImportError:
        pass
    try:
        from triton.runtime import interpreter as triton_interp

        owners += [("triton.runtime.interpreter.InterpretedFunction", triton_interp.InterpretedFunction)]
    except (ImportError, AttributeError):
        pass
    return owners


def snapshot() -> dict[str, int]:
    """Identity of every callable or class attribute of the watched namespaces."""
    ids: dict[str, int] = {}
    for owner_name, owner in watched():
        names = vars(owner).keys() if isinstance(owner, (type, ModuleType)) else dir(owner)
        for name in list(names):
            try:
                value = vars(owner)[name] if name in vars(owner) else getattr(owner, name)
            except (AttributeError, KeyError):
                continue
            if callable(value) or isinstance(value, (type, staticmethod, classmethod, property)):
                ids[f"{owner_name}.{name}"] = id(value)
    return ids


def tampered(before: dict[str, int]) -> list[str]:
    """Names whose object changed or vanished since ``before``."""
    now = snapshot()
    return sorted(name for name, ident in before.items() if now.get(name) != ident)
