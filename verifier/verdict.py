"""Typed verdicts: ``Accepted(measurements)`` or ``Rejected(status, reason, threat, check, evidence)``.

A verdict is what the archive stores, what ``kernforge eval --json`` prints and what the prompt
quotes back to the model, so it round-trips through plain JSON (``to_dict``/``verdict_from_dict``).
Every verdict carries a reason a person can read; a rejection also names the check that made it
(``checks.Check``), stored as ``evidence["check"]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Mapping, Union

from .checks import Check


class Status(str, Enum):
    ACCEPTED = "accepted"
    STATIC_REJECTED = "static_rejected"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    CHEAT = "cheat"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    SANDBOX_VIOLATION = "sandbox_violation"


#: THREATS.md classes, by number, as a verdict names them.
THREATS: Mapping[int, str] = {
    1: "stale memory",
    2: "degenerate output",
    3: "partial or analytical computation",
    4: "input mutation",
    5: "side-stream work",
    6: "background threads",
    7: "lazy output",
    8: "timer patching",
    9: "forged results",
    10: "harness tampering",
    11: "caching across calls",
    12: "deferral across calls",
    13: "phase detection",
    14: "shape fitting",
    15: "lowered precision",
    16: "reference call",
    17: "ghost kernel",
    18: "L2 pinning",
    19: "undefined behaviour",
    20: "score collapse",
    21: "sandbox escape",
    22: "namespace pollution",
}


#: a shape's ``timing`` when it was checked but not timed (verifier/contender.py)
NOT_TIMED = "not timed"
#: a shape's ``method`` when its time of record is the guard's bound, not the difference of its
#: two batch sizes (defences/clock.per_call): what the batch paid once outgrew a tenth of its window
BOUNDED = "difference, bounded"
#: evidence key of a rejection made after the candidate was called at a hidden shape: its process
#: knew a hidden shape then, so any text it produced (an error, its output, a process name) may
#: carry it, and no prompt quotes such text (prompts/feedback.py, loop/lessons.py)
SAW_HIDDEN = "saw_hidden"


def saw_hidden(evidence: Mapping[str, Any]) -> bool:
    """Whether a rejection with this evidence was made at, or after, a call at a hidden shape
    (``SAW_HIDDEN``, or the failing shape itself hidden): none of the candidate's text in it may
    reach a prompt or a lesson."""
    return bool(evidence.get(SAW_HIDDEN) or evidence.get("hidden"))


@dataclass(frozen=True)
class ShapeResult:
    """What one shape measured. Times are microseconds of device time per call."""

    shape: Mapping[str, int]
    hidden: bool
    dtype: str
    #: "graph" (CUDA-graph replay), "eager" (flagged fallback), "interpreter" (CPU: correctness
    #: only; its time is the judge's wall clock per call and is never ranked) or ``NOT_TIMED``
    #: (checked, not timed: the candidate could not lead, verifier/contender.py)
    timing: str
    time_us: float | None = None
    spread_pct: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_bandwidth: float | None = None
    pct_flops: float | None = None
    floor_us: float | None = None
    #: the production kernel library's time at this shape, where the task names one and it is
    #: installed (verifier/library.py), the speedup over it, and which library ("liger-kernel 0.8.5")
    library_us: float | None = None
    speedup_library: float | None = None
    library: str | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    #: calls in each trusted batch, and what the candidate's own process said one call took
    #: (diagnostics: the time of record is ``time_us``, from the trusted clock)
    batch_calls: int | None = None
    claimed_us: float | None = None
    #: the trusted clock's own fixed cost per batch (calibrated before the module was loaded)
    clock_cost_us: float | None = None
    #: timed by two batch sizes (defences/clock.per_call): the short batch's calls, the long
    #: batch's own figure (window less write and calibrated cost, over its calls), the fixed
    #: cost per batch the calibration did not see, and how the time of record was reached
    short_calls: int | None = None
    single_us: float | None = None
    fixed_us: float | None = None
    method: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["shape"] = dict(self.shape)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ShapeResult":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.shape.items())

    @property
    def bounded(self) -> bool:
        """Its time of record is a bound (``BOUNDED``), likely above the kernel's own time; the
        baselines beside it are timed otherwise, in the reference's own process by one batch size
        (timing.time_batch), so its speedups at this shape are likely understated."""
        return self.method == BOUNDED


#: what ``printable`` shows as an escape: C0 controls but tab and line feed, DEL, C1 controls, and
#: the bidirectional overrides and isolates (text that reads differently from what it holds)
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``): a candidate's error
    that begins with ESC [ 2K erased the run's line on a terminal and wrote a forged verdict in its
    place (red team). Tabs and line breaks stay."""
    if not isinstance(text, str):
        return text
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _printable_values(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {k: _printable_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_printable_values(v) for v in value)
    return value


@dataclass(frozen=True)
class Accepted:
    """The candidate is correct on every check and its times are real device time."""

    shapes: tuple[ShapeResult, ...]
    reason: str = "correct on every public and hidden shape and input distribution"
    #: flags that do not reject but must be read with the numbers (e.g. "eager timing fallback")
    flags: tuple[str, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    #: flags raised once the candidate had been called at a hidden shape: for people (``archive
    #: show``, ``eval``), never for a prompt. Whether one is raised, and its figures, are the
    #: candidate's choice there (a just-out element's excess), and its text names the shape.
    hidden_flags: tuple[str, ...] = ()

    status = Status.ACCEPTED
    threat = None
    accepted = True

    @property
    def evidence(self) -> dict[str, Any]:
        return {"flags": list(self.flags)} | ({"hidden_flags": list(self.hidden_flags)} if self.hidden_flags else {})

    def to_dict(self) -> dict[str, Any]:
        return _common(self) | {"flags": list(self.flags), "hidden_flags": list(self.hidden_flags)}


@dataclass(frozen=True)
class Rejected:
    """The candidate is rejected; ``evidence`` says which check, which shape and by how much."""

    status: Status
    reason: str
    threat: int | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    shapes: tuple[ShapeResult, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    #: the check that rejected it (taken from ``evidence["check"]`` when not given)
    check: Check = Check.OTHER

    accepted = False

    def __post_init__(self) -> None:
        # a reason and its evidence quote the candidate (its errors, its output, its processes'
        # names): what reaches a terminal, a report or a log is text, never a control sequence
        object.__setattr__(self, "reason", printable(self.reason))
        object.__setattr__(self, "evidence", _printable_values(self.evidence))
        if "check" in self.evidence:  # the stored form: the check lives in its own field
            if self.check is Check.OTHER:
                object.__setattr__(self, "check", Check.parse(self.evidence["check"]))
            object.__setattr__(self, "evidence", {k: v for k, v in self.evidence.items() if k != "check"})
        if not isinstance(self.check, Check):
            object.__setattr__(self, "check", Check.parse(self.check))
        if self.status is Status.ACCEPTED:
            raise ValueError("a rejection cannot have status 'accepted'")
        if self.status is Status.CHEAT and self.threat not in THREATS:
            raise ValueError(f"a cheat verdict names its THREATS.md class, got {self.threat!r}")
        if self.threat is not None and self.threat not in THREATS:
            raise ValueError(f"unknown threat class {self.threat!r}")
        if not self.reason:
            raise ValueError("every verdict has a reason")

    def to_dict(self) -> dict[str, Any]:
        out = _common(self)
        out["evidence"] = {"check": self.check.value, **{k: v for k, v in out["evidence"].items() if k != "check"}}
        out["check"] = self.check.value
        return out

    @property
    def key(self) -> tuple[str, int | None, str]:
        """What lessons and statistics group rejections by: (status, threat, check)."""
        return (self.status.value, self.threat, self.check.value)


Verdict = Union[Accepted, Rejected]


def _common(v: Verdict) -> dict[str, Any]:
    return {
        "accepted": v.accepted,
        "status": v.status.value,
        "threat": v.threat,
        "threat_name": THREATS.get(v.threat) if v.threat else None,
        "reason": v.reason,
        "evidence": dict(v.evidence),
        "shapes": [s.to_dict() for s in v.shapes],
        "environment": dict(v.environment),
    }


def verdict_from_dict(data: Mapping[str, Any]) -> Verdict:
    shapes = tuple(ShapeResult.from_dict(s) for s in data.get("shapes", ()))
    env = dict(data.get("environment", {}))
    if data["status"] == Status.ACCEPTED.value:
        hidden = data.get("hidden_flags") or dict(data.get("evidence") or {}).get("hidden_flags") or ()
        return Accepted(shapes=shapes, reason=data.get("reason", ""), flags=tuple(data.get("flags", ())), environment=env,
                        hidden_flags=tuple(hidden))
    evidence = dict(data.get("evidence", {}))
    return Rejected(
        status=Status(data["status"]),
        reason=data["reason"],
        threat=data.get("threat"),
        evidence=evidence,
        shapes=shapes,
        environment=env,
        check=Check.parse(data.get("check", evidence.get("check", Check.OTHER.value))),
    )


def describe(v: Verdict) -> str:
    """One line for people: 'cheat (#5 side-stream work): ...'."""
    head = v.status.value
    if v.threat:
        head += f" (#{v.threat} {THREATS[v.threat]})"
    return f"{head}: {v.reason}"
