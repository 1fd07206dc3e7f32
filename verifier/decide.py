"""Turning what the candidate's harness and the reference worker report into verdicts.

Pure functions over plain data (the replies), so every rule is testable without a worker.
The candidate's replies are untrusted: a malformed one is itself a verdict (THREATS #9), and
the facts that decide correctness (output values, input fingerprints) come from the reference
worker's side. Status policy: ``cheat`` when the candidate did something forbidden (patched
a timer, left work running, wrote an input, skipped its kernels, called torch to do the work);
``incorrect`` when its numbers are wrong, with a THREATS class when the way they are wrong is
the signature of one (constant output #2, never-written elements #1, precision #15, right only
on public shapes #14).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .torch_ops import is_allowed_aten
from .verdict import Rejected, Status

TIMER_NAMES = ("time.", "Event", "synchronize", "elapsed", "CUDAGraph", "perf_counter", "monotonic")


def where(shape: Mapping[str, int], hidden: bool, dist: str) -> str:
    label = " ".join(f"{k}={v}" for k, v in shape.items())
    return f"{'hidden' if hidden else 'public'} shape {label}, {dist} inputs"


def malformed(reply: Any, fields: Sequence[str]) -> Rejected | None:
    if not isinstance(reply, dict) or any(f not in reply for f in fields):
        missing = [f for f in fields if not isinstance(reply, dict) or f not in reply]
        return Rejected(Status.CHEAT, f"the worker's reply is malformed (missing {missing}): results were forged or the harness was tampered with", threat=9,
                        evidence={"check": "protocol", "reply": str(reply)[:500]})
    return None


def tampering(names: Sequence[str], context: str) -> Rejected | None:
    if not names:
        return None
    timer = [n for n in names if any(t in n for t in TIMER_NAMES)]
    threat = 8 if timer else 10
    shown = ", ".join((timer or list(names))[:6])
    what = "timer functions were replaced" if timer else "harness or library functions were replaced"
    return Rejected(Status.CHEAT, f"{what} {context}: {shown}", threat=threat,
                    evidence={"check": "integrity", "replaced": list(names)[:50]})


def call_facts(reply: Mapping[str, Any], ref: Mapping[str, Any], *, ctx: str, mutated: Sequence[int],
               allow_torch_ops: bool, own_kernels: Sequence[str], on_gpu: bool) -> Rejected | None:
    """Everything about one checked call except the values of its outputs."""
    exact = "torch.Tensor"
    bad_types = [t for t in reply["types"] if t != exact]
    if bad_types:
        return Rejected(Status.CHEAT, f"forward returned {bad_types[0]} instead of a plain torch.Tensor ({ctx}): a lazy or proxy output", threat=7,
                        evidence={"check": "output type", "types": reply["types"]})
    for rule in (
        lambda: tampering(reply.get("tampered", []), f"during the call ({ctx})"),
        lambda: _threads(reply, ctx, on_gpu),
        lambda: l2_pinning(reply, ctx),
        lambda: _aliasing(reply, ctx),
        lambda: _inputs(reply, ref, ctx, mutated),
        lambda: _torch_ops(reply, ctx, allow_torch_ops),
        lambda: _own_kernels(reply, ctx, own_kernels, on_gpu),
    ):
        rejection = rule()
        if rejection is not None:
            return rejection
    return None


def l2_pinning(reply: Mapping[str, Any], ctx: str) -> Rejected | None:
    limit = reply.get("l2_persisting_limit")
    if limit:
        return Rejected(Status.CHEAT, f"the call reserved {limit} bytes of persisting L2 ({ctx}): pinned data would survive the cache flush between timed calls", threat=18,
                        evidence={"check": "persisting L2", "limit": limit})
    return None


def _threads(reply: Mapping[str, Any], ctx: str, on_gpu: bool) -> Rejected | None:
    if reply.get("new_threads"):
        return Rejected(Status.CHEAT, f"the candidate started threads {reply['new_threads'][:3]} ({ctx}): work done behind the call's back", threat=6,
                        evidence={"check": "threads", "threads": reply["new_threads"]})
    late = [i for i, changed in enumerate(reply.get("late_writes", [])) if changed]
    if late:
        threat = 5 if on_gpu else 6
        return Rejected(Status.CHEAT, f"output {late[0]} changed after forward returned ({ctx}): work was still running on another stream or thread", threat=threat,
                        evidence={"check": "late writes", "outputs": late})
    return None


def _aliasing(reply: Mapping[str, Any], ctx: str) -> Rejected | None:
    for j, hits in enumerate(reply.get("aliases", [])):
        if hits:
            return Rejected(Status.CHEAT, f"returned output {j} shares memory with input {hits[0]} ({ctx}): a passthrough, not a computed result", threat=17,
                            evidence={"check": "aliasing", "output": j, "inputs": hits})
    return None


def _inputs(reply: Mapping[str, Any], ref: Mapping[str, Any], ctx: str, mutated: Sequence[int]) -> Rejected | None:
    if reply.get("input_shapes") != ref.get("input_shapes"):
        return Rejected(Status.CHEAT, f"the candidate's process drew inputs of shapes {reply.get('input_shapes')} where the task gives {ref.get('input_shapes')} ({ctx}): the task's globals were changed", threat=22,
                        evidence={"check": "input shapes", "got": reply.get("input_shapes"), "expected": ref.get("input_shapes")})
    got, want = reply.get("input_digests", []), ref.get("input_digests", [])
    for i, (g, w) in enumerate(zip(got, want)):
        if i not in mutated and g != w:
            return Rejected(Status.CHEAT, f"input {i} was modified by the call ({ctx}); inputs are read-only for this task", threat=4,
                            evidence={"check": "input mutation", "input": i})
    if len(got) != len(want):
        return Rejected(Status.CHEAT, f"the harness reported {len(got)} input fingerprints, expected {len(want)} ({ctx})", threat=9,
                        evidence={"check": "protocol"})
    return None


def _torch_ops(reply: Mapping[str, Any], ctx: str, allow: bool) -> Rejected | None:
    if allow:
        return None
    used = sorted(op for op in reply.get("torch_ops", {}) if not is_allowed_aten(op))
    if used:
        return Rejected(Status.CHEAT, f"forward ran torch compute ops {used[:5]} ({ctx}); this task requires the work to be done by the candidate's own kernels", threat=16,
                        evidence={"check": "runtime trace", "torch_ops": used})
    return None


def _own_kernels(reply: Mapping[str, Any], ctx: str, own: Sequence[str], on_gpu: bool) -> Rejected | None:
    launched = set(reply.get("launches", {}))
    if on_gpu:
        ran = reply.get("gpu_kernels", [])
        if any(name and name in kernel for kernel in ran for name in own):
            return None
        return Rejected(Status.CHEAT, f"none of the candidate's kernels ({', '.join(own) or 'none defined'}) ran on the GPU during the call ({ctx})", threat=17,
                        evidence={"check": "runtime trace", "gpu_kernels": ran[:20], "own_kernels": list(own)})
    if launched & set(own) or (launched and not own):
        return None
    return Rejected(Status.CHEAT, f"no kernel of the candidate's was launched during the call ({ctx}); a result without a kernel is a passthrough or a torch computation", threat=17,
                    evidence={"check": "runtime trace", "launches": sorted(launched), "own_kernels": list(own)})


def repeat_consistency(reply: Mapping[str, Any], ctx: str, tolerance_abs: Sequence[float]) -> Rejected | None:
    for j, rep in enumerate(reply.get("repeat", [])):
        if not rep.get("comparable", False):
            return Rejected(Status.INCORRECT, f"a second call on the same inputs returned a different kind of output {j} ({ctx})", threat=19,
                            evidence={"check": "repeat"})
        limit = tolerance_abs[j] if j < len(tolerance_abs) else 0.0
        if not rep.get("equal") and rep.get("max_diff", 0.0) > limit:
            return Rejected(Status.INCORRECT, f"two calls on the same inputs disagree by {rep['max_diff']:.3g} in output {j} ({ctx}): uninitialised or racy memory", threat=19,
                            evidence={"check": "repeat", "output": j, "max_diff": rep["max_diff"]})
    return None


def mismatch(results: Sequence[Mapping[str, Any]], ctx: str, *, hidden: bool, public_all_passed: bool,
             cached: bool = False, deferred: bool = False) -> Rejected | None:
    """The first output that is out of tolerance, with the signature of a cheat if it has one."""
    for r in results:
        if r.get("unreadable"):
            return Rejected(Status.INCORRECT, f"output {r['output']} has the wrong dtype or shape ({ctx}): {r['unreadable']}",
                            evidence={"check": "output format", "output": r["output"], "detail": r["unreadable"]})
        if r.get("ok"):
            continue
        detail = _describe(r)
        evidence = {"check": "values", "output": r["output"], **{k: r.get(k) for k in (
            "bad", "numel", "max_abs_err", "max_rel_err", "worst_index", "worst_value", "worst_expected",
            "nonfinite_mismatch", "never_written", "lowered_precision")}}
        threat = None
        if cached:
            threat = 11
            detail += "; the output is exactly an earlier call's output for other inputs: results cached across calls"
        elif deferred:
            threat = 12
            detail += "; the output is the answer for an earlier call's inputs: work deferred across calls"
        elif r.get("never_written"):
            threat = 1
            detail += f"; {r['never_written']} elements were never written (they still hold poisoned freed memory)"
        elif r.get("constant"):
            threat = 2
        elif r.get("zeros_where_ref_nonzero", 0) and r["zeros_where_ref_nonzero"] >= r.get("bad", 0) > 0:
            threat = 3
            detail += "; every wrong element is zero: only part of the output was computed"
        elif r.get("lowered_precision"):
            threat = 15
            detail += f"; errors everywhere at about {r['lowered_precision']} rounding: computed in lower precision"
        elif hidden and public_all_passed:
            threat = 14
            detail += "; correct on every public shape, wrong on a hidden one: fitted to the public shapes"
        return Rejected(Status.INCORRECT, f"output {r['output']} is wrong ({ctx}): {detail}", threat=threat, evidence=evidence)
    return None


def same_checksum(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], rel: float = 1e-3) -> bool:
    """Whether two lists of per-output (sum, sum of |x|) checksums agree to ``rel``."""
    if len(a) != len(b):
        return False
    for (s1, a1), (s2, a2) in zip(a, b):
        scale = rel * max(abs(a1), abs(a2)) + 1e-12
        if abs(s1 - s2) > scale or abs(a1 - a2) > scale:
            return False
    return True


def _describe(r: Mapping[str, Any]) -> str:
    parts = [f"{r['bad']} of {r['numel']} elements out of tolerance"]
    if r.get("worst_index"):
        parts.append(f"worst at index {r['worst_index']}: got {r['worst_value']:.6g}, expected {r['worst_expected']:.6g}")
    parts.append(f"max abs err {r['max_abs_err']:.3g}")
    if r.get("nonfinite_mismatch"):
        parts.append(f"{r['nonfinite_mismatch']} NaN/Inf where the reference has none")
    if r.get("constant"):
        parts.append("the output is one constant value while the reference varies")
    return ", ".join(parts)
