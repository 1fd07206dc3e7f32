"""The worker's own clock against the trusted one (THREATS #8).

The time of record never comes from the candidate's process. The worker still reports how long
its own clock says each request took; an honest harness's figure is the trusted figure less the
message latency. One far below the trusted clock means code in that process rewrote the timer,
its locals or the reply: positive evidence of an attempt, rejected as a cheat. The bounds are
deliberately loose (half, and an absolute margin) so that no honest call on a loaded machine is
ever accused.
"""

from __future__ import annotations

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

#: the worker's figure may be this fraction of the trusted one before it counts as a lie...
RATIO = 0.5
DEFENCE = register(Defence(
    Check.TRUSTED_CLOCK, (8,),
    facts="the judge's and the reference worker's clocks around each request, against the figure the worker reports",
    trusted=True,
    rationale="Times of record come from trusted clocks and call counts; a worker reporting far less time than "
              "the trusted clock measured has had its timer, its locals or its reply rewritten.",
    remedy="Leave the timer and the harness alone; make the kernel faster instead."))


def lied(claimed_s: float, trusted_s: float, margin_s: float, ctx: str) -> Rejected | None:
    """``margin_s``: how much less than the trusted time an honest worker may report (latency)."""
    if trusted_s > 0 and claimed_s < RATIO * trusted_s and trusted_s - claimed_s > margin_s:
        return DEFENCE.reject(Status.CHEAT, f"the candidate's process reported {claimed_s * 1e3:.3f} ms where the trusted clock measured "
                              f"{trusted_s * 1e3:.3f} ms ({ctx}): the timer was fooled", threat=8,
                              evidence={"claimed_ms": claimed_s * 1e3, "trusted_ms": trusted_s * 1e3})
    return None
