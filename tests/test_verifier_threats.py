"""Every THREATS.md class that can be shown on the CPU: a cheating candidate is rejected with the
right status and class, by the static screen and, with the screen off, by the runtime defence
alone. Honest kernels are accepted (a false rejection is a bug too).

These run the whole judge: a sandboxed candidate worker under the Triton interpreter and a
trusted reference worker, on the small test tasks in tests/tasks/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import candidates as C
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeOptions

# timer attacks are called cheats on a quiet host (conftest.quiet_host)
pytestmark = pytest.mark.usefixtures("quiet_host")

TASKS = Path(__file__).parent / "tasks"
OPTIONS = JudgeOptions()


def task(name: str):
    return load_task(TASKS / ("kb_relu.py" if name == "kb_relu" else name))


@pytest.fixture(scope="module")
def judge(cpu_judge):
    return cpu_judge  # conftest's, shared with the other modules that only ask for verdicts


@pytest.fixture(scope="module")
def runtime_judge(cpu_runtime_judge):
    """The same judge with its static screen switched off: only runtime defences remain."""
    return cpu_runtime_judge


def _describe(verdict) -> str:
    return f"{verdict.status.value} #{verdict.threat}: {verdict.reason}"


@pytest.mark.parametrize("cheat", C.CHEATS, ids=[c.name for c in C.CHEATS])
def test_cheat_rejected_at_runtime(runtime_judge, cheat):
    verdict = runtime_judge.verify(cheat.source, task(cheat.task))
    assert not verdict.accepted, _describe(verdict)
    assert (verdict.status.value, verdict.threat) == (cheat.status, cheat.threat), _describe(verdict)
    assert verdict.reason


@pytest.mark.parametrize("name, source, task_name", C.INACCURATE, ids=[i[0] for i in C.INACCURATE])
def test_honest_but_inaccurate_kernels_are_incorrect_without_a_threat(runtime_judge, name, source, task_name):
    """Wrong by more than the tolerance, yet honest: no cheat may be named (#15 above all, whose
    errors look alike: a long float32 sum drifts by about a tf32 rounding)."""
    verdict = runtime_judge.verify(source, task(task_name))
    assert (verdict.status.value, verdict.threat) == ("incorrect", None), _describe(verdict)
    assert "lower precision" not in verdict.reason, _describe(verdict)


STATIC = [c for c in C.CHEATS if c.static_threat is not None]


@pytest.mark.parametrize("cheat", STATIC, ids=[c.name for c in STATIC])
def test_cheat_rejected_by_static_screen(judge, cheat):
    verdict = judge.verify(cheat.source, task(cheat.task))
    assert (verdict.status.value, verdict.threat) == ("static_rejected", cheat.static_threat), _describe(verdict)
    assert "line " in verdict.reason, "a static rejection names the line"


@pytest.mark.parametrize("name, source", [("tiny_norm", C.HONEST), ("kb_relu", C.HONEST_RELU)])
def test_honest_kernels_accepted(judge, name, source):
    verdict = judge.verify(source, task(name))
    assert verdict.accepted, _describe(verdict)
    shapes = {tuple(s.shape.items()) for s in verdict.shapes}
    public = {tuple(s.as_dict().items()) for s in task(name).cpu_public_shapes}
    assert public <= shapes, "every public shape is timed"
    assert all(s.timing == "interpreter" for s in verdict.shapes), "CPU timings are labelled as such"


def test_kernelbench_reference_copy_follows_task_policy(judge, tmp_path):
    """KernelBench's classic cheat, the reference pasted into ModelNew: rejected with a reason
    that matches the task's policy on torch ops."""
    forbidden = judge.verify(C.REFERENCE_COPY_RELU, task("kb_relu"))
    assert (forbidden.status.value, forbidden.threat) == ("static_rejected", 16), _describe(forbidden)
    assert "torch.relu" in forbidden.reason

    allowed_dir = tmp_path / "kb"
    allowed_dir.mkdir()
    (allowed_dir / "relu.py").write_text((TASKS / "kb_relu.py").read_text())
    (allowed_dir / "relu.meta.py").write_text("ALLOW_TORCH_OPS = True\n")
    allowed = judge.verify(C.REFERENCE_COPY_RELU, load_task(allowed_dir / "relu.py"))
    assert (allowed.status.value, allowed.threat) == ("cheat", 17), _describe(allowed)
    assert "no kernel of the candidate's" in allowed.reason


def test_compile_error_is_reported_with_the_message(judge):
    verdict = judge.verify(C.HONEST.replace("tl.sum(x * x, axis=0)", "tl.sum(x * x, axis=0) + undefined_name"), task("tiny_norm"))
    assert verdict.status.value in ("compile_error", "runtime_error"), _describe(verdict)
    assert "undefined_name" in verdict.reason or "undefined_name" in str(verdict.evidence)


def test_verdict_round_trips_through_json(judge):
    from kernforge.verifier.verdict import verdict_from_dict

    verdict = judge.verify(C.HONEST, task("tiny_norm"))
    again = verdict_from_dict(verdict.to_dict())
    assert again.to_dict() == verdict.to_dict()


def test_a_slow_reference_does_not_make_an_honest_kernel_a_liar(judge, tmp_path):
    """The trusted clock of a checked call covers the candidate's call alone: the reference
    worker preparing the next call (drawing its inputs, running a slow reference) is the
    judge's own time, and never counts against the candidate's reported time (THREATS #8)."""
    slow = tmp_path / "slow_norm"
    shutil.copytree(TASKS / "tiny_norm", slow)
    reference = slow / "reference.py"
    reference.write_text(reference.read_text().replace("        xf = x.float()", "        __import__('time').sleep(0.1)\n        xf = x.float()"))
    verdict = judge.verify(C.HONEST, load_task(slow))
    assert verdict.accepted, _describe(verdict)
