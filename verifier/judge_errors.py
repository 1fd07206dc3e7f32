"""What stops the judge from giving a verdict: neither a candidate's failure nor a verdict
(verifier/judge.py raises them; the gate, verifier/gate.py, raises GpuBusy too). The run sets a
task aside on a JudgeError (one that ran out of memory only after a few tries: out_of_memory) and
leaves an attempt unjudged on a GpuBusy (loop/runner.py)."""

from __future__ import annotations


class JudgeError(Exception):
    """The judge itself could not work (the task's reference failed, a worker would not start)."""


class ReferenceFailed(JudgeError):
    """The reference worker is alive and answered, but the task's reference raised (its reply
    says why): the worker, and the arena it owns, can go on to the next request."""


class GpuBusy(JudgeError):
    """Another process kept the GPU busy before a timed window (the reference worker's quiet
    probe waited it out in vain), or another lane's worker could not be stopped for it
    (gate.py): the verdict cannot be timed. Neither the candidate's failure
    nor the task's: the attempt is left unjudged (a lane's stopped neighbour, or a process
    outside kernforge, ran work that would have landed in the window)."""


class GpuMemoryHeld(GpuBusy):
    """Other processes (another lane's reference worker, a process outside kernforge) held so
    much of the GPU's memory that the verdict, planned for what was free, ran out of it: neither
    the candidate's failure nor the task's, and the attempt is left unjudged."""


class WorkerStalled(GpuBusy):
    """The candidate's worker did not answer the harness's own step (its clock's calibration)
    before the candidate's module was loaded, while the judge held the GPU alone: nothing the
    candidate wrote had run yet, so the attempt is left unjudged, not rejected."""


class TaskTooLarge(JudgeError):
    """The task's largest call needs more memory than this GPU has: no candidate can be judged."""


def out_of_memory(error: BaseException) -> bool:
    """A failure because the GPU's memory ran out: PyTorch's words for it, or the driver's (the
    arena's own allocation, verifier/vmm.py)."""
    text = str(error)
    return "OutOfMemoryError" in text or "out of memory" in text.lower() or "CUDA_ERROR_OUT_OF_MEMORY" in text
