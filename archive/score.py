"""The score that ranks accepted attempts ("best", parent selection).

**score** = geometric mean, over every public shape of the verdict that has a GPU time, of the
speedup against ``torch.compile`` of the reference measured side by side in the same process
(``compile_us / time_us``). Higher is better; 1.0 ties ``torch.compile``.

* Public shapes only (``ranked``): every verdict checks the hidden shapes, but a routine one times
  only the public ones; an audit times the hidden ones too and says how the speedup carries over
  there (verifier/audit.py). An attempt judged when routine verdicts timed hidden shapes was
  re-scored on its public measurements (schema v6), so every score is over the same shapes.

* Only GPU timings count: ``timing`` is "graph" (CUDA-graph replay, the default) or "eager" (the
  flagged fallback, whose candidate and baselines were both timed eagerly, so the ratio holds).
  "interpreter" timings (the Triton interpreter on a CPU) are never scored, so they can never be
  ranked against GPU numbers; such attempts have score NULL and rank by recency instead.
* Only accepted verdicts have a score. A reuse row (a repeat proposal of archived code) has no
  score of its own: the original attempt carries it, so one piece of code is ranked once.
* Ratios, not times: shapes of very different sizes weigh the same, and a geometric mean cannot
  be carried by one outlier shape the way an arithmetic mean of speedups can.
* Attempts are compared only within one GPU model (``attempts.gpu``); speedups are relative to
  baselines measured on that GPU, but a kernel tuned for one GPU says nothing about another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from kernforge.verifier.verdict import NOT_TIMED, ShapeResult

GPU_TIMINGS = ("graph", "eager")
#: how much fitter than a task's audited best a kernel must be to be audited and lead (the score's
#: ratio, or the GPU time's where there is no score; loop/search.py): the same kernel judged twice
#: on an H100 or H200 (91 audits, sessions 45-49) re-measured more than 2% apart in a third of
#: them, and 23 of those runs' 50 would-be bests had gained less than 2%, each audited for three
#: to five verdicts' time. Closer than that is a near-tie: within the judge's own noise
MIN_GAIN = 0.02


def near_tie_band(best_score: float) -> tuple[float, float]:
    """The scores above the best's by less than ``MIN_GAIN`` (exclusive, inclusive): near-ties,
    neither audited nor a best."""
    return best_score, best_score * (1.0 + MIN_GAIN)


def near_tie(score: float | None, best_score: float | None) -> bool:
    """Whether ``score`` lies in the best's ``near_tie_band``."""
    if score is None or best_score is None:
        return False
    low, high = near_tie_band(best_score)
    return low < score <= high


def is_gpu_timed(shape: ShapeResult) -> bool:
    return shape.timing in GPU_TIMINGS and shape.time_us is not None and shape.time_us > 0


def ranked(shape: ShapeResult) -> bool:
    """A shape the score, the tuner and the ranked times count: a public one with a GPU time."""
    return is_gpu_timed(shape) and not shape.hidden


def speedup_vs_compile(shape: ShapeResult) -> float | None:
    if shape.speedup_compile is not None:
        return shape.speedup_compile if shape.speedup_compile > 0 else None
    if shape.compile_us and shape.time_us:
        return shape.compile_us / shape.time_us
    return None


def speedup_vs_eager(shape: ShapeResult) -> float | None:
    if shape.speedup_eager is not None:
        return shape.speedup_eager if shape.speedup_eager > 0 else None
    if shape.eager_us and shape.time_us:
        return shape.eager_us / shape.time_us
    return None


def speedup_vs_library(shape: ShapeResult) -> float | None:
    """Speedup over the production kernel library, where it was measured (verifier/library.py)."""
    if shape.speedup_library is not None:
        return shape.speedup_library if shape.speedup_library > 0 else None
    if shape.library_us and shape.time_us:
        return shape.library_us / shape.time_us
    return None


