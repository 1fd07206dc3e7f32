"""Runtime trace of one candidate call: which torch ops ran and which kernels launched.

An early signal, in the candidate's own process: it can reject, never accept (code there can
undo it; the trusted list of kernels that ran comes from Nsight Compute when a winner is audited).

* torch ops: a ``TorchDispatchMode`` sees every aten op dispatched during the call, from Python
  or from a C++ extension alike (THREATS #16). Ops issued by Triton's own launch machinery are
  not the candidate's and are ignored while a launch is in progress. The mode is per thread, so
  every thread started during a call (through ``threading`` or raw ``_thread``) runs under the
  call's recorder too, and the candidate's own calls that switch dispatch modes off are noted.
* Triton launches: ``JITFunction.run`` (and the interpreter's ``InterpretedFunction.run``) are
  wrapped once, during warm-up, to count launches by kernel name (#17).
* On a GPU, the CUDA kernels that actually executed, from the profiler (CUPTI), so a CUDA C++
  kernel built with ``load_inline`` counts too, and a launch that never reached the device
  does not.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_state = threading.local()


class _Recorder:
    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.launches: collections.Counter[str] = collections.Counter()
        #: calls by the candidate's module that switch the trace off (modes disabled, stack popped)
        self.evasions: collections.Counter[str] = collections.Counter()
        self.in_launch = 0


def _active() -> _Recorder | None:
    return getattr(_state, "recorder", None)


class _OpMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = _active()
        if rec is not None and not rec.in_launch:
            rec.ops[func.name()] += 1
        return func(*args, **(kwargs or {}))


def _wrap_run(cls: type) -> None:
    original = cls.run
    if getattr(original, "_kernforge_wrapped", False):
        return

    def run(self, *args, **kwargs):
        rec = _active()
        if rec is None or kwargs.get("warmup"):
            return original(self, *args, **kwargs)
        rec.launches[_kernel_name(self)] += 1
        rec.in_launch += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            rec.in_launch -= 1

    run._kernforge_wrapped = True  # type: ignore[attr-defined]
    cls.run = run


def _kernel_name(fn: Any) -> str:
    inner = getattr(fn, "fn", None)
    return getattr(inner, "__name__", None) or getattr(fn, "__name__", type(fn).__name__)


def install_launch_hooks() -> None:
    """Wrap Triton's launch entry points; called once per worker, before the candidate loads."""
    from triton.runtime.jit import JITFunction

    _wrap_run(JITFunction)
    try:
        from triton.runtime.interpreter import InterpretedFunction

        _wrap_run(InterpretedFunction)
    except ImportError:
        pass


#: the candidate's module name (harness.MODULE_NAME), for telling its calls from torch's own
CANDIDATE_MODULE = "kernforge_candidate"


def follow_threads() -> None:
    """Run every new thread under the recorder of the thread that started it (raw ``_thread``
    threads too); called once per worker, before the candidate loads."""
    import _thread

    def wrap(start: Any) -> Any:
        def started(function: Any, *args: Any, **kwargs: Any) -> Any:
            rec = _active()
            if rec is None:
                return start(function, *args, **kwargs)

            def run(*a: Any, **k: Any) -> Any:
                _state.recorder = rec
                try:
                    with _OpMode():
                        return function(*a, **k)
                finally:
                    _state.recorder = None

            return start(run, *args, **kwargs)

        return started

    for owner, name in ((_thread, "start_new_thread"), (_thread, "start_joinable_thread"), (threading, "_start_new_thread"),
                        (threading, "_start_joinable_thread")):
        if hasattr(owner, name):
            setattr(owner, name, wrap(getattr(owner, name)))
    if hasattr(_thread, "start_new"):
        _thread.start_new = _thread.start_new_thread


def watch_evasions() -> None:
    """Note the candidate's own calls that would hide its torch ops from the trace."""
    import sys

    from torch.utils import _python_dispatch

    def noted(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            rec = _active()
            if rec is not None and sys._getframe(1).f_globals.get("__name__") == CANDIDATE_MODULE:
                rec.evasions[name] += 1
            return original(*args, **kwargs)

        return call

    for name in ("_disable_current_modes", "_pop_mode", "_pop_mode_temporarily"):
        if hasattr(_python_dispatch, name):
            setattr(_python_dispatch, name, noted(name, getattr(_python_dispatch, name)))
    for name in ("_pop_torch_dispatch_stack", "_pop_torch_function_stack", "_DisableTorchDispatch", "DisableTorchFunction",
                 "DisableTorchFunctionSubclass", "_set_dispatch_mode", "_unset_dispatch_mode"):
        if hasattr(torch._C, name):
            setattr(torch._C, name, noted(name, getattr(torch._C, name)))


@contextlib.contextmanager
def recording() -> Iterator[_Recorder]:
    """Record torch ops and Triton launches made inside the block (this thread only)."""
    rec = _Recorder()
    _state.recorder = rec
    try:
        with _OpMode():
            yield rec
    finally:
        _state.recorder = None


@contextlib.contextmanager
def gpu_kernels() -> Iterator[list[str]]:
    """Names of the CUDA kernels that ran inside the block (filled in on exit)."""
    names: list[str] = []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield names
        torch.cuda.synchronize()
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            names.append(event.name)
