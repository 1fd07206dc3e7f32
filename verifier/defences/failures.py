"""The candidate's own failures (compile errors, exceptions, out of memory) and the sandbox's
verdicts on a worker that ended badly (THREATS #21 when it broke a limit)."""

from __future__ import annotations

from kernforge.sandbox.protocol import FailureKind, WorkerFailure

from ..checks import Check
from ..messages import Failure
from ..verdict import Rejected, Status
from . import Defence, register

COMPILE = register(Defence(
    Check.COMPILE, (), facts="the exception the worker caught while importing the module or compiling a kernel",
    trusted=False, rationale="A module that does not import or a kernel that does not compile cannot be judged.",
    remedy="Fix the error the traceback names; keep the module importable on its own (imports at the top, no "
           "undefined names, Triton constexprs for block sizes)."))
RUNTIME = register(Defence(
    Check.RUNTIME, (), facts="the exception the worker caught while calling forward",
    trusted=False, rationale="A forward that raises on a shape the task allows is wrong on that shape.",
    remedy="Make forward work for every shape the task allows (odd sizes, tiny and large dimensions), with "
           "masks on partial blocks and grids computed from the sizes."))
OOM = register(Defence(
    Check.OUT_OF_MEMORY, (), facts="the allocation failure the worker caught",
    trusted=False, rationale="Outputs and temporaries must fit in the memory the judge gives each call.",
    remedy="Allocate only the outputs and the workspace a call needs; do not keep buffers per call or grow caches."))
SANDBOX = register(Defence(
    Check.SANDBOX, (21,), facts="how the worker's process ended, from its trusted supervisor and the sandbox's own watch",
    trusted=True, rationale="Wall-clock, CPU, memory, file and process limits are enforced outside the candidate's "
                            "process; a worker that breaks one, dies or hangs gets the verdict for it.",
    remedy="Stay within the sandbox: no network, no files outside the working directory, no child processes that "
           "outlive the call, and finish each call in time."))


def too_slow(what: str, limit_s: float, failure: WorkerFailure) -> Rejected:
    """No answer while ``what`` within a limit derived from the task (a hung or runaway call)."""
    return SANDBOX.reject(Status.TIMEOUT, f"no answer within {limit_s:.0f} s while {what}: the candidate hung or is far too slow "
                          "(the limit follows from the task and this candidate's own earlier calls)",
                          evidence={"failure": failure.kind.value, "limit_s": limit_s, "while": what,
                                    "diagnostics": failure.diagnostics.to_dict()})


def failed(reply: Failure, what: str, heap_bytes: int = 0, heap_short: tuple[int, int] | None = None) -> Rejected:
    """A worker's report that the candidate's code raised; ``heap_bytes``: the arena's heap its
    allocations came from (a GPU), which is what ran out, not the GPU's free memory torch quotes;
    ``heap_short``: (the room its temporaries had, the working copy planned) where this GPU could
    not give the whole copy (the judge's plan, judge._arena_layout)."""
    error = reply.error[-3000:]
    headline = error.strip().splitlines()[-1] if error.strip() else "no message"
    if reply.stage == "compile":
        return COMPILE.reject(Status.COMPILE_ERROR, f"compiling failed while {what}: {headline}", evidence={"error": error, "while": what})
    if reply.stage == "oom":
        gib = 1 << 30
        if heap_bytes and heap_short:
            room, copy = heap_short
            heap = (f" (a call's allocations come from the judge's heap of {heap_bytes / gib:.1f} GiB: room for its outputs, "
                    f"its weights and 2 GiB more, and {room / gib:.1f} GiB for its temporaries, less than the "
                    f"{copy / gib:.1f} GiB working copy of its largest input or weight the judge plans: this GPU has no "
                    "more room beside what judging a call holds; a kernel with fewer temporaries, or a GPU with more "
                    "memory, may pass)")
        elif heap_bytes:
            heap = (f" (a call's allocations come from the judge's heap of {heap_bytes / gib:.1f} GiB: room for its "
                    "outputs, its weights, a working copy of its largest input or weight and 2 GiB more)")
        else:
            heap = ""
        return OOM.reject(Status.RUNTIME_ERROR, f"ran out of memory while {what}{heap}: {headline}",
                          evidence={"error": error, "while": what, "heap_bytes": heap_bytes,
                                    **({"heap_room": heap_short[0], "planned_copy": heap_short[1]} if heap_short else {})})
    return RUNTIME.reject(Status.RUNTIME_ERROR, f"running failed while {what}: {headline}", evidence={"error": error, "while": what})


def ended(failure: WorkerFailure) -> Rejected:
    """A worker that died, hung or broke a limit."""
    evidence = {"failure": failure.kind.value, "diagnostics": failure.diagnostics.to_dict()}
    kind = failure.kind
    if kind is FailureKind.TIMEOUT:
        return SANDBOX.reject(Status.TIMEOUT, f"the candidate did not finish in time: {failure.reason}", evidence=evidence)
    if kind is FailureKind.CRASHED:
        return SANDBOX.reject(Status.CRASHED, f"the candidate's process crashed: {failure.reason}", evidence=evidence)
    if kind is FailureKind.EXITED_EARLY:
        return SANDBOX.reject(Status.CRASHED, f"the candidate's process exited before finishing: {failure.reason}", evidence=evidence)
    if kind is FailureKind.PROTOCOL_VIOLATION:
        from .reply import malformed

        return malformed(f"the worker's channel carried something that is not a harness reply: {failure.reason}", "the judge")
    return SANDBOX.reject(Status.SANDBOX_VIOLATION, f"the candidate exceeded its sandbox limits: {failure.reason}",
                          threat=21, evidence=evidence)
