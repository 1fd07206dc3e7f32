"""loop/strategy.py: rewards, Thompson sampling that finds the arm that pays, replay from the archive."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kernforge.loop.strategy import Bandit, proposer_name, reward, strategy_of
from loop_helpers import history_row


@pytest.mark.parametrize("accepted, parent, child, best, parent_accepted, expected", [
    (False, (0, 1.0), None, (0, 2.0), True, 0.0),  # rejected
    (True, (0, 1.0), (0, 0.5), (0, 2.0), True, 0.3),  # accepted, slower than its parent
    (True, (0, 1.0), (0, 1.5), (0, 2.0), True, 0.7),  # faster than its parent
    (True, (0, 1.0), (0, 2.5), (0, 2.0), True, 1.0),  # the task's new best
    (True, None, (0, 0.5), (0, 2.0), False, 0.7),  # a fresh kernel (no parent), or a repaired one
    (True, None, (0, 0.5), None, False, 1.0),  # the task's first accepted kernel
])
def test_reward(accepted, parent, child, best, parent_accepted, expected):
    assert reward(accepted, parent, child, best, parent_accepted=parent_accepted) == pytest.approx(expected)


def test_a_reused_verdict_pays_nothing_even_when_it_would_be_a_new_best():
    assert reward(True, None, (0, 2.5), (0, 2.0), reused=True) == 0.0


def test_proposer_names_carry_the_strategy():
    assert strategy_of(proposer_name("repair")) == "repair"
    assert strategy_of("offline") is None and strategy_of("seed") is None


def test_thompson_sampling_finds_the_arm_that_pays():
    payoff = {("improve", "a"): 0.7, ("fresh", "a"): 0.2, ("improve", "b"): 0.1}
    bandit = Bandit(random.Random(0), discount=1.0)
    world = random.Random(1)
    pulls = Counter()
    for _ in range(400):
        arm = bandit.choose(list(payoff))
        pulls[arm] += 1
        bandit.update(arm, 1.0 if world.random() < payoff[arm] else 0.0)
    assert pulls[("improve", "a")] > 300
    assert all(n > 0 for n in pulls.values())  # every arm was tried
    table = {(r["strategy"], r["model"]): r for r in bandit.table()}
    assert table[("improve", "a")]["posterior"] > table[("fresh", "a")]["posterior"]


def test_discount_relearns_an_arm_whose_payoff_changes():
    bandit = Bandit(random.Random(0), discount=0.95)
    for _ in range(200):
        bandit.update(("improve", "m"), 1.0)
    for _ in range(200):
        bandit.update(("improve", "m"), 0.0)
    assert bandit.arms[("improve", "m")].mean < 0.2  # without forgetting it would still sit at 0.5


def test_choose_is_reproducible_and_only_among_available():
    a, b = Bandit(random.Random(7)), Bandit(random.Random(7))
    arms = [("improve", "m"), ("repair", "m"), ("fresh", "m")]
    assert [a.choose(arms) for _ in range(30)] == [b.choose(arms) for _ in range(30)]
    assert {a.choose(arms[2:]) for _ in range(10)} == {("fresh", "m")}
    with pytest.raises(ValueError):
        a.choose([])
    with pytest.raises(ValueError):
        a.update(arms[0], 1.5)


def test_replay_learns_from_archived_attempts():
    ok = {"status": "accepted", "accepted": True}
    rows = [
        history_row(1, proposer="seed", **ok, time_us=100.0),
        history_row(2, proposer="llm/improve", **ok, time_us=50.0, parent_id=1),  # faster and the new best: 1.0
        history_row(3, proposer="llm/fresh"),  # rejected: 0.0
        history_row(4, proposer="llm/improve", **ok, time_us=80.0, parent_id=2),  # slower than its parent: 0.3
        history_row(5, proposer="llm/fresh", **ok, time_us=50.0, reuse_of=2),  # a repeat: 0.0
        history_row(6, proposer="offline", **ok, time_us=40.0, parent_id=2),  # not an LLM arm
    ]
    from kernforge.loop.search import row_fitness

    bandit = Bandit(random.Random(0), discount=1.0)
    assert bandit.replay(rows, {r.id: row_fitness(r) for r in rows}) == 4
    improve, fresh = bandit.arms[("improve", "m")], bandit.arms[("fresh", "m")]
    assert (improve.pulls, improve.total) == (2, pytest.approx(1.3))
    assert (fresh.pulls, fresh.total) == (2, 0.0)
