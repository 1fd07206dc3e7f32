"""The audit of a would-be winner: before an attempt becomes a task's best or is exported, it is
judged again from scratch and its time must hold.

The second verdict runs in a fresh worker from the pool, on inputs drawn from new seeds (every
public and hidden shape, every distribution, new timed batches), with the same trusted clock.
The audit fails when that verdict is a rejection, or when the candidate's time does not hold:
the geometric mean, over the shapes both verdicts timed on the GPU, of the new time over the
recorded one is above ``1 + tolerance``. A candidate that behaves well once and cheats later, or
whose recorded time was luck, is demoted with the reason.

A time that did not hold is judged once more, in another fresh worker, before it demotes: that
third verdict decides, and the audit says both. A demoted best is the night's result lost, and
one disturbed measurement was enough for it: an honest fused_add_rms_norm best read 3-4 times its
recorded time at its small shapes in an audit on an H100, its windows spread 35-175%, in a run's
busy first minute (session 61). A candidate gains nothing by it: the third verdict is as fresh
as the second, and its time must hold there. (It does not mend a recorded time that was itself
the outlier: on an H100 in session 62 a fp8_quant_per_group seed recorded 4.5 us at T=64 in a
run's first minutes read 38% and 46% slower over its public shapes in the two verdicts of its
audit, 9.2 us at T=64 in the second, and was demoted.)

A routine verdict is timed at the public shapes only; the audit's verdict times the hidden ones
too (``JudgeOptions.time_hidden``), so a best's speed at shapes it never saw is on record: the
audit says its speedup over torch.compile there beside the public one. It is said, not judged:
tiny hidden shapes are launch-bound, where an honest two-kernel design trails a one-kernel
compile by design, so a gap alone is no evidence of anything.

Then, where Nsight Compute is installed and the sandbox can run it, a third run in a worker
whose parent is ncu lists the kernels the GPU really ran in a few calls (verifier/ncu.py): torch
compute where the task forbids it, none of the candidate's own kernels, or more device time per
call than the trusted clock measured fails the audit. Where ncu cannot run, the audit says so
in its details and rests on the second verdict.

Interpreter (CPU) verdicts are never audited: they are correctness only and never become a best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from kernforge.tasks.spec import Task

from . import ncu
from .checks import Check
from .kernels import own_kernel_names
from .defences import Defence, register
from .verdict import Accepted, Verdict, describe, verdict_from_dict

#: a re-measured time may be this much slower than the recorded one before the audit fails
TOLERANCE = 0.15

DEFENCE = register(Defence(
    Check.AUDIT, (8, 13), facts="a second verdict of the same code in a fresh worker, on fresh inputs, with the trusted clock",
    trusted=True,
    rationale="A best is what the export ships and what later searches build on; one verdict can be luck, or a "
              "candidate that behaves on its first judging and not later. Judged again from scratch, it must be "
              "accepted again, and about as fast.",
    remedy="Make the kernel's speed and correctness independent of which call, process or inputs it sees."))


@dataclass(frozen=True)
class Audit:
    passed: bool
    reason: str
    #: geometric mean of the GPU times, as recorded and as re-measured (microseconds)
    recorded_us: float | None = None
    measured_us: float | None = None
    verdict: Verdict | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def only_slower(self) -> bool:
        """Failed only because the time did not hold: accepted again, its outputs correct again, and
        no Nsight Compute finding. Its time is not believed; its correctness stands."""
        return (not self.passed and self.verdict is not None and self.verdict.accepted and "ratio" in self.details
                and "ncu" not in self.details)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "recorded_us": self.recorded_us, "measured_us": self.measured_us,
                "verdict": self.verdict.to_dict() if self.verdict is not None else None, "details": dict(self.details)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Audit":
        v = data.get("verdict")
        return cls(bool(data["passed"]), str(data["reason"]), data.get("recorded_us"), data.get("measured_us"),
                   verdict_from_dict(v) if v else None, dict(data.get("details") or {}))


def auditable(verdict: Verdict) -> bool:
    """Accepted with GPU times: the only verdicts a best can come from."""
    return isinstance(verdict, Accepted) and any(s.timing in ("graph", "eager") and s.time_us for s in verdict.shapes)


def audit(judge: Any, source: str, task: Task, recorded: Verdict, tolerance: float = TOLERANCE,
          compiled: Mapping[str, str] | None = None) -> Audit:
    """Judge ``source`` again (``judge.verify``: a fresh worker, fresh seeds) and compare.
    ``compiled``: its Triton kernels compiled ahead (verifier/triton_ahead.py), given to both the
    second verdict's worker and the profiled one, as to any verdict's."""
    if not auditable(recorded):
        return Audit(False, "only accepted verdicts with GPU times are audited (interpreter runs are correctness only)")
    given = {"compiled": compiled} if compiled else {}
    again = judge.verify(source, task, audit=True, **given)
    result = compare(recorded, again, tolerance)
    if result.only_slower:  # judged once more before a time demotes (module docstring)
        result = measured_again(result, compare(recorded, judge.verify(source, task, audit=True, **given), tolerance))
    if not result.passed or not hasattr(judge, "profile"):
        return result
    profile = judge.profile(source, task, **given)
    if given and not profile.ran:  # a speed-up of ours never costs the audit its record: made again without them
        profile = judge.profile(source, task)
    return with_profile(result, profile, source, task)


def measured_again(first: Audit, second: Audit) -> Audit:
    """The audit after a time that did not hold (``first``) was judged once more (``second``,
    which decides); its reason and details say the first too (pure)."""
    details = dict(second.details, first_try={"reason": first.reason, "ratio": first.details.get("ratio"),
                                              "measured_us": first.measured_us})
    said = (f"judged a third time: the second verdict read {first.measured_us:.2f} us "
            f"({100 * (first.details['ratio'] - 1):+.1f}%)")
    return replace(second, reason=f"{second.reason}; {said}", details=details)


def with_profile(result: Audit, profile: ncu.Profile, source: str, task: Task) -> Audit:
    """A passed audit, with Nsight Compute's record read against it (pure)."""
    details = dict(result.details, ncu=profile.to_dict())
    if not profile.ran:
        return replace(result, reason=f"{result.reason}; {profile.note}", details=details)
    trusted = None
    if result.verdict is not None:
        trusted = next((s.time_us for s in result.verdict.shapes if dict(s.shape) == dict(profile.shape) and not s.hidden), None)
    why = ncu.judge(profile, own_kernel_names(source), task.allow_torch_ops, trusted)
    if why is not None:
        return replace(result, passed=False, reason=f"the Nsight Compute record fails it: {why}", details=details)
    return replace(result, reason=f"{result.reason}; Nsight Compute saw {len(profile.launches)} launches of its kernels, "
                                  f"{profile.per_call_us:.2f} us per call", details=details)


