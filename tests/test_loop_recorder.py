"""A run's archive while it runs (loop/recorder.py): attempts with dense sequence numbers and their
parents, reuses, audits, lookups, and the judges' baselines kept both ways."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

from kernforge.archive import synthetic
from kernforge.archive.content import code_hash, environment_key
from kernforge.archive.store import Archive
from kernforge.loop.proposers import Proposal
from kernforge.loop.recorder import RunRecorder
from kernforge.loop.search import Member
from kernforge.verifier.verdict import Accepted, ShapeResult

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from loop_helpers import task_state  # noqa: E402


class _Devices(SimpleNamespace):
    """The judges as the recorder sees them: their environment and the baselines they hold."""

    def learn_baselines(self, kept):
        self.learned = dict(kept)

    def known_baselines(self):
        return dict(self.baselines)


def _verdict(us=20.0):
    shapes = (ShapeResult({"T": 8}, False, "float32", "graph", time_us=us),)
    return Accepted(shapes=shapes, environment=dict(synthetic.H200))


def _devices(**baselines):
    return _Devices(env=dict(synthetic.H200), env_key=environment_key(synthetic.H200), baselines=baselines)


def _recorder(tmp_path, devices, next_seq=0):
    archive = Archive.create(tmp_path / "k.db")
    state = task_state("rms_norm")
    state.task_id = archive.register_task(synthetic.task_record("rms_norm"))
    run = archive.start_run({})
    return archive, state, RunRecorder(archive, run, devices, next_seq)


def test_attempts_are_written_in_order_with_dense_sequence_numbers_and_their_parents(tmp_path):
    devices = _devices()
    archive, state, recorder = _recorder(tmp_path, devices, next_seq=7)  # a resumed run: after its last

    async def write():
        first = await recorder.attempt_judged(state, Proposal(code="k = 1", proposer="seed"), _verdict(), None)
        state.ids[code_hash("k = 1")] = first[0]
        # the parent is named by its code: its attempt id comes from the task's ids
        child = Proposal(code="k = 2", proposer="offline", parent=Member("k = 1", _verdict(), None, "seed"))
        second = await recorder.attempt_judged(state, child, _verdict(10.0), None)
        again = await recorder.attempt_judged(state, Proposal(code="k = 2", proposer="offline"), _verdict(10.0), second[0])
        return first, second, again

    try:
        (first, seq1), (second, seq2), (again, seq3) = asyncio.run(write())
        assert (seq1, seq2, seq3) == (7, 8, 9)
        assert archive.get_attempt(second).parent_id == first
        assert archive.get_attempt(again).reuse_of == second
    finally:
        recorder.close()
        archive.close()


def test_a_lookup_finds_the_code_judged_in_this_environment_and_an_audit_is_kept(tmp_path):
    devices = _devices()
    archive, state, recorder = _recorder(tmp_path, devices)
    verdict = _verdict()

    async def go():
        attempt_id, _ = await recorder.attempt_judged(state, Proposal(code="k = 1", proposer="seed"), verdict, None)
        await recorder.audited(attempt_id, synthetic.audit(verdict))
        return attempt_id, await recorder.lookup(state, "k = 1"), await recorder.lookup(state, "k = 3")

    try:
        attempt_id, hit, miss = asyncio.run(go())
        assert miss is None
        assert hit is not None and hit.id == attempt_id and hit.audit_passed
        assert list(archive.latest_audits([attempt_id])) == [attempt_id]
    finally:
        recorder.close()
        archive.close()


def test_baselines_go_both_ways(tmp_path):
    """At the start the archive's baselines go to the judges and the judges' own to the archive;
    after each attempt, those measured since."""
    devices = _devices(**{"held-by-the-judge": {"eager_us": 5.0}})
    archive, state, recorder = _recorder(tmp_path, devices)
    archive.keep_judge_baselines({"from-archive": {"eager_us": 10.0}})
    try:
        recorder.share_baselines()
        assert devices.learned == {"from-archive": {"eager_us": 10.0}}
        assert set(archive.judge_baselines()) == {"from-archive", "held-by-the-judge"}
        devices.baselines["measured"] = {"compile_us": 7.0}
        asyncio.run(recorder.attempt_judged(state, Proposal(code="k = 1", proposer="seed"), _verdict(), None))
        assert archive.judge_baselines()["measured"] == {"compile_us": 7.0}
    finally:
        recorder.close()
        archive.close()
