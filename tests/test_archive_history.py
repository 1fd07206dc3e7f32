"""archive/history.py: the light rows the loop learns from (lessons, bandit, resumed budgets).

A row's ``time_us`` counts GPU timings only (interpreter times never rank anything), and its
``check`` and ``evidence`` are what a live verdict's are, so lessons classify both alike.
"""

from __future__ import annotations

import pytest

from kernforge.archive import synthetic
from kernforge.archive.history import run_history, task_history
from kernforge.archive.records import NewAttempt
from kernforge.archive.store import Archive
from kernforge.verifier.checks import Check
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status


def shape(t: int, time_us: float, timing: str) -> ShapeResult:
    return ShapeResult({"T": t}, False, "float32", timing, time_us=time_us)


@pytest.fixture
def archive(tmp_path):
    with Archive.create(tmp_path / "k.db") as opened:
        yield opened


def record(archive, verdicts):
    task = archive.register_task(synthetic.task_record("rms_norm"))
    run = archive.start_run({})
    for seq, (verdict, env) in enumerate(verdicts):
        archive.record_attempt(NewAttempt(run, seq, task, f"k = {seq}", verdict, dict(env)))
    return task, run


def test_time_us_is_the_gpu_geomean_and_none_on_the_interpreter(archive):
    gpu = Accepted(shapes=(shape(1, 10.0, "graph"), shape(2, 40.0, "eager")))
    cpu = Accepted(shapes=(shape(1, 10.0, "interpreter"), shape(2, 40.0, "interpreter")))
    task, _ = record(archive, [(gpu, synthetic.H200), (cpu, synthetic.INTERPRETER)])
    on_gpu, on_cpu = task_history(archive, task)
    assert on_gpu.time_us == pytest.approx(20.0) and on_gpu.gpu == "NVIDIA H200"
    assert on_cpu.accepted and on_cpu.time_us is None and on_cpu.score is None  # correctness only: nothing to rank


def test_check_and_the_evidence_lessons_read_come_back(archive):
    error = "Traceback\n" + "  frame\n" * 600 + "NameError: name 'tl' is not defined"
    verdicts = [
        Rejected(Status.COMPILE_ERROR, "compiling failed", check=Check.COMPILE, evidence={"error": error, "while": "x"}),
        Rejected(Status.STATIC_REJECTED, "line 1: syntax error", check=Check.STATIC_SCREEN,
                 evidence={"findings": [{"rule": "syntax", "line": 1}, {"rule": "exec", "line": 2}]}),
        Rejected(Status.COMPILE_ERROR, "no module (truncated)", check=Check.EXTRACTION, evidence={"kind": "truncated"}),
    ]
    task, run = record(archive, [(v, synthetic.INTERPRETER) for v in verdicts])
    compiled, screened, extracted = task_history(archive, task)
    assert compiled.check == "compile" and compiled.evidence["error"].endswith("is not defined")
    assert len(compiled.evidence["error"]) == 2000 and "while" not in compiled.evidence
    assert screened.check == "static screen" and screened.evidence == {"findings": [{"rule": "syntax", "line": 1}]}
    assert extracted.check == "extraction" and extracted.evidence == {"kind": "truncated"}
    assert [r.check for r in run_history(archive, run)] == ["compile", "static screen", "extraction"]


def test_a_rejection_after_a_hidden_shape_comes_back_as_that_and_nothing_it_said(archive):
    """Replayed at a run's start (or a resume), it is the one lesson "failed at a hidden shape" it
    was when the run made it. Before, the row kept the error and dropped the mark: a later run's
    lesson quoted `unsupported shape rows_3_cols_9_6_` (red team: the hidden T=3, H=96)."""
    from kernforge.loop.lessons import AFTER_HIDDEN, Failure, Lessons
    from kernforge.verifier.verdict import SAW_HIDDEN

    said = "RuntimeError: unsupported shape rows_3_cols_9_6_"
    verdicts = [Rejected(Status.RUNTIME_ERROR, f"running failed: {said}", check=Check.RUNTIME,
                         evidence={"error": said, SAW_HIDDEN: True, "hidden": True}) for _ in range(2)]
    task, run = record(archive, [(v, synthetic.INTERPRETER) for v in verdicts])
    rows = task_history(archive, task)
    assert [r.evidence for r in rows] == [{SAW_HIDDEN: True}] * 2
    assert [Failure.of_row(r).key[0] for r in rows] == [AFTER_HIDDEN] * 2
    lessons = Lessons()
    lessons.replay(rows)
    assert lessons.current() and not any("rows_" in text for text in lessons.current())
