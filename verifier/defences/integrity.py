"""Replaced functions and changed task globals, as the worker sees them (THREATS #8, #10, #22).

An early signal only: the worker snapshots the identity of every function the harness and the
timer use before the candidate loads, and compares after each request. Code in that process can
undo the snapshot too, which is why no time or value the judge records comes from that process.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

TIMER_NAMES = ("time.", "Event", "synchronize", "elapsed", "CUDAGraph", "perf_counter", "monotonic")

REPLACED = register(Defence(
    Check.INTEGRITY, (8, 10), facts="identities of watched functions before the candidate loaded and after each request",
    trusted=False,
    rationale="Honest kernels never replace torch's, Triton's or kernforge's functions; doing so is an attempt on "
              "the timer (#8) or the harness (#10).",
    remedy="Leave library and harness functions as they are: import what you need and call it."))
GLOBALS = register(Defence(
    Check.TASK_GLOBALS, (22,), facts="the task module's globals in the candidate's process",
    trusted=False,
    rationale="Changing the task's size globals or input functions in the candidate's process is an attempt to "
              "make the call smaller; inputs come from the trusted side, so it could only mislead.",
    remedy="Do not modify the task's module; read sizes from the tensors forward receives."))


def replaced(names: Sequence[str], ctx: str) -> Rejected | None:
    if not names:
        return None
    timer = [n for n in names if any(t in n for t in TIMER_NAMES)]
    threat = 8 if timer else 10
    shown = ", ".join((timer or list(names))[:6])
    what = "timer functions were replaced" if timer else "the candidate replaced or reached into the harness or its libraries"
    return REPLACED.reject(Status.CHEAT, f"{what} {ctx}: {shown}", threat=threat, evidence={"replaced": list(names)[:50]})


def task_globals(names: Sequence[str], ctx: str) -> Rejected | None:
    if not names:
        return None
    return GLOBALS.reject(Status.CHEAT, f"the task's module was changed in the candidate's process ({ctx}): {', '.join(names[:6])}",
                          threat=22, evidence={"changed": list(names)[:50]})
