"""Budgets: attempts per task, wall-clock hours, tokens and money for the whole run.

A resumed run is charged what it spent before it was killed: attempts, tokens and cost are summed
from its archived rows, and its earlier wall time from their timestamps (``earlier_seconds``).

Attempts are *reserved* before a proposal is asked for and released if no attempt comes of it
(the LLM request failed), so the loop never has more proposals in flight than attempts left.
Tokens and cost cannot be known before a reply arrives: the loop stops asking once the spent
amount reaches the limit, so in-flight replies may overshoot it by at most the replies in flight.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

from .errors import LoopError


@dataclass(frozen=True)
class Budget:
    """Limits; None means unlimited. ``max_attempts`` is per task, the others are for the run."""

    max_attempts: int | None = None
    hours: float | None = None
    max_tokens: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                flag = {"max_attempts": "--max-attempts", "hours": "--hours", "max_tokens": "--max-tokens",
                        "max_cost": "--max-cost"}[name]
                raise LoopError(f"{flag} must be a positive number, not {value!r}")

    @property
    def unlimited(self) -> bool:
        return all(v is None for v in asdict(self).values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Budget":
        return cls(**{k: data.get(k) for k in ("max_attempts", "hours", "max_tokens", "max_cost")})

    def merged(self, override: "Budget") -> "Budget":
        """This budget with every limit ``override`` sets replacing ours (a resume with new limits)."""
        return Budget(**{k: v if v is not None else getattr(self, k) for k, v in asdict(override).items()})


@dataclass(frozen=True)
class Spent:
    """What a run had spent before this session (all zero for a new run)."""

    attempts: Mapping[str, int] = field(default_factory=dict)  # task name -> attempts
    tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0


def _parse(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def earlier_seconds(started: str, created: Iterable[str], dead_gap_s: float) -> float:
    """Wall time a run was alive, from its start and its attempts' timestamps.

    Each attempt is charged the time since the one before (the first since the run started). A gap
    longer than ``dead_gap_s`` (more than the longest a live run can go without recording an
    attempt: an LLM request's whole deadline plus a verification's timeout) spans time the run lay
    dead between a kill and a resume, and is not charged at all. Time after a session's last
    attempt is not known and not charged either: a resumed run is charged at most what it lived.
    """
    last = _parse(started)
    total = 0.0
    for stamp in sorted(created):
        now = _parse(stamp)
        gap = now - last
        if 0 < gap <= dead_gap_s:
            total += gap
        last = max(last, now)
    return total


class Meter:
    """Counts what the run spends against its budget; the loop asks it before every proposal."""

    def __init__(self, budget: Budget, before: Spent = Spent(), *, clock: Callable[[], float] = time.monotonic):
        self.budget = budget
        self.before = before
        self._clock = clock
        self._start = clock()
        self.recorded: dict[str, int] = dict(before.attempts)
        self.reserved: dict[str, int] = {}
        self.tokens = before.tokens
        self.cost = before.cost

    # ---- time -----------------------------------------------------------------------------------
    @property
    def session_seconds(self) -> float:
        return self._clock() - self._start

    @property
    def seconds(self) -> float:
        """Wall time charged to the run: earlier sessions plus this one so far."""
        return self.before.seconds + self.session_seconds

    # ---- attempts -------------------------------------------------------------------------------
    def attempts(self, task: str) -> int:
        return self.recorded.get(task, 0)

    def attempts_left(self, task: str) -> float:
        if self.budget.max_attempts is None:
            return math.inf
        return self.budget.max_attempts - self.recorded.get(task, 0) - self.reserved.get(task, 0)

    def reserve(self, task: str) -> bool:
        """Take one attempt of ``task``'s budget for a proposal about to be asked for."""
        if self.stopped() is not None or self.attempts_left(task) < 1:
            return False
        self.reserved[task] = self.reserved.get(task, 0) + 1
        return True

    def release(self, task: str) -> None:
        """The reserved proposal came to nothing (no attempt will be recorded)."""
        self.reserved[task] = max(0, self.reserved.get(task, 0) - 1)

    def record(self, task: str, tokens: int, cost: float, *, reserved: bool = True) -> None:
        if reserved:
            self.release(task)
        self.recorded[task] = self.recorded.get(task, 0) + 1
        self.tokens += tokens
        self.cost += cost

    def time_spent(self) -> bool:
        return self.budget.hours is not None and self.seconds >= self.budget.hours * 3600

    # ---- verdicts -------------------------------------------------------------------------------
    def task_done(self, task: str) -> bool:
        """Every attempt of ``task``'s budget is recorded (reservations not counted)."""
        return self.budget.max_attempts is not None and self.recorded.get(task, 0) >= self.budget.max_attempts

    def stopped(self) -> str | None:
        """Why the whole run must stop asking for proposals, or None."""
        b = self.budget
        if b.hours is not None and self.seconds >= b.hours * 3600:
            return f"the time budget ({b.hours:g} h) is spent"
        if b.max_tokens is not None and self.tokens >= b.max_tokens:
            return f"the token budget ({b.max_tokens:,} tokens) is spent"
        if b.max_cost is not None and self.cost >= b.max_cost:
            return f"the cost budget (${b.max_cost:g}) is spent"
        return None
