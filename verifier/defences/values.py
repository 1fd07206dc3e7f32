"""Wrong values, and the shape of the wrongness (THREATS #1, #2, #3, #11, #12, #14, #15).

The reference worker (trusted) compares every element of every output with the reference it
computed itself from the same inputs, and looks at how a wrong output is wrong: poison still in
place (never written), zeros where the reference is not, one constant everywhere, the output of
the reference run in a lower precision (not merely errors of that size: precision.py), or exactly
an earlier call's output or answer.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..checks import Check
from ..messages import OutputResult
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.VALUES, (1, 2, 3, 11, 12, 14, 15),
    facts="every element of every output, read from the shared memory and compared with the reference by the trusted "
          "reference worker; checksums of earlier outputs and answers it keeps itself",
    trusted=True,
    rationale="Fresh random inputs on every call, public and hidden shapes, several distributions and a "
              "high-precision reference leave a kernel no way to be right without computing the answer.",
    remedy="Compute every element of every output from this call's inputs, in float32 or better where the "
           "reference does, for any shape (mask partial blocks; never hard-code sizes)."))

_DETAILS = ("bad", "numel", "max_abs_err", "max_rel_err", "worst_index", "worst_value", "worst_expected",
            "nonfinite_mismatch", "never_written", "lowered_precision", "lowered_evidence", "precision_note", "constant",
            "zeros_where_ref_nonzero", "worst_excess")

#: A hidden shape's output is called fitted to the public shapes (#14) only when it is grossly
#: wrong there: this share of its elements out of tolerance, or one of them this many times
#: further off than allowed. A few elements just beyond tolerance at a hidden shape are a
#: numerical difference (an honest float32 GEMM with K = 32768 had 1 of 3.2M elements just out
#: on the H200); wrong sizes hard-coded leave whole rows or blocks wrong.
SHAPE_FIT_SHARE = 1e-3
SHAPE_FIT_EXCESS = 100.0


def wrong(results: Sequence[OutputResult], ctx: str, *, hidden: bool, public_all_passed: bool, earlier: str = "") -> Rejected | None:
    """The first output out of tolerance, with the signature of a cheat if it has one."""
    for r in results:
        if r.ok:
            continue
        d: Mapping[str, Any] = r.details
        if r.problem:
            return DEFENCE.reject(Status.INCORRECT, f"output {r.output} cannot be read ({ctx}): {r.problem}", evidence={"output": r.output})
        detail = describe(d)
        evidence = {"output": r.output, **{k: d.get(k) for k in _DETAILS if k in d}}
        threat = None
        if earlier == "cached":
            threat = 11
            detail += "; the output is exactly an earlier call's output for other inputs: results cached across calls"
        elif earlier == "deferred":
            threat = 12
            detail += "; the output is the answer for an earlier call's inputs: work deferred across calls"
        elif d.get("never_written"):
            threat = 1
            detail += f"; {d['never_written']} elements were never written (they still hold the poison the judge put there)"
        elif d.get("constant"):
            threat = 2
        elif d.get("zeros_where_ref_nonzero", 0) and d["zeros_where_ref_nonzero"] >= d.get("bad", 0) > 0:
            threat = 3
            detail += "; every wrong element is zero: only part of the output was computed"
        elif d.get("lowered_precision"):
            threat = 15
            detail += f"; errors everywhere at about {d['lowered_precision']} rounding{_matched(d.get('lowered_evidence'))}: " \
                      "computed in lower precision"
        elif hidden and public_all_passed and _gross(d):
            threat = 14
            detail += "; correct on every public shape, wrong on a hidden one: fitted to the public shapes"
        elif hidden and public_all_passed:
            detail += ("; correct on every public shape and only just out of tolerance here: a numerical difference "
                       "(accumulation order, precision), not a sign of shape fitting")
        if threat != 15 and d.get("precision_note"):
            detail += f"; {d['precision_note']}"
        return DEFENCE.reject(Status.INCORRECT, f"output {r.output} is wrong ({ctx}): {detail}", threat=threat, evidence=evidence)
    return None


def _gross(d: Mapping[str, Any]) -> bool:
    """The output is far from the reference, not just beyond its tolerance (see SHAPE_FIT_SHARE);
    without the figures to tell (an older worker's details), gross."""
    bad, numel, excess = d.get("bad"), d.get("numel"), d.get("worst_excess")
    if not isinstance(bad, int) or not isinstance(numel, int) or numel <= 0 or not isinstance(excess, (int, float)):
        return True
    return bad >= SHAPE_FIT_SHARE * numel or excess >= SHAPE_FIT_EXCESS or bool(d.get("nonfinite_mismatch"))


def _matched(evidence: Any) -> str:
    """How the output matched the reference run in lower precision, where the evidence says."""
    if not isinstance(evidence, Mapping) or not evidence.get("lowering"):
        return ""
    ratio = evidence.get("ratio")
    if isinstance(ratio, (int, float)) and ratio == 0:
        return f", and the output matches the reference run with {evidence['lowering']} exactly in most elements"
    closer = f" (at least {1 / ratio:,.0f}x closer than the exact reference)" if isinstance(ratio, (int, float)) else ""
    return f", and the output matches the reference run with {evidence['lowering']}{closer}"


def describe(d: Mapping[str, Any]) -> str:
    parts = [f"{d.get('bad', '?')} of {d.get('numel', '?')} elements out of tolerance"]
    if d.get("worst_index") is not None and d.get("worst_value") is not None:
        parts.append(f"worst at index {d['worst_index']}: got {d['worst_value']:.6g}, expected {d['worst_expected']:.6g}")
    if d.get("max_abs_err") is not None:
        parts.append(f"max abs err {d['max_abs_err']:.3g}")
    if d.get("nonfinite_mismatch"):
        parts.append(f"{d['nonfinite_mismatch']} NaN/Inf where the reference has none")
    if d.get("constant"):
        parts.append("the output is one constant value while the reference varies")
    return ", ".join(parts)
