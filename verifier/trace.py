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

from .defences import reference_call

_state = threading.local()


class _Recorder:
    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.launches: collections.Counter[str] = collections.Counter()
        #: calls by the candidate's module that switch the trace off (modes disabled, stack popped)
        self.evasions: collections.Counter[str] = collections.Counter()
        #: elements the candidate's code copied out of torch to the host (numpy, Python lists)
        self.host_elements = 0
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


#: where the candidate's own code lives (set at warm-up): the worker's folder, where its module is
#: written, and the temporary folders, the only places it can write further modules to...
_CANDIDATE_DIRS: tuple[str, ...] = ()
#: ...except the import paths found there at warm-up (a virtual environment under /tmp is bound
#: into the worker's private /tmp at its own path): those hold libraries
_LIBRARY_ROOTS: tuple[str, ...] = ()
#: the file name Python gives code compiled from a string (eval, exec)
_FROM_STRING = "<string>"
#: the standard library: transparent (a call through it is made by whoever called into it)
_STDLIB: tuple[str, ...] = ()


def _folders(paths: set[str]) -> set[str]:
    import os

    return {os.path.abspath(p).rstrip(os.sep) + os.sep for p in paths} | {os.path.realpath(p).rstrip(os.sep) + os.sep for p in paths}


def _candidate_dirs() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    import os
    import sys
    import sysconfig
    import tempfile

    writable = _folders({os.getcwd(), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"})
    roots = _folders({p for p in sys.path if p and os.path.isdir(p)})
    # an import path that is a writable folder, or holds one, is not a library's
    roots = {r for r in roots if not any(w.startswith(r) for w in writable)}
    std = _folders({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
    return tuple(sorted(writable)), tuple(sorted(roots)), tuple(sorted(std))


def _is_candidates(path: str) -> bool:
    return path == _FROM_STRING or (path.startswith(_CANDIDATE_DIRS) and not path.startswith(_LIBRARY_ROOTS))


def _is_stdlib(path: str) -> bool:
    return path.startswith(_STDLIB) and "site-packages" not in path and "dist-packages" not in path


def from_candidate(depth: int) -> bool:
    """Whether the call made ``depth`` frames above the caller of this function is made by the
    candidate's code. Identified, never guessed: its module and any it wrote (the worker's own
    and temporary folders) or compiled from a string. The standard library is transparent (a
    thread's ``run`` or ``functools`` calls on behalf of whoever set them up); any other code
    (torch, triton, numpy, every installed package) is a library, and what it does is its own."""
    import sys

    frame = sys._getframe(depth + 2)
    while frame is not None:
        path = frame.f_code.co_filename
        if _is_candidates(path):
            return True
        if not _is_stdlib(path):
            return False
        frame = frame.f_back
    return False


def watch_evasions() -> None:
    """Note the candidate's own calls that would hide its work from the trace: switching the
    dispatch modes off, redispatching below the Python key, moving tensors to numpy."""
    global _CANDIDATE_DIRS, _LIBRARY_ROOTS, _STDLIB
    _CANDIDATE_DIRS, _LIBRARY_ROOTS, _STDLIB = _candidate_dirs()

    from torch.utils import _python_dispatch

    def noted(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            rec = _active()
            if rec is not None and from_candidate(0):
                rec.evasions[name] += 1
            return original(*args, **kwargs)

        return call

    for name in ("_disable_current_modes", "_pop_mode", "_pop_mode_temporarily"):
        if hasattr(_python_dispatch, name):
            setattr(_python_dispatch, name, noted(name, getattr(_python_dispatch, name)))
    for name in ("_pop_torch_dispatch_stack", "_pop_torch_function_stack", "_DisableTorchDispatch", "DisableTorchFunction",
                 "DisableTorchFunctionSubclass", "_set_dispatch_mode", "_unset_dispatch_mode", "_ExcludeDispatchKeyGuard",
                 "_dispatch_tls_set_dispatch_key_excluded", "_dispatch_tls_set_dispatch_key_included", "_EnablePythonDispatcher",
                 "_DisablePythonDispatcher"):
        if hasattr(torch._C, name):
            setattr(torch._C, name, noted(name, getattr(torch._C, name)))
    # the dispatcher's own count stopped or restarted (dispatched() reads the profiler)
    import torch.autograd.profiler as autograd_profiler

    for owner in (torch.autograd, torch._C._autograd, autograd_profiler):
        for name in ("_disable_profiler", "_disable_profiler_legacy", "_enable_profiler", "_enable_profiler_legacy",
                     "_prepare_profiler"):
            if hasattr(owner, name):
                setattr(owner, name, noted(f"profiler.{name}", getattr(owner, name)))
    # below the Python key, or bytes written through ctypes
    import ctypes

    owners = ((torch._ops.OpOverload, "redispatch"), (torch._C._DispatchOperatorHandle, "redispatch_boxed"),
              (ctypes, "memmove"), (ctypes, "memset"))
    for owner, name in owners:
        if hasattr(owner, name):
            setattr(owner, name, noted(f"{owner.__name__}.{name}", getattr(owner, name)))

    # out of torch to the host (numpy, Python lists): counted by elements, since reading a few
    # values of metadata (sequence lengths, expert counts) to size a launch is honest
    def counted(original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            rec = _active()
            if rec is not None and from_candidate(0):
                rec.host_elements += int(self.numel())
            return original(self, *args, **kwargs)

        return call

    for name in ("numpy", "__array__", "__dlpack__", "tolist"):
        if hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))


#: a call whose candidate code copies to the host this share of the call's input elements, or
#: more, computes out of torch and its kernels (THREATS #16)
HOST_SHARE = 0.25


def host_compute(rec: _Recorder, input_elements: int) -> list[str]:
    """The evasion a call's host copies amount to, if they cover a large share of its inputs."""
    if rec.host_elements and rec.host_elements >= HOST_SHARE * max(input_elements, 1):
        return [f"host copies of {rec.host_elements} elements (of {input_elements} in the call's inputs)"]
    return []


#: audit events the candidate's own code raised, by name (sys.addaudithook: a hook cannot be
#: removed, though what it records lives in this process like everything else here)
_AUDITED: collections.Counter[str] = collections.Counter()
#: events that mean work or hooks out of the trace's sight, whenever the candidate raises them
_WATCHED_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "ctypes.cdata", "ctypes.cdata/buffer", "subprocess.Popen",
                             "os.system", "os.exec", "os.posix_spawn", "os.spawn", "gc.get_referents", "gc.get_referrers",
                             "gc.get_objects", "os.fork", "os.forkpty"})
#: programs started: counted only during a call (a module may build its extension at import)
_RUN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"})
#: events refused outright when the candidate raises them: another process of its own could
#: write its outputs after it answered (fork alone has no honest use in a worker)
_REFUSED_EVENTS = frozenset({"os.fork", "os.forkpty"})
#: events whose stack is read only one frame deep (the standard library raises them for
#: everyone: ``warnings`` and ``logging`` read frames)
_DIRECT_EVENTS = frozenset({"sys._getframe"})


def install_audit_hook() -> None:
    """An audit hook (PEP 578) that notes the events above when the candidate's code raises
    them, and refuses fork. Installed once at warm-up, before any candidate code; it cannot be
    removed."""
    import sys

    if getattr(install_audit_hook, "done", False):
        return

    inside = threading.local()  # the hook's own frame reads raise events too: not re-entered

    def hook(event: str, args: tuple) -> None:
        if (event not in _WATCHED_EVENTS and event not in _DIRECT_EVENTS) or getattr(inside, "busy", False):
            return
        inside.busy = True
        try:
            if event in _DIRECT_EVENTS:
                if _direct_caller_is_candidate():
                    _AUDITED[event] += 1
                return
            if event in _RUN_EVENTS and _active() is None:
                return  # a build at import (nvcc, ninja) starts programs; during a call nothing may
            if from_candidate(0):
                _AUDITED[event] += 1
                if event in _REFUSED_EVENTS:
                    raise PermissionError(f"{event}: a candidate may not start copies of its own process")
        finally:
            inside.busy = False

    sys.addaudithook(hook)
    install_audit_hook.done = True  # type: ignore[attr-defined]


def _direct_caller_is_candidate() -> bool:
    import sys

    frame = sys._getframe(2)  # this function, the hook, the frame that raised the event
    return frame is not None and _is_candidates(frame.f_code.co_filename)


#: events that reach into the harness: its frames, its objects, interpreter hooks (THREATS #10)
_REACHING_EVENTS = {"sys.settrace": "a trace hook", "sys.setprofile": "a profile hook", "sys._getframe": "the interpreter's frames",
                    "gc.get_referents": "objects through the garbage collector", "gc.get_referrers": "objects through the garbage collector",
                    "gc.get_objects": "every object through the garbage collector"}


def audited() -> list[str]:
    """Events the candidate raised that do work out of the trace's sight (THREATS #16)."""
    return sorted(e for e in _AUDITED if e not in _REACHING_EVENTS)


def hooks_set() -> list[str]:
    """What the candidate's code reached into at any time: hooks, frames, objects (THREATS #10)."""
    return [f"{e} ({what}, by the candidate)" for e, what in _REACHING_EVENTS.items() if _AUDITED.get(e)]


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
def dispatched(cuda: bool = False) -> Iterator[tuple[collections.Counter[str], list[str]]]:
    """Every op the dispatcher ran in this thread inside the block, counted by name, and with
    ``cuda`` the names of the CUDA kernels that ran (both filled in on exit). Ops are counted by
    the profiler's RecordFunction hooks, inside the dispatcher and below its Python key, so ops
    the dispatch mode never sees count too: under a guard that excludes the Python key, with the
    modes disabled or popped, in the body of a custom op, in code a Triton launch runs (a grid
    callable, a pre-run hook, an argument's attribute)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    counts: collections.Counter[str] = collections.Counter()
    names: list[str] = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield counts, names
        if not torch.autograd._profiler_enabled():  # stopped inside the block: what it counted says nothing
            counts[reference_call.STOPPED] += 1
        if cuda:
            torch.cuda.synchronize()
    for event in prof.events():
        kind = getattr(event, "device_type", None)
        if kind == DeviceType.CUDA:
            names.append(event.name)
        elif "::" in event.name:
            counts[event.name] += 1
