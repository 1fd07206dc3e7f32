"""Inputs written by the call (THREATS #4), read back from the shared memory by trusted code."""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.INPUT_MUTATION, (4,),
    facts="the inputs' bytes in the shared memory after the call, against the reference worker's pristine copies",
    trusted=True,
    rationale="A call that overwrites an input it must only read could fool the comparison (or the next call); the "
              "task names the inputs it writes in place.",
    remedy="Treat inputs as read-only (unless the task writes them in place); write results into new tensors."))


def mutated(inputs: Sequence[int], ctx: str) -> Rejected | None:
    if inputs:
        return DEFENCE.reject(Status.CHEAT, f"input {inputs[0]} was modified by the call ({ctx}); inputs are read-only for this task",
                              threat=4, evidence={"inputs": list(inputs)})
    return None
