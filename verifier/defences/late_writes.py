"""Outputs that change after the call returned (THREATS #5, #6): work left running.

Trusted: the reference worker snapshots each output as soon as the reply arrives and reads it
again some tens of milliseconds later; the bytes must not have changed.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.LATE_WRITES, (5, 6),
    facts="each output's bytes read by the reference worker when the reply arrived and again after a pause",
    trusted=True,
    rationale="A call is over when it returns: an output still changing afterwards is being written by work the "
              "call left running on another stream, process or thread, which the caller would race with.",
    remedy="Finish every write before forward returns: keep work on the calling stream (or join it back), start no "
           "threads or processes."))


def changed(outputs: Sequence[int], ctx: str, on_gpu: bool) -> Rejected | None:
    if outputs:
        threat = 5 if on_gpu else 6
        return DEFENCE.reject(Status.CHEAT, f"output {outputs[0]} changed after forward returned ({ctx}): work was still running "
                              "on another stream, process or thread", threat=threat, evidence={"outputs": list(outputs)[:20]})
    return None