def library_summary(shapes: Iterable[ShapeResult]) -> tuple[float | None, str | None]:
    """(geometric-mean speedup over the library, which library) over the ``ranked`` shapes (the
    score's) where it was measured; (None, None) where it never was. Not part of the score: a
    library covers only some ops."""
    timed = [s for s in shapes if ranked(s) and speedup_vs_library(s) is not None]
    if not timed:
        return None, None
    names = sorted({s.library for s in timed if s.library})
    return geomean(speedup_vs_library(s) for s in timed), ", ".join(names) or None


def roofline_pct(shape: ShapeResult) -> float | None:
    """Percent of the hardware floor: floor time / measured time, else the binding ceiling's %."""
    if shape.floor_us and shape.time_us:
        return 100.0 * shape.floor_us / shape.time_us
    parts = [p for p in (shape.pct_bandwidth, shape.pct_flops) if p is not None]
    return max(parts) if parts else None


def geomean(values: Iterable[float | None]) -> float | None:
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def partly_timed(shapes: Iterable[ShapeResult]) -> bool:
    """Some shapes were checked but not timed (verifier/contender.py: the candidate was clearly
    slower than the best at one): such a verdict has no score and no ranked time, since a mean
    over some of the shapes is not comparable with one over all of them."""
    return any(s.timing == NOT_TIMED for s in shapes)


def summarize(shapes: Iterable[ShapeResult]) -> dict[str, float | None]:
    """Score and the aggregates stored beside it on the attempt row (``ranked`` shapes only;
    none for a verdict ``partly_timed``)."""
    shapes = list(shapes)
    timed = [s for s in shapes if ranked(s)]
    pcts = [p for p in (roofline_pct(s) for s in timed) if p is not None]
    whole = not partly_timed(shapes)
    return {
        "score": geomean(speedup_vs_compile(s) for s in timed) if whole else None,
        "speedup_eager": geomean(speedup_vs_eager(s) for s in timed) if whole else None,
        "pct_roofline": sum(pcts) / len(pcts) if pcts else None,
    }


#: A baseline slower than this many times the roofline floor at the task's largest timed shape is
#: flagged: a sync, a Python loop or a needless copy in the reference, not a formulation a serving
#: stack would run, so a speedup over it is not a result (compile and good libraries sit within
#: 1-15x of the floor at large shapes on the H200: shared/BASELINES.md).
SLOW_BASELINE_FACTOR = 20.0
#: the baselines measured beside a candidate: (name shown, ShapeResult field)
BASELINES = (("eager", "eager_us"), ("compile", "compile_us"), ("library", "library_us"))


@dataclass(frozen=True)
class SlowBaseline:
    """A baseline more than ``SLOW_BASELINE_FACTOR`` times slower than the roofline floor."""

    baseline: str
    label: str
    time_us: float
    floor_us: float

    @property
    def factor(self) -> float:
        return self.time_us / self.floor_us

    def line(self) -> str:
        return (f"! {self.baseline} baseline is {self.factor:.0f}x the roofline floor at {self.label} "
                f"({self.time_us:.1f} us vs {self.floor_us:.1f} us; more than {SLOW_BASELINE_FACTOR:.0f}x): "
                f"a speedup over it says little")


def slow_baselines(shapes: Iterable[ShapeResult]) -> list[SlowBaseline]:
    """The baselines far slower than the roofline at the GPU-timed shape with the largest floor
    (small shapes are launch-bound: every baseline is many times their floor, rightly)."""
    timed = [s for s in shapes if is_gpu_timed(s) and s.floor_us]
    if not timed:
        return []
    largest = max(timed, key=lambda s: s.floor_us)
    out = []
    for name, field in BASELINES:
        time_us = getattr(largest, field, None)
        if time_us and time_us > SLOW_BASELINE_FACTOR * largest.floor_us:
            out.append(SlowBaseline(name, largest.label, time_us, largest.floor_us))
    return out
