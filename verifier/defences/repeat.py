"""Undefined behaviour (THREATS #19): two calls on the same inputs, at other addresses, agree."""

from __future__ import annotations

from typing import Any, Mapping

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.REPEAT, (19,),
    facts="the outputs of two calls on the same inputs written to different places, compared by the reference worker",
    trusted=True,
    rationale="A kernel that reads uninitialised or out-of-bounds memory, or races, gives answers that depend on "
              "where the data lies and what was there before; an honest one repeats itself to within rounding.",
    remedy="Initialise every accumulator, mask every load past the end of a tensor, and synchronise blocks that "
           "share data (or use atomics)."))


def disagree(repeat: Mapping[str, Any], ctx: str) -> Rejected | None:
    if not repeat or repeat.get("same", True):
        return None
    j = repeat.get("output", 0)
    return DEFENCE.reject(Status.INCORRECT, f"two calls on the same inputs disagree by {repeat.get('max_diff', float('nan')):.3g} in output {j} "
                          f"({ctx}): uninitialised, out-of-bounds or racy memory", threat=19, evidence=dict(repeat))
