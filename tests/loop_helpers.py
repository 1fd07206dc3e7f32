"""Helpers shared by the loop's tests: archive history rows built in one line, and judged kernels in a
task's state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kernforge.archive.history import HistoryRow

#: An LLM's rejected attempt on task 1 with no parent, reuse, verdict details or cost.
_DEFAULT_ROW = HistoryRow(id=0, run_id=1, seq=0, task_id=1, parent_id=None, reuse_of=None, proposer="llm/fresh",
                          model="m", status="incorrect", accepted=False, threat=None, reason="", check="", evidence={},
                          score=None, time_us=None, gpu="cpu", env_key="e", created="", code_hash="0",
                          tokens_in=0, tokens_out=0, cost_usd=0.0, latency_s=0.0)


def history_row(i: int, **fields) -> HistoryRow:
    """Attempt ``i`` (its id, seq and code hash) with ``fields`` replacing the defaults."""
    return replace(_DEFAULT_ROW, id=i, seq=i, code_hash=str(i), **fields)


TASKS = Path(__file__).resolve().parent / "tasks"


def audited_kernel(n: int, us: float, passed=None):
    """A kernel judged at ``us`` (attempt ``n``), audited (``passed``) or not yet."""
    from kernforge.loop.search import Member
    from kernforge.verifier.verdict import Accepted, ShapeResult

    from candidates import HONEST

    shapes = (ShapeResult({"T": 4}, False, "float32", "graph", time_us=us, compile_us=100.0),)
    return Member(HONEST + f"\n# {n}\n", Accepted(shapes=shapes), attempt_id=n, audit_passed=passed)


def task_state(name: str, *members):
    """tiny_norm's state under ``name``, its population holding ``members``."""
    import random

    from kernforge.loop.display import TaskStats
    from kernforge.loop.lessons import Lessons
    from kernforge.loop.plan import TaskState
    from kernforge.loop.search import Population
    from kernforge.tasks.loader import load_task

    pop = Population(rng=random.Random(0))
    for m in members:
        pop.add(m)
    return TaskState(load_task(TASKS / "tiny_norm"), 1, pop, Lessons(), TaskStats(name))
