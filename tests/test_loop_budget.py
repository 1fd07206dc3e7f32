"""loop/budget.py: attempts per task, time, tokens and money, and what a resumed run already spent."""

from __future__ import annotations

import pytest

from kernforge.loop.budget import Budget, Meter, Spent, earlier_seconds
from kernforge.loop.errors import LoopError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("kwargs, flag", [
    ({"max_attempts": 0}, "--max-attempts"), ({"hours": -1.0}, "--hours"), ({"max_tokens": 0}, "--max-tokens"),
    ({"max_cost": float("nan")}, "--max-cost"), ({"hours": float("inf")}, "--hours"),
])
def test_bad_limits_are_refused(kwargs, flag):
    with pytest.raises(LoopError, match=flag):
        Budget(**kwargs)


def test_merged_keeps_what_is_not_overridden():
    stored = Budget(max_attempts=10, hours=2.0)
    assert stored.merged(Budget(max_attempts=30)) == Budget(max_attempts=30, hours=2.0)
    assert Budget.from_dict(stored.to_dict()) == stored and Budget().unlimited and not stored.unlimited


def test_attempts_are_per_task_and_reserved_before_asking():
    meter = Meter(Budget(max_attempts=2))
    assert meter.reserve("a") and meter.reserve("a") and not meter.reserve("a")  # two in flight: none left
    meter.release("a")  # one request failed: its attempt is free again
    assert meter.reserve("a")
    meter.record("a", tokens=10, cost=0.01)
    meter.record("a", tokens=10, cost=0.01)
    assert meter.task_done("a") and not meter.reserve("a")
    assert meter.reserve("b") and not meter.task_done("b")  # another task has its own budget
    assert meter.stopped() is None


@pytest.mark.parametrize("budget, tokens, cost, words", [
    (Budget(max_tokens=1000), 1000, 0.0, "token budget"),
    (Budget(max_cost=0.5), 0, 0.5, "cost budget"),
])
def test_tokens_and_cost_stop_the_run(budget, tokens, cost, words):
    meter = Meter(budget)
    assert meter.reserve("a") and meter.reserve("b")
    meter.record("a", tokens=tokens - 1 if tokens else 0, cost=cost / 2)
    assert meter.stopped() is None
    meter.record("b", tokens=1 if tokens else 0, cost=cost / 2)
    assert words in meter.stopped() and not meter.reserve("a")


def test_hours_count_earlier_sessions():
    clock = Clock()
    meter = Meter(Budget(hours=1.0), Spent(seconds=3000.0), clock=clock)
    clock.now += 599
    assert meter.stopped() is None
    clock.now += 1
    assert "time budget" in meter.stopped()


def test_a_resumed_run_starts_from_what_it_spent():
    meter = Meter(Budget(max_attempts=5, max_tokens=100), Spent(attempts={"a": 3}, tokens=60, cost=0.2))
    assert meter.attempts("a") == 3 and meter.attempts_left("a") == 2 and meter.tokens == 60 and meter.cost == 0.2
    meter.record("a", tokens=40, cost=0.0, reserved=False)
    assert "token budget" in meter.stopped()


def test_earlier_seconds_leaves_out_time_the_run_lay_dead():
    stamps = ["2026-01-01T10:00:10+00:00", "2026-01-01T10:00:30+00:00",
              # killed after 10:00:30, resumed two hours later
              "2026-01-01T12:00:40+00:00", "2026-01-01T12:00:50+00:00"]
    assert earlier_seconds("2026-01-01T10:00:00+00:00", stamps, dead_gap_s=600) == pytest.approx(30 + 10)
    assert earlier_seconds("2026-01-01T10:00:00+00:00", [], dead_gap_s=600) == 0.0
