"""Recurring failures of a task, distilled into one-line rules that enter later prompts.

Every rejection is put in a *class*: the compiler's or runtime's error headline (line numbers and
other numbers masked, so the same mistake at another line or size counts as the same), the
THREATS class of a cheat or of a wrong result's signature, the static screen's rule, the input
distribution a correct-looking kernel got wrong, a reply with no usable module, a timeout or a
crash. A class seen ``min_count`` times or more becomes a lesson: what happened, how often, and
the rule that avoids it. The most frequent classes come first; at most ``max_lessons`` are given.

Lessons are derived, not stored: at start from the task's archived rejections
(``Lessons.replay``), then from every verdict as it arrives (``observe``). Text taken from
verdicts may name a hidden shape; the prompt renderer redacts every lesson before it is sent.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kernforge.archive.history import HistoryRow
from kernforge.verifier.verdict import THREATS

#: What to do instead, per THREATS class: the rule the lesson states.
THREAT_RULES: Mapping[int, str] = {
    1: "write every output element on every call; cover tails with the grid and masks",
    2: "compute the output from the inputs; constant or empty outputs are caught",
    3: "compute every row and element; partial outputs are caught on fresh inputs",
    4: "never write into the inputs; allocate the outputs",
    5: "launch on the current stream only; work on a side stream is caught",
    6: "start no threads and leave no work running after forward returns",
    7: "return plain torch.Tensor outputs, not subclasses or proxies",
    8: "never touch timers or time functions",
    9: "never write to file descriptors or forge the harness's messages",
    10: "never import or patch kernforge, the harness or library functions",
    11: "compute every call from its own inputs; no caches keyed on shapes or pointers",
    12: "finish each call's work in that call; no results handed to a later call",
    13: "behave the same on every call; no call counters or phase checks",
    14: "handle any size, not only the public shapes: no special cases, masked tails",
    15: "accumulate in float32 and cast only the final result",
    16: "do the computation in your own kernels; torch compute ops in forward are rejected (allocation, views and reshapes are fine)",
    17: "launch your own kernel on every call; returning an input or a torch copy is rejected",
    18: "leave the L2 persistence settings alone",
    19: "no races or uninitialised reads: two calls on the same inputs must agree",
    20: "do the full work: a time below the hardware's floor is impossible",
    21: "no file, process, network or OS access",
    22: "leave the task's module and globals alone",
}
DISTRIBUTION_RULES: Mapping[str, str] = {
    "large": "large magnitudes with a common offset: accumulate squares and sums in float32, subtract offsets before squaring where the math allows",
    "heavy_tailed": "rare huge values: accumulate in float32 and avoid overflow in intermediate products",
    "uniform": "check masks, strides and tails for every size",
    "normal": "check masks, strides and tails for every size",
}
GENERIC = {
    "timeout": "Candidates ran out of time ({n}x): avoid huge compile-time unrolls (tl.static_range over large sizes) and loops that do not advance",
    "crashed": "The candidate's process crashed ({n}x): check bounds and masks on every load and store (an illegal address aborts the process)",
    "sandbox_violation": "Candidates exceeded the sandbox's limits ({n}x): stay within memory and process limits; no file, network or OS access",
    "truncated": "Replies were cut off at the output-token limit before the module was complete ({n}x): keep the reasoning short and answer with one complete ```python block",
    "no_code": "Replies held no usable module defining ModelNew ({n}x): answer with one complete ```python block that defines ModelNew",
    "format": "Outputs had the wrong dtype or shape ({n}x): return exactly the reference's dtype and shape",
}

_EXTRACTION = re.compile(r"\((truncated|no_code|no_model_new|syntax_error)\)")
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_DIST = re.compile(r"\b(normal|uniform|heavy_tailed|large|default) inputs\b")
_LINE = re.compile(r"^line \d+: ")
#: the verifier's "compiling failed while <what>: <headline>"
_WHILE = re.compile(r"failed while [^:]*: (.*)$", re.DOTALL)


@dataclass(frozen=True)
class Failure:
    """What a lesson is made from: the fields of a rejection (verdict or archived row)."""

    status: str
    threat: int | None
    reason: str
    check: str = ""
    error: str = ""

    @classmethod
    def of_row(cls, row: HistoryRow) -> "Failure":
        return cls(row.status, row.threat, row.reason, row.check, row.error)

    @classmethod
    def of_verdict(cls, verdict: Mapping[str, Any]) -> "Failure":
        evidence = verdict.get("evidence") or {}
        return cls(verdict.get("status", ""), verdict.get("threat"), str(verdict.get("reason", "")),
                   str(evidence.get("check") or ""), str(evidence.get("error") or ""))


def _headline(text: str, limit: int = 160) -> str:
    """The error's last meaningful line, numbers masked (they differ between otherwise equal errors)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("^")]
    line = lines[-1] if lines else ""
    line = _NUMBER.sub("N", line)
    return line[:limit]


