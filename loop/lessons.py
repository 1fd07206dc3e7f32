"""Recurring failures of a task, distilled into one-line rules that enter later prompts.

Every rejection is put in a *class* by what the judge says about it in typed fields, never by
its reason text: ``(status, threat, check)`` (``Rejected.key``), plus a sub-key only where one
check covers mistakes that need different advice:

* a compile or runtime error: the error's headline (its last line, numbers masked, so the same
  mistake at another line or size counts as the same), from the evidence's ``error``;
* the static screen: the rule of its first finding (``syntax``, ``torch-compute``, ...);
* a wrong value: the input distribution it was found on, from the evidence's ``dist`` (the judge
  names it only in the reason today, so until it records it these group by check alone);
* a reply with no usable module (the loop's own check): cut off at the token limit, or no code.

A rejection made once the candidate had been called at a hidden shape is one class whatever its
fields say (``AFTER_HIDDEN``): which way it failed is the candidate's choice, and could spell a
hidden size one lesson at a time.

A class seen ``min_count`` times or more becomes a lesson: what happened, how often, and the rule
that avoids it. The rule is the remedy of the defence that made the check
(``verifier.defences.remedy``); the loop states its own rules only for what it decides itself
(extraction) and for what no defence can advise on (timeouts, crashes). The most frequent
classes come first; at most ``max_lessons`` are given.

Lessons are derived, not stored: at start from the task's archived rejections
(``Lessons.replay``, through ``Failure.of_row``), then from every verdict as it arrives
(``observe``, through ``Failure.of_verdict``); both read the same fields, so a replayed row and a
live verdict land in the same class. Text taken from verdicts (an error headline) may name a
hidden shape; the prompt renderer redacts every lesson before it is sent.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kernforge.archive.history import HistoryRow
from kernforge.verifier import defences
from kernforge.verifier.checks import Check
from kernforge.verifier.screen_rules import RULES
from kernforge.verifier.verdict import THREATS, Rejected, Status, saw_hidden

#: (status, threat, check, sub-key): ``Rejected.key`` and the sub-key ("" where none applies)
Key = tuple[str, int | None, str, str]

#: The loop's own rules: for its own check (extraction) and for failures no defence advises on.
#: the class of every rejection made once the candidate had seen a hidden shape
AFTER_HIDDEN = "failed_at_hidden_shape"
LOOP_RULES: Mapping[str, str] = {
    AFTER_HIDDEN: "Candidates passed every public shape and then failed at a hidden one ({n}x; how is not said): "
                  "hidden shapes include tiny, odd and non-power-of-two sizes, so mask every tail and derive "
                  "grids, strides and block counts from the inputs' own sizes",
    "truncated": "Replies were cut off at the output-token limit before the module was complete ({n}x): keep the reasoning short and answer with one complete ```python block",
    "no_code": "Replies held no usable module defining ModelNew ({n}x): answer with one complete ```python block that defines ModelNew",
    Status.TIMEOUT.value: "Candidates ran out of time ({n}x): avoid huge compile-time unrolls (tl.static_range over large sizes) and loops that do not advance",
    Status.CRASHED.value: "The candidate's process crashed ({n}x): check bounds and masks on every load and store (an illegal address aborts the process)",
}
_ERRORS = (Status.COMPILE_ERROR, Status.RUNTIME_ERROR)
_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class Failure:
    """What a lesson is made from: the typed fields of a rejection (a verdict or an archived row)."""

    status: Status
    threat: int | None
    check: Check
    #: the error text of a compile or runtime failure (evidence ``error``)
    error: str = ""
    #: how a reply held no module (evidence ``kind``: truncated, no_code, no_model_new, syntax_error)
    kind: str = ""
    #: the static screen's rule id of the first finding (evidence ``findings[0].rule``)
    rule: str = ""
    #: the input distribution a wrong value was found on (evidence ``dist``, where recorded)
    dist: str = ""
    #: rejected once it had been called at a hidden shape: one class whatever the rest says, as in
    #: a prompt (prompts/feedback.candidate_text_withheld: how it failed is the candidate's choice)
    after_hidden: bool = False

    @classmethod
    def of(cls, status: Status, threat: int | None, check: Check, evidence: Mapping[str, Any]) -> "Failure":
        findings = evidence.get("findings")
        first = findings[0] if isinstance(findings, list) and findings and isinstance(findings[0], Mapping) else {}
        if saw_hidden(evidence):
            # nothing the candidate chose once it had seen a hidden shape: its text could carry
            # the shape into every later prompt of the task, and so could which way it failed
            return cls(status, threat, check, after_hidden=True)
        return cls(status, threat, check, error=str(evidence.get("error") or ""), kind=str(evidence.get("kind") or ""),
                   rule=str(first.get("rule") or ""), dist=str(evidence.get("dist") or ""))

    @classmethod
    def of_verdict(cls, verdict: Rejected) -> "Failure":
        return cls.of(verdict.status, verdict.threat, verdict.check, verdict.evidence)

    @classmethod
    def of_row(cls, row: HistoryRow) -> "Failure":
        """An archived rejection; older check strings are read by ``Check.parse``."""
        return cls.of(Status(row.status), row.threat, Check.parse(row.check), row.evidence)

    @property
    def detail(self) -> str:
        """The sub-key (see the module docstring), "" where the check alone is the class."""
        if self.check is Check.EXTRACTION:
            return "truncated" if self.kind == "truncated" else "no_code"
        if self.status in _ERRORS:
            return headline(self.error)
        if self.check is Check.STATIC_SCREEN:
            return self.rule
        if self.check is Check.VALUES:
            return self.dist
        return ""

    @property
    def key(self) -> Key:
        if self.after_hidden:
            return (AFTER_HIDDEN, None, "", "")
        return (self.status.value, self.threat, self.check.value, self.detail)


def headline(text: str, limit: int = 160) -> str:
    """An error's last meaningful line, numbers masked (they differ between otherwise equal errors)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("^")]
    line = lines[-1] if lines else ""
    return _NUMBER.sub("N", line)[:limit]


