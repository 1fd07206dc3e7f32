"""A verdict as the model reads it: measured feedback, or why it was rejected. Never hidden sizes.

The verdict is a ``verifier.verdict`` ``Verdict`` (never its dict form). Its public-shape results
are shown in full; its hidden-shape results only as counts. The verifier's reasons and evidence name the
shape where a check failed (``hidden shape T=77 H=5120``, input shapes ``[[77, 5120]]``, the
worst index ``[76, 5119]``), so every piece of verifier text passes through ``Redactor.scrub``
before it reaches a prompt (THREATS #14: hidden shapes are never shown to the model).
"""

from __future__ import annotations

import json
import re
from itertools import combinations
from typing import Any, Iterable, Mapping

from kernforge.tasks.spec import Task
from kernforge.verifier.verdict import SAW_HIDDEN, ShapeResult, Verdict, saw_hidden

HIDDEN = "<hidden>"
# Line numbers ("line 33", "kernel.py:33", "kernel.cu(33)") are about the candidate's code, not a
# shape, and are what a repair turn needs most: never masked.
_LINE_REF = r"(?<!line )(?<!\.py:)(?<!\.cu:)(?<!\.cpp:)(?<!\.cu)(?<!\.cpp)"
_INT = re.compile(_LINE_REF + r"(?<![\w.])-?\d+(?![\w.])")
_BRACKETED = re.compile(_LINE_REF + r"[\[(]\s*-?\d+(?:\s*,\s*-?\d+)*\s*,?\s*[\])]")

#: Evidence keys never quoted: seeds and the environment say nothing useful and could say too much.
_SKIP_KEYS = {"seed", "seeds", "environment", "hidden_shapes", SAW_HIDDEN}


def clip(text: str, limit: int, *, keep: str = "both") -> str:
    """``text`` cut to about ``limit`` characters with a marker saying how much was cut.

    ``keep``: "head" (source code: the top holds the kernel), "tail" (Python tracebacks end with
    the error) or "both" (compiler logs: the first error and the final summary).
    """
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    marker = f"\n[... {cut} characters cut ...]\n"
    if keep == "head":
        return text[:limit] + marker
    if keep == "tail":
        return marker + text[-limit:]
    head = int(limit * 0.4)
    return text[:head] + marker + text[len(text) - (limit - head):]


def excerpt(text: str, redactor: "Redactor", limit: int, *, keep: str = "both") -> str:
    """``clip(redactor.scrub(text))`` without scrubbing megabytes that are cut anyway.

    Each kept end is scrubbed with a margin as wide again, so a label cannot be split by the cut.
    """
    if len(text) <= 2 * limit:
        return clip(redactor.scrub(text), limit, keep=keep)
    head_n = {"head": limit, "tail": 0}.get(keep, int(limit * 0.4))
    tail_n = limit - head_n if keep != "head" else 0
    head = redactor.scrub(text[: 2 * limit])[:head_n] if head_n else ""
    tail = redactor.scrub(text[-2 * limit:])[-tail_n:] if tail_n else ""
    return f"{head}\n[... about {len(text) - limit} characters cut ...]\n{tail}"


class Redactor:
    """Masks the sizes of a task's hidden shapes in free text (verifier reasons, error logs).

    Masked: the full label of a hidden shape; ``NAME=value`` and ``'NAME': value`` pairs of hidden
    shapes; bracketed integer lists holding a hidden-only size or one off it (tensor shapes and
    indices, ``[77, 5120]``, ``[76, 5119]``); standalone numbers of two or more digits that are
    hidden-only sizes, one off them, or their products (element counts). A value that is also a
    public size is not secret and is left alone. Single-digit sizes are masked only in the
    structured forms: masking every "3" would destroy line numbers for little gain.
    """

    def __init__(self, task: Task) -> None:
        hidden = [s.as_dict() for s in (*task.hidden_shapes, *task.cpu_hidden_shapes)]
        public = [s.as_dict() for s in (*task.public_shapes, *task.cpu_public_shapes)]
        public_values = {v for s in public for v in s.values()}
        public_products = {_product(s.values()) for s in public}
        self.hidden_values = {v for s in hidden for v in s.values()} - public_values
        near = {v + d for v in self.hidden_values for d in (-1, 0, 1)} - public_values - public_products
        products = set()
        for s in hidden:
            values = list(s.values())
            products.add(_product(values))
            products.update(a * b for a, b in combinations(values, 2))
        self.masked_numbers = {n for n in near | (products - public_values - public_products) if abs(n) >= 10}
        self.bracket_numbers = near | self.masked_numbers
        self._labels = [_label_regex(s) for s in hidden if s]
        pairs = {(k, v) for s in hidden for k, v in s.items()} - {(k, v) for s in public for k, v in s.items()}
        self._pairs = [
            re.compile(rf"(?<![\w])(['\"]?{re.escape(k)}['\"]?\s*[=:]\s*){v}(?![\w.])") for k, v in sorted(pairs)
        ]
        self.hidden_shapes = hidden

    def scrub(self, text: str) -> str:
        for label in self._labels:
            text = label.sub(HIDDEN, text)
        for pair in self._pairs:
            text = pair.sub(lambda m: m.group(1) + HIDDEN, text)
        text = _BRACKETED.sub(self._bracket, text)
        return _INT.sub(lambda m: HIDDEN if int(m.group()) in self.masked_numbers else m.group(), text)

    def _bracket(self, match: re.Match) -> str:
        numbers = {int(n) for n in re.findall(r"-?\d+", match.group())}
        return f"[{HIDDEN}]" if numbers & self.bracket_numbers else match.group()

    def is_hidden(self, shape: Mapping[str, Any]) -> bool:
        return dict(shape) in self.hidden_shapes


