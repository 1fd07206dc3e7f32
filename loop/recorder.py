"""A run's reads and writes of its archive while it runs, in the archive's own thread.

SQLite blocks: every call here runs in one thread of its own (one, so writes keep their order),
never on the event loop that keeps LLM requests in flight and the devices fed.

* **Attempts** are written one per transaction (``Archive.record_attempt``), with dense sequence
  numbers (one per row; a resumed run goes on after its last).
* **Audits** are written in a transaction of their own, after their attempt.
* **The judges' baselines** go both ways: the archive's to the judges at the start (a fresh
  machine measures none of them again), and those the judges measured since, to the archive after
  every attempt.
* **Lookups**: the same normalised code for the same task in the same environment is judged once
  (``Archive.lookup``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from kernforge.archive.content import code_hash
from kernforge.archive.records import AttemptRecord, NewAttempt
from kernforge.archive.store import Archive
from kernforge.verifier.audit import Audit
from kernforge.verifier.verdict import Verdict

from .devices import Devices
from .plan import TaskState
from .proposers import Proposal


class RunRecorder:
    """Run ``run_id``'s archive, as the running run reads and writes it; ``next_seq`` is the
    sequence number of its next attempt."""

    def __init__(self, archive: Archive, run_id: int, devices: Devices, next_seq: int = 0) -> None:
        self.archive = archive
        self.run_id = run_id
        self._devices = devices
        self._next_seq = next_seq
        self._kept: set[str] = set()  # the judges' baseline keys the archive holds
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kernforge-archive")

    def close(self) -> None:
        """Wait for the writes under way; nothing more is written."""
        self._executor.shutdown(wait=True)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ---- reads ---------------------------------------------------------------------------------
    async def lookup(self, state: TaskState, code: str) -> AttemptRecord | None:
        """The attempt that judged this code for this task in this environment, if any."""
        return await self._call(self.archive.lookup, state.task_id, code, self._devices.env_key)

    async def attempt(self, attempt_id: int) -> AttemptRecord | None:
        return await self._call(self.archive.get_attempt, attempt_id)

    # ---- writes --------------------------------------------------------------------------------
    async def attempt_judged(self, state: TaskState, proposal: Proposal, verdict: Verdict,
                             reuse_of: int | None) -> tuple[int, int]:
        """Write the attempt; its id and sequence number."""
        return await self._call(self._record, state, proposal, verdict, reuse_of)

    async def audited(self, attempt_id: int, audit: Audit) -> None:
        await self._call(self.archive.record_audit, attempt_id, audit, self.run_id)

    def share_baselines(self) -> None:
        """The archive's baselines to the judges, and any the judges' own cache holds that the
        archive lacks, to the archive (at the start, before any verdict)."""
        kept = self.archive.judge_baselines()
        self._devices.learn_baselines(kept)
        self._kept = set(kept)
        self._keep_baselines()

    def _record(self, state: TaskState, p: Proposal, verdict: Verdict, reuse_of: int | None) -> tuple[int, int]:
        """Write the attempt (in the archive's thread). Sequence numbers are dense: one per row."""
        parent_id = None
        if p.parent is not None:
            parent_id = p.parent.attempt_id or state.ids.get(code_hash(p.parent.code))
        seq = self._next_seq
        attempt_id = self.archive.record_attempt(NewAttempt(
            run_id=self.run_id, seq=seq, task_id=state.task_id, code=p.code, verdict=verdict,
            environment=self._devices.env if reuse_of is not None or p.unusable else {}, parent_id=parent_id,
            proposer=p.proposer, model=p.model, prompt=p.prompt, response=p.response, tokens_in=p.tokens_in,
            tokens_out=p.tokens_out, cost_usd=p.cost, latency_s=p.latency_s, reuse_of=reuse_of,
        ))
        self._next_seq += 1
        self._keep_baselines()
        return attempt_id, seq

    def _keep_baselines(self) -> None:
        """Baselines measured since the last look, kept in the archive (in the archive's thread)."""
        known = self._devices.known_baselines()
        new = {k: v for k, v in known.items() if k not in self._kept}
        if new:
            self.archive.keep_judge_baselines(new)
            self._kept |= set(new)