def lesson_text(f: Failure) -> str:
    """The lesson of a class, with ``{n}`` where the count goes: what happened, and the rule."""
    detail = f.detail
    if f.after_hidden:
        return LOOP_RULES[AFTER_HIDDEN]
    if f.check is Check.EXTRACTION:
        return LOOP_RULES[detail]
    if f.status.value in LOOP_RULES:
        return LOOP_RULES[f.status.value]
    remedy = defences.remedy(f.check)
    if f.status is Status.STATIC_REJECTED:
        spec = RULES.get(detail)
        why = f" for `{detail}` ({spec.why})" if spec else ""
        return f"The static screen rejected candidates{why} ({{n}}x)" + (f": {remedy}" if remedy else "")
    if f.threat:
        verb = {Status.CHEAT: "Caught cheating", Status.SANDBOX_VIOLATION: "Broke the sandbox's limits as"}.get(
            f.status, "Rejected with the signature of")
        what = f"{verb} THREATS #{f.threat} {THREATS.get(f.threat, 'unknown')}"
    elif f.status is Status.COMPILE_ERROR:
        what = "Compiling failed" + (f" with `{detail}`" if detail else "")
    elif f.status is Status.RUNTIME_ERROR:
        what = ("Ran out of memory" if f.check is Check.OUT_OF_MEMORY else "Running failed") + (
            f" with `{detail}`" if detail else "")
    elif f.status is Status.INCORRECT:
        what = "Outputs had the wrong dtype or shape" if f.check is Check.OUTPUT_FORMAT else (
            "Wrong results" + (f" on {detail} inputs" if detail else ""))
    else:
        what = f"Rejected as {f.status.value}"
    # "{" and "}" in an error headline must survive the count's substitution (str.replace, not format)
    return f"{what} ({{n}}x, {f.check.value} check)" + (f": {remedy}" if remedy else "")


class Lessons:
    """The lessons of one task."""

    def __init__(self, *, min_count: int = 2, max_lessons: int = 8) -> None:
        self.min_count = min_count
        self.max_lessons = max_lessons
        self.counts: Counter[Key] = Counter()
        self.texts: dict[Key, str] = {}

    def observe(self, failure: Failure) -> None:
        key = failure.key
        self.counts[key] += 1
        self.texts.setdefault(key, lesson_text(failure))

    def replay(self, rows: Iterable[HistoryRow]) -> None:
        for row in rows:
            if not row.accepted and row.reuse_of is None:
                self.observe(Failure.of_row(row))

    def current(self) -> list[str]:
        """The lessons for the next prompt, most frequent class first."""
        ranked = sorted(((n, key) for key, n in self.counts.items() if n >= self.min_count),
                        key=lambda item: -item[0])
        return [self.texts[key].replace("{n}", str(n)) for n, key in ranked[: self.max_lessons]]