def _product(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _label_regex(shape: Mapping[str, int]) -> re.Pattern:
    # "T=77 H=5120", "T=77, H=5120", "{'T': 77, 'H': 5120}": the pairs in order, any separators.
    pairs = [rf"['\"]?{re.escape(k)}['\"]?\s*[=:]\s*{v}(?![\w.])" for k, v in shape.items()]
    return re.compile(r"\{?" + r"[\s,;]*".join(pairs) + r"\}?")


# ---- verdict → text -------------------------------------------------------------------------------


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return f"{value}{unit}"


def public_table(shapes: Iterable[ShapeResult], floor_us: Mapping[str, float] | None = None) -> str:
    """Markdown table of the public shapes' measurements; the timing column says whose clock
    (``graph``, ``eager``, or ``interpreter``: a correctness run's wall clock, never ranked)."""
    rows = [r for r in shapes if not r.hidden]
    if not rows:
        return ""
    lines = [
        "| shape | time us | spread | roofline floor us | % of roofline | % of copy BW | vs eager | vs torch.compile | timing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        floor = r.floor_us or (floor_us or {}).get(r.label)
        pct_roof = 100.0 * floor / r.time_us if floor and r.time_us else None
        bound = "<= " if r.bounded else ""
        lines.append(
            f"| {r.label} | {bound}{_fmt(r.time_us)} | {_fmt(r.spread_pct, '%', 2)} | {_fmt(floor)} | "
            f"{_fmt(pct_roof, '%')} | {_fmt(r.pct_bandwidth, '%')} | {_fmt(r.speedup_eager, 'x')} | "
            f"{_fmt(r.speedup_compile, 'x')} | {r.timing or '-'} |"
        )
    if any(r.bounded for r in rows):
        lines.append("\n<= : a bound, not a measurement: at that shape the timed batch's fixed cost outgrew a tenth of "
                     "its window, so the kernel's own time is likely lower (launch-bound sizes)")
    return "\n".join(lines)


#: all a prompt says of a rejection made once the candidate had seen a hidden shape
WITHHELD = ("it passed every public shape, then failed once it had been called at a hidden shape; how it failed "
            "(wrong values, an error, a time-out, a check) and what it raised, printed or named from then on are not "
            "shown: a candidate chooses how it fails, and could spell a hidden size that way")
#: the parent's status line in that case, in place of the verdict's own status
FAILED_HIDDEN = "failed at a hidden shape"


def candidate_text_withheld(verdict: Verdict) -> bool:
    """Whether ``verdict`` is one outcome to a prompt, "failed at a hidden shape", and no more:
    rejected at, or after, a call at a hidden shape (THREATS #14). The candidate chooses what it
    raises (a redaction of the sizes masks decimals; it can spell hex, words, a tally) and how it
    fails (a crash, wrong values, a time-out, a defence's check, which of the hidden shapes): each
    choice a prompt told apart would carry bits of a hidden size to the next candidate."""
    return not verdict.accepted and saw_hidden(verdict.evidence)


def hidden_line(verdict: Verdict) -> str:
    """Counts only: how many hidden shapes passed and failed. Never their sizes, and no count
    where the candidate failed at one (which of them failed is its choice too)."""
    checked = sum(1 for r in verdict.shapes if r.hidden)
    evidence = verdict.evidence
    if verdict.accepted:
        count = f"all {checked}" if checked else "all"
        return f"Hidden shapes (sizes not shown): {count} passed."
    if candidate_text_withheld(verdict):
        return "Hidden shapes (sizes not shown): at least one failed."
    # the judge records where a check failed (``evidence["hidden"]``, beside ``shape``)
    failed_hidden = bool(evidence.get("hidden"))
    passed = evidence.get("hidden_passed", checked)
    failed = evidence.get("hidden_failed", 1 if failed_hidden else 0)
    if not passed and not failed:
        return "Hidden shapes (sizes not shown): not reached."
    return f"Hidden shapes (sizes not shown): {passed} passed, {failed} failed."


def evidence_text(evidence: Mapping[str, Any], redactor: Redactor, *, value_chars: int, log_chars: int) -> str:
    """Evidence as short lines; long or multi-line strings (logs, tracebacks) as clipped blocks."""
    lines: list[str] = []
    blocks: list[str] = []
    for key, value in evidence.items():
        if key in _SKIP_KEYS or value is None or value == [] or value == {}:
            continue
        if key in ("shape", "shapes") and isinstance(value, Mapping) and redactor.is_hidden(value):
            lines.append(f"- {key}: (a hidden shape)")
            continue
        if isinstance(value, str) and ("\n" in value or len(value) > value_chars):
            keep = "tail" if "Traceback" in value else "both"
            blocks.append(f"{key}:\n```text\n{excerpt(value.rstrip(), redactor, log_chars, keep=keep)}\n```")
            continue
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        lines.append(f"- {key}: {excerpt(shown, redactor, value_chars, keep='head')}")
    return "\n".join(lines + blocks)