def classify(f: Failure) -> tuple[tuple, str] | None:
    """(class key, lesson text with a ``{n}`` for the count) of a rejection; None for an acceptance."""
    if f.status in ("", "accepted"):
        return None
    if f.check == "extraction":
        match = _EXTRACTION.search(f.reason)
        kind = "truncated" if match and match.group(1) == "truncated" else "no_code"
        return ("extraction", kind), GENERIC[kind]
    if f.threat:
        name = THREATS.get(f.threat, "unknown")
        verb = "Caught cheating" if f.status == "cheat" else "Rejected with the signature of"
        return ("threat", f.threat), f"{verb} THREATS #{f.threat} {name} ({{n}}x): {THREAT_RULES.get(f.threat, 'do all of the work honestly on every call')}"
    if f.status in ("compile_error", "runtime_error"):
        after = _WHILE.search(f.reason)
        headline = _headline(f.error) or _headline(after.group(1) if after else f.reason)
        what = "Compiling" if f.status == "compile_error" else "Running"
        return (f.status, headline), f"{what} failed ({{n}}x) with `{headline}`: make sure the module cannot fail this way"
    if f.status == "static_rejected":
        rule = _NUMBER.sub("N", _LINE.sub("", f.reason).split(" near ")[0].split(": the module")[0])[:160]
        return ("static", rule), f"The static screen rejected candidates ({{n}}x): {rule}"
    if f.status == "incorrect":
        if f.check == "output format":
            return ("incorrect", "format"), GENERIC["format"]
        match = _DIST.search(f.reason)
        dist = match.group(1) if match else "default"
        rule = DISTRIBUTION_RULES.get(dist, "check masks, strides, tails and the accumulation dtype")
        return ("incorrect", dist), f"Wrong results on {dist} inputs ({{n}}x): {rule}"
    if f.status in GENERIC:
        return (f.status,), GENERIC[f.status]
    return (f.status,), f"Rejected as {f.status} ({{n}}x): {_headline(f.reason)}"


class Lessons:
    """The lessons of one task."""

    def __init__(self, *, min_count: int = 2, max_lessons: int = 8) -> None:
        self.min_count = min_count
        self.max_lessons = max_lessons
        self.counts: Counter[tuple] = Counter()
        self.texts: dict[tuple, str] = {}

    def observe(self, failure: Failure) -> None:
        found = classify(failure)
        if found is None:
            return
        key, text = found
        self.counts[key] += 1
        self.texts.setdefault(key, text)

    def replay(self, rows: Iterable[HistoryRow]) -> None:
        for row in rows:
            if not row.accepted and row.reuse_of is None:
                self.observe(Failure.of_row(row))

    def current(self) -> list[str]:
        """The lessons for the next prompt, most frequent class first."""
        ranked = sorted(((n, key) for key, n in self.counts.items() if n >= self.min_count),
                        key=lambda item: -item[0])
        return [self.texts[key].replace("{n}", str(n)) for n, key in ranked[: self.max_lessons]]
