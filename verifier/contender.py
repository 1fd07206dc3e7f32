"""Time a candidate at every shape only when it could be the new best.

Most candidates of a night are no better than the task's best: the tuner walks a neighbourhood,
an LLM tries ideas. Timing every public and hidden shape of each of them (a few batches, their
verification and the reference's inputs per shape) was most of a warm verdict. So the loop gives
the judge a *bar*: the best kernel's time of record per shape on this GPU. The judge times the
largest shape first (the one a serving stack spends its time on, and the steadiest to time), and
stops after any shape where the candidate is more than ``MARGIN`` slower than the bar: it cannot
lead there, so the rest are not timed. The verdict is still a verdict: accepted (every call was
checked), its shapes that were not timed say so (``timing = NOT_TIMED``), a flag says why, and it
is never scored or ranked (``archive.score.partly_timed``): a geometric mean over some shapes is
not comparable with one over all of them.

What a person should know: a candidate slower than the best at the largest shape by more than the
margin but faster enough at the small ones to win the geometric mean would be missed. The margin
is wide (10%) so that only clear losers stop early; timing noise is well below it on the H200.
The bar only ever saves time: it cannot make a verdict accept, and a candidate that clears it at
every shape is timed exactly as without one.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from kernforge.tasks.spec import Shape

from .verdict import NOT_TIMED, ShapeResult, Verdict

#: stop timing when the candidate is slower than the bar by more than this fraction at a shape
MARGIN = 0.10

#: how the flag of a verdict stopped early begins
NOT_A_CONTENDER = "not a contender"

#: the best's time of record per shape (``key``), in microseconds
Bar = Mapping[str, float]


def key(shape: Mapping[str, int], hidden: bool) -> str:
    """One shape of a task, public or hidden, as the bar names it."""
    return json.dumps([dict(shape), bool(hidden)], sort_keys=True)


def bar_of(verdict: Verdict | None) -> dict[str, float] | None:
    """The bar a verdict sets: its GPU-timed shapes' times; None when it has none to set (rejected,
    judged on the interpreter, or itself timed at only some shapes)."""
    if verdict is None or not verdict.accepted or any(s.timing == NOT_TIMED for s in verdict.shapes):
        return None
    bar = {key(s.shape, s.hidden): float(s.time_us) for s in verdict.shapes
           if s.timing in ("graph", "eager") and s.time_us is not None and s.time_us > 0}
    return bar or None


def order(shapes: Sequence[tuple[Shape, bool]], largest: Shape) -> list[tuple[Shape, bool]]:
    """``(shape, hidden)`` pairs with the largest public shape first, the rest as they were."""
    first = [p for p in shapes if not p[1] and p[0].params == largest.params]
    return first[:1] + [p for p in shapes if p not in first[:1]]


def beaten(result: ShapeResult, bar: Bar | None) -> str | None:
    """Why timing stops after ``result``'s shape (a flag's words), or None to go on."""
    if not bar or result.time_us is None:
        return None
    best = bar.get(key(result.shape, result.hidden))
    if best is None or result.time_us <= best * (1 + MARGIN):
        return None
    label = " ".join(f"{k}={v}" for k, v in result.shape.items())
    return (f"{NOT_A_CONTENDER}: {result.time_us:.2f} us at {label} where the task's best takes {best:.2f} us "
            f"(more than {MARGIN:.0%} slower), so its other shapes were not timed and it is not ranked")


def untimed(shape: Shape, hidden: bool, dtype: str) -> ShapeResult:
    """A shape left untimed because the candidate could not lead."""
    return ShapeResult(shape=shape.as_dict(), hidden=hidden, dtype=dtype, timing=NOT_TIMED)
