"""Helpers shared by the loop's tests: archive history rows built in one line."""

from __future__ import annotations

from dataclasses import replace

from kernforge.archive.history import HistoryRow

#: An LLM's rejected attempt on task 1 with no parent, reuse, verdict details or cost.
_DEFAULT_ROW = HistoryRow(id=0, run_id=1, seq=0, task_id=1, parent_id=None, reuse_of=None, proposer="llm/fresh",
                          model="m", status="incorrect", accepted=False, threat=None, reason="", check="", evidence={},
                          score=None, time_us=None, gpu="cpu", env_key="e", created="", code_hash="0",
                          tokens_in=0, tokens_out=0, cost_usd=0.0, latency_s=0.0)


def history_row(i: int, **fields) -> HistoryRow:
    """Attempt ``i`` (its id, seq and code hash) with ``fields`` replacing the defaults."""
    return replace(_DEFAULT_ROW, id=i, seq=i, code_hash=str(i), **fields)
