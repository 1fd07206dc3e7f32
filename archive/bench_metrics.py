"""KernelBench's metrics over the problems of a benchmark run. Pure: no archive, no I/O.

The definitions are KernelBench's own (ScalingIntelligence/KernelBench, its eval analysis):

* **correctness rate**: problems with a correct kernel / all problems.
* **fast_p**: problems whose kernel is correct *and* faster than the baseline by more than ``p``
  (speedup = baseline time / kernel time > p), divided by *all* problems, not by the correct
  ones: a problem with no correct kernel counts against every fast_p. ``fast_0`` is the share
  correct and timed; ``fast_1`` the share correct and faster. Two baselines, measured beside the
  kernel on the same GPU: PyTorch eager and ``torch.compile`` of the reference.
* **share faster than torch.compile**: fast_1 over ``torch.compile`` (the number papers quote).
* **geometric-mean speedup**: over the correct problems that have a time, per baseline.

Times come only from a GPU. The Triton interpreter (CPU) checks correctness only, so a group whose
problems were judged on the CPU has no fast_p and no speedup at all (``measured`` False, shown as
"not measured"), never numbers computed from the interpreter's wall clock. On a GPU, a correct
problem without a time for a baseline (its best kernel not yet audited, or that baseline not
measurable) counts as not faster, and ``untimed`` says how many: those fast_p are lower bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: KernelBench's thresholds
THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
#: the group of every problem together
OVERALL = "all"


@dataclass(frozen=True)
class ProblemResult:
    """One problem of a benchmark run: whether a correct kernel was found, and the speedups of the
    fastest one over each baseline (None: not timed)."""

    name: str
    level: str
    attempts: int
    correct: bool
    #: "cpu" when judged on the interpreter, a GPU model's name, None when nothing was judged
    gpu: str | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    #: the attempt those speedups are of (or the first correct one on the CPU)
    attempt_id: int | None = None
    #: why the run left the problem out before judging any of it (too large for its devices)
    left_out: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.gpu not in (None, "cpu")

    def speedup(self, baseline: str) -> float | None:
        return self.speedup_eager if baseline == "eager" else self.speedup_compile

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProblemResult":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Metrics:
    """KernelBench's metrics over one group of problems (a level, or all of them)."""

    group: str
    problems: int
    attempted: int
    correct: int
    #: whether any problem was judged on a GPU; False: every time-based figure is None
    measured: bool
    #: baseline -> {p: share of all problems correct with speedup > p}; None when not measured
    fast: Mapping[str, Mapping[float, float]] | None
    #: baseline -> geometric mean over the correct, timed problems (None: none timed, or not measured)
    geomean: Mapping[str, float | None]
    #: baseline -> correct problems without a time for it (counted as not faster)
    untimed: Mapping[str, int]

    @property
    def correctness(self) -> float | None:
        return self.correct / self.problems if self.problems else None

    def fast_p(self, baseline: str, p: float) -> float | None:
        return None if self.fast is None else self.fast[baseline][p]

    @property
    def faster_than_compile(self) -> float | None:
        return self.fast_p("compile", 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "problems": self.problems, "attempted": self.attempted, "correct": self.correct,
            "correctness": self.correctness, "measured": self.measured,
            "fast_p": None if self.fast is None else {b: {f"{p:g}": v for p, v in by_p.items()}
                                                     for b, by_p in self.fast.items()},
            "faster_than_compile": self.faster_than_compile,
            "geomean_speedup": dict(self.geomean), "untimed": dict(self.untimed),
        }


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else None


def metrics(results: Sequence[ProblemResult], group: str = OVERALL, *, measured: bool | None = None) -> Metrics:
    """KernelBench's metrics over ``results`` (see the module docstring). ``measured``: whether the
    run timed on a GPU; by default, whether any of these problems was judged on one."""
    n = len(results)
    correct = [r for r in results if r.correct]
    measured = any(r.on_gpu for r in results) if measured is None else measured
    fast: dict[str, dict[float, float]] | None = None
    geo: dict[str, float | None] = {b: None for b in BASELINES}
    untimed = {b: 0 for b in BASELINES}
    if measured:
        fast = {}
        for b in BASELINES:
            timed = [s for s in (r.speedup(b) for r in correct) if s is not None and s > 0]
            untimed[b] = len(correct) - len(timed)
            fast[b] = {p: sum(s > p for s in timed) / n for p in THRESHOLDS}
            geo[b] = geomean(timed)
    return Metrics(group=group, problems=n, attempted=sum(r.attempts > 0 for r in results), correct=len(correct),
                   measured=measured, fast=fast, geomean=geo, untimed=untimed)


def natural_key(text: str) -> tuple:
    """level2 before level10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def by_level(results: Sequence[ProblemResult]) -> list[Metrics]:
    """The metrics of each level (in natural order), then of every problem together. A level the
    run judged nothing of on its GPU is measured too (its fast_p are 0), not "not measured"."""
    measured = any(r.on_gpu for r in results)
    levels = sorted({r.level for r in results}, key=natural_key)
    groups = [metrics([r for r in results if r.level == level], level, measured=measured) for level in levels]
    return groups + [metrics(results, OVERALL, measured=measured)]
