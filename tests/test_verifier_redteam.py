"""The red-team corpus (redteam.py) against the whole judge on the CPU (Triton interpreter), with
the static screen off so that each runtime defence is shown on its own. Every attack gets its
verdict; every honest-but-unusual kernel is accepted.

Attacks that only hide torch compute from the worker's own trace (``cpu_limit``) are accepted
here: the interpreter's verdicts are correctness only, and nothing outside the candidate's
process can tell torch from an interpreted kernel on the CPU. tests/test_verifier_gpu.py shows
the GPU audit rejecting them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import redteam as R
from kernforge.tasks.loader import load_task

# timer attacks are called cheats on a quiet host (conftest.quiet_host)
pytestmark = pytest.mark.usefixtures("quiet_host")

TASKS = Path(__file__).parent / "tasks"
CPU_ATTACKS = [a for a in R.ATTACKS if a.where in ("cpu", "both")]


@pytest.fixture(scope="module")
def runtime_judge(cpu_runtime_judge):
    return cpu_runtime_judge  # conftest's, shared with the other modules that only ask for verdicts


def _describe(v) -> str:
    return f"{v.status.value} #{v.threat} [{getattr(v, 'check', None)}]: {v.reason}"


def test_the_corpus_covers_every_class_three_times():
    for klass in range(1, 9):
        assert len([a for a in R.ATTACKS if a.klass == klass]) >= 3, klass
    assert len(R.HONEST) >= 4


@pytest.mark.parametrize("attack", CPU_ATTACKS, ids=[a.name for a in CPU_ATTACKS])
def test_attack_gets_its_verdict_on_the_interpreter(runtime_judge, attack):
    verdict = runtime_judge.verify(attack.source, load_task(TASKS / attack.task))
    got = (verdict.status.value, verdict.threat)
    if attack.cpu_limit:
        assert verdict.accepted, _describe(verdict)
        assert all(s.timing == "interpreter" for s in verdict.shapes)
        return
    assert got == attack.expect or got in attack.also, _describe(verdict)
    assert verdict.reason


@pytest.mark.parametrize("name, source, where", [h for h in R.HONEST if h[2] in ("cpu", "both")], ids=[h[0] for h in R.HONEST])
def test_unusual_honest_kernels_are_accepted(runtime_judge, name, source, where):
    verdict = runtime_judge.verify(source, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, _describe(verdict)