def compare(recorded: Verdict, again: Verdict, tolerance: float = TOLERANCE) -> Audit:
    """The audit's decision, given both verdicts (pure)."""
    if not again.accepted:
        return Audit(False, f"judged again in a fresh worker on fresh inputs, it was rejected: {describe(again)}", verdict=again,
                     details={"status": again.status.value, "threat": again.threat})
    before = {(s.label, s.hidden): s.time_us for s in recorded.shapes if s.timing in ("graph", "eager") and s.time_us}
    after = {(s.label, s.hidden): s.time_us for s in again.shapes if s.timing in ("graph", "eager") and s.time_us}
    common = sorted(set(before) & set(after))
    if not common:
        return Audit(False, "the second verdict timed none of the shapes the first one did", verdict=again)
    ratio = math.exp(sum(math.log(after[k] / before[k]) for k in common) / len(common))
    rec = math.exp(sum(math.log(before[k]) for k in common) / len(common))
    mea = math.exp(sum(math.log(after[k]) for k in common) / len(common))
    worst = max(common, key=lambda k: after[k] / before[k])
    details = {"ratio": ratio, "shapes": len(common), "worst_shape": worst[0], "worst_ratio": after[worst] / before[worst],
               **_speedups(again)}
    if ratio > 1 + tolerance:
        return Audit(False, f"its time did not hold: {rec:.2f} us recorded, {mea:.2f} us judged again in a fresh worker "
                            f"({100 * (ratio - 1):+.1f}% over {len(common)} shapes; worst {worst[0]})",
                     recorded_us=rec, measured_us=mea, verdict=again, details=details)
    return Audit(True, f"accepted again in a fresh worker on fresh inputs; time {mea:.2f} us against {rec:.2f} us recorded "
                       f"({100 * (ratio - 1):+.1f}%){_hidden_note(details)}", recorded_us=rec, measured_us=mea, verdict=again,
                 details=details)


def _speedups(verdict: Verdict) -> dict[str, Any]:
    """Geometric-mean speedup over torch.compile at the public and at the hidden shapes the
    verdict timed on the GPU, with how many of each (the entries it has figures for)."""
    out: dict[str, Any] = {}
    for name, hidden in (("public", False), ("hidden", True)):
        ratios = [s.compile_us / s.time_us for s in verdict.shapes
                  if s.hidden == hidden and s.timing in ("graph", "eager") and s.time_us and s.compile_us]
        if ratios:
            out[f"{name}_x_compile"] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            out[f"{name}_shapes"] = len(ratios)
    return out


def _hidden_note(details: Mapping[str, Any]) -> str:
    if "hidden_x_compile" not in details:
        return ""
    public = f" (public {details['public_x_compile']:.2f}x)" if "public_x_compile" in details else ""
    n = details["hidden_shapes"]
    return f"; at its {n} hidden shape{'s' if n != 1 else ''} {details['hidden_x_compile']:.2f}x torch.compile{public}"
