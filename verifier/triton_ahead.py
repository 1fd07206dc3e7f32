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

* **Public shapes, and decoys; never a hidden shape.** Compiling at a hidden shape would show
  the candidate's code that shape before its checks (THREATS #14); the worker ahead is told the
  public shapes' inputs (shapes, strides, dtypes: nothing drawn) and never sees the verdict's seed
  or its hidden shapes. After the public shapes it is told ``DECOYS`` more, drawn from the task's
  space of shapes (tasks/draws.py) from the operating system's random source, independently of
  every verdict's draws: what it learns there is what a verdict's drawn shapes show the candidate
  at their checked calls anyway (samples of the space), and nothing of the shapes any verdict
  checks. A verdict's hidden shapes fall into the same few specializations of the candidate's
  kernels as shapes drawn at random (an integer argument that is 1, a multiple of 16, or
  neither; a block size from a width): on the CPU, 8 decoys left a seed's verdict about half of
  its hidden shapes' compiles, 1.7 a verdict over the built-in seeds, and 32 left 0.8
  (``bench/compile_keys.py --decoys 8 16 32 48``: 1.7, 1.3, 0.8, 0.6).
* **Decoys never hold a verdict up.** The public shapes' files come first, in an answer of their
  own, then each decoy's in one of its own; a verdict that begins before the decoys are done takes
  those that came and ends the rest.
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
import secrets
import threading
import time
from typing import Any, Iterable, Mapping

from kernforge.sandbox.protocol import Limits, SandboxError, WorkerFailure
from kernforge.tasks import draws, runtime
from kernforge.tasks.loader import candidate_bundle
from kernforge.tasks.spec import Shape, Task

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
#: where decoy shapes are drawn from: the operating system's, like a verdict's hidden draws
_RANDOM = secrets.SystemRandom()
#: shapes drawn from the task's space that the worker ahead compiles at after the public ones
DECOYS = 32
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
    return _calls_at(task, task.shapes("cuda", hidden=False))


def decoy_calls(task: Task, count: int) -> list[dict[str, Any]]:
    """``count`` shapes drawn from ``task``'s space (tasks/draws.py, from the operating system's
    random source) described as ``calls`` describes the public ones; fewer where the task has no
    space to draw from, or a drawn shape's inputs cannot be described for meta tensors."""
    try:
        drawn = draws.draw(task, "cuda", count, _RANDOM)
    except Exception:  # noqa: BLE001 - a drawer that fails costs the decoys, never the public shapes' files
        return []
    return _calls_at(task, drawn)


def _calls_at(task: Task, shapes: Iterable[Shape]) -> list[dict[str, Any]]:
    """A call per shape of ``shapes`` whose inputs can all be described for meta tensors."""
    described = []
    for shape in shapes:
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


def _is_answer(reply: Any, stage: str) -> bool:
    """Whether ``reply`` is the worker ahead's answer of ``stage`` ("public" or "decoys")."""
    return isinstance(reply, Mapping) and reply.get("op") == "ahead" and reply.get("ok") is True and \
        reply.get("stage", "public") == stage


def _calls_made(reply: Mapping[str, Any]) -> int:
    """The calls an answer says it made (diagnostics: the candidate's process's word)."""
    shapes = reply.get("shapes")
    return max(shapes, 0) if isinstance(shapes, int) and not isinstance(shapes, bool) else 0


