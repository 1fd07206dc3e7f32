"""A candidate's Triton kernels compiled ahead of its verdict, at its task's public shapes, while
the GPU judges the candidate before it (issue #17: a warm verdict on an H100 spent 0.9 s of its
4.3 s in the candidate's own compiles at each new shape's first checked call).

The loop knows the next candidate while the current one is judged. A sandbox worker of the
candidates' pool (triton_ahead_worker.py) imports it and calls it once per public shape on meta
tensors, every Triton launch turned into a compile; the files of its Triton cache come back, and
the verdict's worker finds them in its own cache folder before it imports the candidate
(harness.py ``_attach``), so that its first calls at those shapes load kernels instead of
compiling them.

Why this cannot change a verdict:

* **Public shapes only.** Compiling at a hidden shape would show the candidate's code that shape
  before its checks (THREATS #14); the worker ahead is told the public shapes' inputs (shapes,
  strides, dtypes: nothing drawn) and nothing else, and never sees the verdict's seed.
* **The files are the candidate's own.** Only the same source's verdict gets them, into its own
  worker's cache folder, which that worker can write anyway: they give it nothing it could not
  make itself. They are never shared between sources and never reach a trusted process (the
  reference worker's compiles live in the trusted cache, WorkerSpec.trusted_cache).
* **Kernels and their launchers only, never over the worker's own.** Only a compiled kernel's
  files are carried, and a kernel's launcher (triton_files.py): Triton 3.6 generates a C module
  from each kernel's signature and builds it with the host's compiler at the kernel's first
  launch, which the worker ahead does after each compile. Only keys the candidate's calls made
  are carried, and the verdict's worker writes none over a file it has: its warm-up's own
  modules (Triton's driver module, the warm-up kernel's launcher) are loaded from that cache
  (written over, the first H100 run's every verdict crashed). A launcher is a shared object
  the candidate's own sandboxed process built and only the candidate's own worker loads, at its
  own kernel's launch: what it could run there it can run there anyway (its Python writes that
  cache folder, whose files Triton loads), so it is no more than the kernels' files.
* **Nothing it says is evidence.** A compile ahead that failed, timed out, or answered anything
  malformed gives no files (``accepted`` checks every name and size); the verdict's worker then
  compiles as before. A kernel missing from the files is compiled where it is launched.
* **It cannot disturb a timed phase.** The worker ahead is enlisted with the GPU's gate for its
  whole life (gate.py): every judge that times stops it first. Its calls are on meta tensors; a
  candidate that puts GPU work there anyway only slows the other verdict's checks.

An accepted verdict's files go on to its audit (loop/devices.py): the second verdict's worker
and the profiled one load them as the verdict's did, the same guard around them, and a profiled
worker given them that made no Nsight Compute record makes it again without them (audit.py): the
files save compiles and never cost an audit its evidence.

CUDA C++ sources are not compiled ahead (their build is an import, in a folder of its own).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from typing import Any, Mapping

from kernforge.sandbox.protocol import Limits, SandboxError, WorkerFailure
from kernforge.tasks import runtime
from kernforge.tasks.loader import candidate_bundle
from kernforge.tasks.spec import Task

from .gate import DeviceGate
from .triton_files import cache_name, whole_keys

AHEAD_ENTRY = "kernforge.verifier.triton_ahead_worker:run"
#: the worker ahead stops calling the candidate after this long; what it compiled comes back
BUDGET_S = 20.0
#: and is killed after this long, answer or not (its start, the import, the compiles)
LIMIT_S = 40.0
#: what the files of one candidate's kernels may come to, and how many (fused_moe's compiles at
#: its public shapes, every IR Triton keeps beside the binary, are well within both)
MAX_BYTES = 8 * 1024 * 1024
MAX_FILES = 400
#: warm workers the compile ahead leaves in its pool for the verdicts (their start is seconds)
SPARE = 1
#: how long it waits for one more than that to be warm before it gives up (it takes its worker
#: holding the GPU's gate shared, and a wait for a worker's start there kept the other verdict's
#: timed phases waiting: 0.6 s a verdict in the first H100 run)
READY_WAIT_S = 5.0
def wanted(source: str) -> bool:
    """Whether ``source`` is one to compile ahead: a CUDA C++ extension builds when imported, in
    a folder this does not carry, for a minute of CPU time the verdict would repeat."""
    return "cpp_extension" not in source and "load_inline" not in source


def calls(task: Task) -> list[dict[str, Any]]:
    """One call per public GPU shape, its inputs described for meta tensors (``{"meta": {shape,
    strides, dtype}}``, or ``{"value": v}``); a shape whose inputs cannot be drawn on the meta
    device, or include anything else, is left out (compiled in the verdict)."""
    described = []
    for shape in task.shapes("cuda", hidden=False):
        try:
            args = [_described(x) for x in runtime.meta_inputs(task, shape)]
        except Exception:  # noqa: BLE001 - a draw that needs data: that shape compiles in the verdict
            continue
        if all(a is not None for a in args):
            described.append({"shape": shape.as_dict(), "args": args})
    return described


def _described(x: Any) -> dict[str, Any] | None:
    import torch

    if isinstance(x, torch.Tensor):
        return {"meta": {"shape": list(x.shape), "strides": list(x.stride()), "dtype": str(x.dtype).removeprefix("torch.")}}
    if isinstance(x, (bool, int, float)) or x is None:
        return {"value": x}
    return None


def accepted(files: Any) -> dict[str, str]:
    """The files of an answer that are a Triton cache's (``<key>/<name>``, base64, within
    ``MAX_BYTES`` and ``MAX_FILES``, each key a kernel's files or a launcher alone); none at all
    where anything else is in it."""
    if not isinstance(files, Mapping) or len(files) > MAX_FILES or not whole_keys(n for n in files if cache_name(n)):
        return {}
    total = 0
    for name, data in files.items():
        if not cache_name(name) or not isinstance(data, str):
            return {}
        try:
            total += len(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            return {}
        if total > MAX_BYTES:
            return {}
    return dict(files)


class Ahead:
    """One candidate's compile ahead, on a worker of ``backend`` enlisted with ``gate``: ``run``
    (on a thread of its own) gives the files, ``cancel`` (from any thread) ends it early."""

    def __init__(self, backend: Any, gate: DeviceGate, source: str, task: Task, device: str, *, spare: int = SPARE) -> None:
        self._backend, self._gate, self.source, self._task, self._device = backend, gate, source, task, device
        self._spare = spare
        self._lock = threading.Lock()
        self._session: Any = None
        self._cancelled = False
        #: the calls made ahead (shapes), and what became of it, for the run's log (diagnostics:
        #: a failure's text is the candidate's process's, never evidence)
        self.shapes = 0
        self.outcome = "not run"

    def run(self) -> dict[str, str]:
        """The files of the candidate's kernels compiled at the public shapes; none where the
        compile ahead failed, ran out of time or was cancelled."""
        described = calls(self._task)
        if not described:
            self.outcome = "no public shape described for meta tensors"
            return {}
        payload = {"task": candidate_bundle(self._task), "source": self.source, "device": self._device, "calls": described,
                   "budget_s": BUDGET_S, "max_bytes": MAX_BYTES, "max_files": MAX_FILES}
        limits = Limits(wall_seconds=LIMIT_S)
        if not self._worker_to_spare():
            self.outcome = "cancelled" if self._cancelled else "no warm worker to spare"
            return {}
        try:
            with self._gate.enlisted(lambda: self._backend.session(AHEAD_ENTRY, payload, limits)) as session:
                with self._lock:
                    self._session = session
                    cancelled = self._cancelled
                try:
                    reply = {} if cancelled else session.recv(LIMIT_S)
                finally:
                    session.close()
        except (WorkerFailure, SandboxError, OSError) as error:
            self.outcome = "cancelled" if self._cancelled else f"its worker failed: {error}"[:200]
            return {}
        if not isinstance(reply, Mapping) or reply.get("op") != "ahead" or reply.get("ok") is not True:
            self.outcome = "cancelled" if self._cancelled else "no answer"
            return {}
        shapes = reply.get("shapes")
        self.shapes = shapes if isinstance(shapes, int) and not isinstance(shapes, bool) else 0
        files = accepted(reply.get("files"))
        failed = reply.get("failed")
        self.outcome = ("a malformed answer" if reply.get("files") and not files
                        else f"a call failed: {failed}"[:200] if isinstance(failed, str) and failed else "compiled")
        return files

    def _worker_to_spare(self) -> bool:
        """Whether the pool has a warm worker for this beside ``spare`` for the verdicts (waiting
        ``READY_WAIT_S`` for one, never holding the gate): a worker taken while none was warm
        would be waited for with the gate held shared."""
        counts = getattr(self._backend, "counts", None)
        if counts is None:
            return False
        end = time.monotonic() + READY_WAIT_S
        while not self._cancelled:
            if counts().get("ready", 0) > self._spare:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return False

    def cancel(self) -> None:
        """End the compile ahead now (its worker killed); ``run`` then gives what it had: nothing."""
        with self._lock:
            self._cancelled = True
            session = self._session
        if session is not None:
            session.close()
