"""The judge's checks are pipelined (the candidate computes the next call while the reference
worker compares the last one): the pipeline must not change what is revealed or decided.

* hidden shapes are sent only once every public check passed, even with a call sent ahead;
* a rejection part-way leaves no reference behind in the reference worker;
* every verdict carries its time breakdown, and output files are reused, two per output.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import candidates as C
import pytest
from kernforge.loop.evaluate import open_judge
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import Judge, JudgeOptions

TASKS = Path(__file__).parent / "tasks"

#: Right on T=4 (the first public shape); from T=8 (the second) the last row is never written.
WRONG_ON_SECOND_PUBLIC = C.with_forward(
    "        return norm(x, w, rows=x.shape[0] if x.shape[0] == 4 else x.shape[0] - 1)")


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = JudgeOptions(cpu_timing_reps=1, cache_dir=tmp_path_factory.mktemp("cache"))
    with open_judge("cpu", pool_size=1, options=options) as j:
        yield j


@pytest.fixture
def sent(monkeypatch):
    """(shape, hidden) of every check sent to the candidate's worker, in order."""
    seen: list[tuple[dict, bool]] = []
    original = Judge._send
    hidden_shapes = [s.as_dict() for s in load_task(TASKS / "tiny_norm").shapes("cpu", hidden=True)]

    def recording(self, session, msg):
        if msg.get("op") == "check" and msg.get("repeat", True):
            seen.append((msg["shape"], msg["shape"] in hidden_shapes))
        return original(self, session, msg)

    monkeypatch.setattr(Judge, "_send", recording)
    return seen


def test_hidden_shapes_never_sent_after_a_public_failure(judge, sent):
    verdict = judge.verify(WRONG_ON_SECOND_PUBLIC, load_task(TASKS / "tiny_norm"))
    assert not verdict.accepted
    assert "public shape T=8" in verdict.reason, verdict.reason
    assert sent and not any(hidden for _, hidden in sent), sent
    assert judge._live_refs == set(), "a rejection left references in the reference worker"


def test_honest_kernel_checks_every_shape_in_order_and_reports_its_time(judge, sent):
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    task = load_task(TASKS / "tiny_norm")
    expected = [(s.as_dict(), hidden) for hidden in (False, True) for s in task.shapes("cpu", hidden=hidden)
                for _ in task.distributions]
    assert sent == expected
    phases = verdict.environment["phase_seconds"]
    for step in ("worker.check", "ref.reference", "ref.compare", "worker.time", "worker.check:write", "ref.compare:read"):
        assert step in phases and phases[step] >= 0, phases
    assert sum(v for k, v in phases.items() if ":" not in k) <= verdict.environment["verify_seconds"] + 0.05
    assert judge._live_refs == set()


def test_checked_outputs_alternate_between_two_files(judge, monkeypatch):
    """Each checked call's outputs go to one of two files per output, alternating, so the
    candidate writes one while the reference worker reads the other and the files are reused
    (kept mapped) rather than piling up, one per call."""
    compared: list[str] = []
    original = Judge._ask_ref

    def spying(self, msg, timeout=None):
        if msg.get("op") == "compare" and isinstance(msg["files"][0], dict) and "/out_" in msg["files"][0]["file"]:
            compared.append(Path(msg["files"][0]["file"]).name)
        return original(self, msg, timeout)

    monkeypatch.setattr(Judge, "_ask_ref", spying)
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    assert len(compared) > 4 and set(compared) == {"out_s0_0.bin", "out_s1_0.bin"}, compared
    assert all(a != b for a, b in itertools.pairwise(compared)), compared
