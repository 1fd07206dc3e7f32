"""Baseline sanity (archive/score.py ``slow_baselines``): a baseline more than 20x slower than the
roofline floor at the task's largest timed shape is marked in `kernforge archive best` and in
`kernforge tasks show`, with a line that says why."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernforge.archive import synthetic
from kernforge.archive.records import NewAttempt, TaskRecord
from kernforge.archive.score import SLOW_BASELINE_FACTOR, slow_baselines
from kernforge.archive.store import Archive
from kernforge.cli import app
from kernforge.tasks.loader import load_task
from kernforge.verifier.verdict import Accepted, ShapeResult

cli = CliRunner()


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables unwrapped, so their cells can be asserted


def shape(t: int, floor_us: float, eager_us: float, compile_us: float, timing: str = "graph", time_us: float = 0.0):
    return ShapeResult({"T": t, "H": 4096}, False, "bfloat16", timing, time_us=time_us or floor_us * 1.5,
                       eager_us=eager_us, compile_us=compile_us, floor_us=floor_us)


@pytest.mark.parametrize("eager_x, compile_x, flagged", [
    (25.0, 3.0, ["eager"]), (30.0, 21.0, ["eager", "compile"]), (SLOW_BASELINE_FACTOR, 1.2, []), (8.0, 2.0, []),
])
def test_the_baselines_at_the_largest_floor_are_judged(eager_x, compile_x, flagged):
    shapes = [shape(1, 0.01, 12.0, 2.0),  # launch-bound: 1000x its floor, rightly never flagged
              shape(4096, 100.0, 100.0 * eager_x, 100.0 * compile_x),
              shape(64, 2.0, 500.0, 500.0)]
    slow = slow_baselines(shapes)
    assert [s.baseline for s in slow] == flagged
    for s in slow:
        assert s.label == "T=4096 H=4096" and s.floor_us == 100.0
        assert f"{s.factor:.0f}x the roofline floor at T=4096 H=4096" in s.line()


def test_interpreter_times_and_shapes_without_a_floor_are_never_judged():
    assert slow_baselines([shape(4096, 100.0, 1e6, 1e6, timing="interpreter")]) == []
    assert slow_baselines([shape(4096, 0.0, 1e6, 1e6)]) == []


def _archive(path, eager_x: float):
    """rms_norm (its real version) with one audited accepted H200 attempt whose eager baseline is
    ``eager_x`` times the floor at the largest shape."""
    task = load_task("rms_norm")
    verdict = Accepted(shapes=(shape(1, 0.01, 12.0, 2.0, time_us=1.5),
                               shape(16384, 100.0, 100.0 * eager_x, 180.0, time_us=120.0)),
                       environment=dict(synthetic.H200))
    with Archive.create(path) as archive:
        task_id = archive.register_task(TaskRecord.from_task(task))
        run = archive.start_run({})
        attempt = archive.record_attempt(NewAttempt(run_id=run, seq=0, task_id=task_id, code="# k\n", verdict=verdict,
                                                    environment=dict(synthetic.H200)))
        archive.record_audit(attempt, synthetic.audit(verdict), run_id=run)
        archive.finish_run(run)
    return path


def test_archive_best_marks_a_slow_baseline_and_says_why(tmp_path):
    db = _archive(tmp_path / "k.db", eager_x=40.0)
    result = cli.invoke(app, ["archive", "best", "--db", str(db)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "rms_norm" in line and "NVIDIA H200" in line)
    assert " !" in row  # the x eager cell
    assert ("rms_norm on NVIDIA H200: ! eager baseline is 40x the roofline floor at T=16384 H=4096 "
            "(4000.0 us vs 100.0 us; more than 20x)") in result.output
    assert "compile baseline is" not in result.output  # 1.8x the floor: fine


def test_archive_best_has_no_mark_when_the_baselines_are_sane(tmp_path):
    db = _archive(tmp_path / "k.db", eager_x=10.0)
    result = cli.invoke(app, ["archive", "best", "--db", str(db)])
    assert result.exit_code == 0 and "baseline is" not in result.output and " !" not in result.output


def test_tasks_show_lists_the_measured_baselines_and_flags_a_slow_one(tmp_path):
    db = _archive(tmp_path / "k.db", eager_x=40.0)
    result = cli.invoke(app, ["tasks", "show", "rms_norm", "--db", str(db)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "## Baselines measured" in text and "- NVIDIA H200, T=16384 H=4096: eager 4.00 ms" in text
    assert "! eager baseline is 40x the roofline floor" in text
    data = json.loads(cli.invoke(app, ["tasks", "show", "rms_norm", "--db", str(db), "--json"]).output)
    assert data["baselines"][0]["gpu"] == "NVIDIA H200" and data["baselines"][0]["slow"][0].startswith("! eager")


def test_tasks_show_without_an_archive_says_none_is_measured(tmp_path):
    result = cli.invoke(app, ["tasks", "show", "rms_norm", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 0 and "## Baselines: none measured" in result.output
    assert not (tmp_path / "none.db").exists()
