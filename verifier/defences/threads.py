"""Background threads (THREATS #6), as the worker counts them: an early signal; the trusted
re-read of the outputs (late_writes.py) is what a thread writing late cannot hide from."""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.THREADS, (6,), facts="threads started from Python or alive after the call, counted by the harness",
    trusted=False,
    rationale="A kernel needs no host thread of its own; one started by the candidate can fill an output after the "
              "call returned.",
    remedy="Do all the work inside forward on the calling thread; launch kernels, do not start threads."))


def started(names: Sequence[str], ctx: str) -> Rejected | None:
    if names:
        return DEFENCE.reject(Status.CHEAT, f"the candidate started threads {list(names)[:3]} ({ctx}): work done behind the call's back",
                              threat=6, evidence={"threads": list(names)[:20]})
    return None
