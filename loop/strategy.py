"""Which prompt strategies and models pay off, learned as the run goes: a small bandit.

An *arm* is a (strategy, model) pair: the strategy (search.py: improve, explore, repair, fresh)
decides which parent the prompt shows and so which instructions the model gets; the model is one
of the ``--model`` values. Each LLM proposal pulls one arm; its verdict pays a reward in [0, 1]:

    0.3 for an accepted kernel, + 0.4 when it is faster than its parent (or fixes a rejected parent,
    or is the task's first accepted kernel), + 0.3 when it is the task's new best.

A cheat or any rejection pays 0, and so does a kernel the archive already had (a repeat is no
progress, whatever its verdict). On the interpreter no kernel is faster than another (its times
never rank, search.py), so an accepted kernel pays 0.3, more only when it fixes a rejected parent
or is the task's first. Rewards favour progress, and acceptance alone keeps a little
value so an arm that writes correct but not faster kernels is not starved completely.

**Thompson sampling** over Beta posteriors (a fractional reward r adds r to alpha and 1 - r to
beta): each pull draws a plausible mean per available arm and takes the highest, so arms are
explored in proportion to the chance that they are best, and a bad arm stops being pulled
without ever being ruled out. ``discount`` (< 1) slowly forgets old evidence, so an arm whose
payoff changes as the kernels get harder is re-learned.

**Persistence through the archive.** An LLM attempt is archived with ``proposer = "llm/<strategy>"``
and its model; at start the bandit replays the archive's history (``replay``), recomputing each
attempt's reward from its verdict, its parent's and the task's best so far. What was learned in
one run is therefore where the next run starts, with no table of its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from kernforge.archive.history import HistoryRow

from .search import Fitness

Arm = tuple[str, str]  # (strategy, model)
PREFIX = "llm/"


def proposer_name(strategy: str) -> str:
    return f"{PREFIX}{strategy}"


def strategy_of(proposer: str) -> str | None:
    return proposer[len(PREFIX):] if proposer.startswith(PREFIX) else None


def reward(accepted: bool, parent_fitness: Fitness | None, child_fitness: Fitness | None,
           best_before: Fitness | None, *, parent_accepted: bool = False, reused: bool = False) -> float:
    """The payoff of one verdict (see the module docstring); ``reused``: the archive already had
    the code, so the verdict is a repeat and pays 0 whatever it says."""
    if reused or not accepted or child_fitness is None:
        return 0.0
    improved = (not parent_accepted) or parent_fitness is None or child_fitness > parent_fitness
    new_best = best_before is None or child_fitness > best_before
    return 0.3 + 0.4 * improved + 0.3 * new_best


@dataclass
class ArmStats:
    alpha: float = 1.0
    beta: float = 1.0
    pulls: int = 0
    total: float = 0.0

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)


class Bandit:
    def __init__(self, rng: random.Random, *, discount: float = 0.995, prior: tuple[float, float] = (1.0, 1.0)):
        if not 0 < discount <= 1:
            raise ValueError("discount must be in (0, 1]")
        self.rng = rng
        self.discount = discount
        self.prior = prior
        self.arms: dict[Arm, ArmStats] = {}

    def _arm(self, arm: Arm) -> ArmStats:
        if arm not in self.arms:
            self.arms[arm] = ArmStats(*self.prior)
        return self.arms[arm]

    def choose(self, available: Sequence[Arm]) -> Arm:
        """Thompson sampling over ``available`` (ties go to the first listed)."""
        if not available:
            raise ValueError("no arm to choose from")
        draws = [(self.rng.betavariate(self._arm(a).alpha, self._arm(a).beta), -i) for i, a in enumerate(available)]
        return available[max(range(len(available)), key=lambda i: draws[i])]

    def update(self, arm: Arm, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"a reward is in [0, 1], not {value}")
        a0, b0 = self.prior
        for stats in self.arms.values():  # forget a little of everything, towards the prior
            stats.alpha = a0 + (stats.alpha - a0) * self.discount
            stats.beta = b0 + (stats.beta - b0) * self.discount
        stats = self._arm(arm)
        stats.alpha += value
        stats.beta += 1.0 - value
        stats.pulls += 1
        stats.total += value

    def table(self) -> list[dict[str, object]]:
        """Per arm: pulls, mean reward seen, posterior mean (for the display and --json)."""
        return [
            {"strategy": s, "model": m, "pulls": st.pulls, "reward": st.total / st.pulls if st.pulls else None,
             "posterior": round(st.mean, 3)}
            for (s, m), st in sorted(self.arms.items())
        ]

    def replay(self, rows: Iterable[HistoryRow], fitness: Mapping[int, Fitness | None]) -> int:
        """Learn from archived attempts (oldest first); ``fitness`` by attempt id. Pulls replayed."""
        best: dict[int, Fitness | None] = {}
        accepted: dict[int, bool] = {}
        n = 0
        for row in rows:
            child = fitness.get(row.id)
            strategy = strategy_of(row.proposer)
            if strategy is not None:
                parent = row.parent_id
                value = reward(row.accepted, fitness.get(parent) if parent else None, child, best.get(row.task_id),
                               parent_accepted=accepted.get(parent, False) if parent else False,
                               reused=row.reuse_of is not None)
                self.update((strategy, row.model), value)
                n += 1
            accepted[row.id] = row.accepted
            if child is not None and (best.get(row.task_id) is None or child > best[row.task_id]):
                best[row.task_id] = child
        return n