class Ahead:
    """One candidate's compile ahead, on a worker of ``backend`` enlisted with ``gate``: ``run``
    (on a thread of its own) gives the files, ``cancel`` (from any thread) ends it early;
    ``staged`` is set once the public shapes' files are in (or ``run`` has ended): a verdict
    about to begin ends the decoys' compiles then, and keeps those files."""

    def __init__(self, backend: Any, gate: DeviceGate, source: str, task: Task, device: str, *, spare: int = SPARE,
                 decoys: int = DECOYS) -> None:
        self._backend, self._gate, self.source, self._task, self._device = backend, gate, source, task, device
        self._spare, self._decoys = spare, decoys
        self._lock = threading.Lock()
        self._session: Any = None
        self._cancelled = False
        self.staged = threading.Event()
        #: the calls made ahead (public shapes, decoys), and what became of it, for the run's log
        #: (diagnostics: a failure's text is the candidate's process's, never evidence)
        self.shapes = 0
        self.decoys = 0
        self.outcome = "not run"
        #: the pool's counts when it had no worker to spare (ready, starting, busy, a start's ms)
        self.pool: dict[str, int] | None = None

    def run(self) -> dict[str, str]:
        """The files of the candidate's kernels compiled at the public shapes and, where they
        were done in time, at the decoys; none where the compile ahead failed, ran out of time
        or was cancelled before the public shapes' files came."""
        try:
            return self._run()
        finally:
            self.staged.set()

    def _run(self) -> dict[str, str]:
        described = calls(self._task)
        if not described:
            self.outcome = "no public shape described for meta tensors"
            return {}
        decoys = decoy_calls(self._task, self._decoys) if self._decoys else []
        payload = {"task": candidate_bundle(self._task), "source": self.source, "device": self._device, "calls": described,
                   "decoys": decoys, "budget_s": BUDGET_S, "max_bytes": MAX_BYTES, "max_files": MAX_FILES}
        limits = Limits(wall_seconds=LIMIT_S)
        if not self._worker_to_spare():
            self.outcome = "cancelled" if self._cancelled else "no warm worker to spare"
            return {}
        started = time.monotonic()
        try:
            with self._gate.enlisted(lambda: self._backend.session(AHEAD_ENTRY, payload, limits)) as session:
                with self._lock:
                    self._session = session
                    cancelled = self._cancelled
                try:
                    reply = {} if cancelled else session.recv(LIMIT_S)
                    files = self._answer(reply, "public") or {}
                    if files and decoys and not self._cancelled:
                        self.staged.set()  # the verdict may take these now
                        files = self._with_decoys(session, files, LIMIT_S - (time.monotonic() - started))
                finally:
                    session.close()
        except (WorkerFailure, SandboxError, OSError) as error:
            self.outcome = "cancelled" if self._cancelled else f"its worker failed: {error}"[:200]
            return {}
        return files

    def _answer(self, reply: Any, stage: str) -> dict[str, str] | None:
        """The files of one answer of ``stage`` (``accepted``); None where it is not one. The
        public stage's answer sets ``shapes`` and ``outcome``."""
        if not _is_answer(reply, stage):
            if stage == "public":
                self.outcome = "cancelled" if self._cancelled else "no answer"
            return None
        files = accepted(reply.get("files"))
        failed = reply.get("failed")
        if stage == "public":
            self.shapes = _calls_made(reply)
            self.outcome = ("a malformed answer" if reply.get("files") and not files
                            else f"a call failed: {failed}"[:200] if isinstance(failed, str) and failed else "compiled")
        elif reply.get("files") and not files:
            return None  # malformed: nothing of it is taken
        return files

    def _with_decoys(self, session: Any, files: dict[str, str], left_s: float) -> dict[str, str]:
        """``files`` and those the decoys' answers add, one answer a decoy, until the last or
        ``left_s``: each merged where it is well formed and the whole stays within the caps
        (``accepted``, no name of an earlier answer's again). A verdict that begins ends the
        rest (``cancel``), and what came before stays; anything amiss ends it the same way."""
        deadline = time.monotonic() + left_s
        while True:
            try:
                reply = session.recv(max(deadline - time.monotonic(), 0.1))
            except (WorkerFailure, SandboxError, OSError):
                self.outcome += "; decoys cut short" if self._cancelled else "; no answer from the decoys"
                return files
            more = self._answer(reply, "decoys")
            if more is None:
                self.outcome += "; a malformed answer from the decoys" if _is_answer(reply, "decoys") else "; no answer from the decoys"
                return files
            if more:  # a decoy that needed no kernel the others had not adds nothing
                merged = accepted({**more, **files}) if not set(more) & set(files) else {}
                if not merged:
                    self.outcome += "; a malformed answer from the decoys"
                    return files
                files = merged
            self.decoys = min(self.decoys + _calls_made(reply), self._decoys)  # the worker's own count: diagnostics
            if reply.get("last") is True:
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
            seen = counts()
            if seen.get("ready", 0) > self._spare:
                return True
            if time.monotonic() >= end:
                self.pool = dict(seen)
                steps = getattr(self._backend, "start_steps", None)
                if steps is not None:  # where the pool's starts went, by the workers' own account
                    self.pool["start_steps"] = {k: round(v, 2) for k, v in steps().items()}
                return False
            time.sleep(0.05)
        return False

    def cancel(self) -> None:
        """End the compile ahead now (its worker killed); ``run`` then gives what it had: the
        public shapes' files where they came, else nothing."""
        with self._lock:
            self._cancelled = True
            session = self._session
        if session is not None:
            session.close()
