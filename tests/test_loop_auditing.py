"""`kernforge archive audit` (loop/auditing.py): the archive's best attempts audited on a GPU, the best
first, until one passes. No GPU here: a stand-in judge gives the second verdicts, as in
test_loop_runner.py; without one, the command says clearly that auditing needs the GPU."""

from __future__ import annotations

import contextlib
import json
import sqlite3

import pytest
from typer.testing import CliRunner

from kernforge.archive import synthetic
from kernforge.archive.records import NewAttempt, TaskRecord
from kernforge.archive.store import Archive
from kernforge.cli import app
from kernforge.loop import auditing
from kernforge.tasks.loader import load_task
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status

runner = CliRunner()
H200, A100 = synthetic.H200, synthetic.A100
#: code -> GPU time recorded (compile at 200 us: scores 4.0, 2.5, 2.0)
RECORDED = {"k = 1": 50.0, "k = 2": 80.0, "k = 3": 100.0}


def gpu_accepted(time_us: float, env=H200) -> Accepted:
    return Accepted(shapes=(ShapeResult({"T": 4, "H": 4096}, False, "bfloat16", "graph", time_us=time_us,
                                        compile_us=200.0, eager_us=300.0),), environment=dict(env))


def said(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture
def db(tmp_path):
    """rms_norm (the built-in, as a run named it) with three accepted H200 kernels, none audited, and
    an interpreter kernel (never audited)."""
    path = tmp_path / "k.db"
    with Archive.create(path) as archive:
        task = archive.register_task(load_task("rms_norm"))
        run = archive.start_run({"task_refs": {"rms_norm": "rms_norm"}})
        for seq, (code, time_us) in enumerate(RECORDED.items()):
            archive.record_attempt(NewAttempt(run, seq, task, code, gpu_accepted(time_us), dict(H200)))
        cpu = Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter", time_us=900.0),),
                       environment=dict(synthetic.INTERPRETER))
        archive.record_attempt(NewAttempt(run, 3, task, "k = cpu", cpu, dict(synthetic.INTERPRETER)))
    return path


class StandInJudge:
    """The second verdict of each code, from ``again`` (a GPU time or a verdict)."""

    def __init__(self, again, env=H200):
        self.again, self.env, self.judged = again, env, []

    def verify(self, code, task, bar=None, audit=False):
        assert task.name == "rms_norm"
        self.judged.append(code)
        item = self.again[code]
        return gpu_accepted(item, self.env) if isinstance(item, float) else item

    def environment(self):
        return dict(self.env)


@pytest.fixture
def stand_in(monkeypatch):
    judges = []

    def install(again, env=H200):
        judge = StandInJudge(again, env)
        judges.append(judge)

        @contextlib.contextmanager
        def open_judge(device, **kw):
            assert device == "cuda:0"
            yield judge

        monkeypatch.setattr(auditing, "resolve_device", lambda gpu: "cuda:0")
        monkeypatch.setattr(auditing, "open_judge", open_judge)
        return judge

    return install


def audits(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT a.code, u.passed, u.run_id FROM audits u JOIN attempts a ON a.id = u.attempt_id"
                        " ORDER BY u.id").fetchall()
    conn.close()
    return rows


def test_without_a_gpu_it_says_auditing_needs_the_gpu_the_times_were_measured_on(db):
    result = runner.invoke(app, ["archive", "audit", "--db", str(db)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "auditing needs the GPU the times were measured on (NVIDIA H200); no GPU is visible here" in said(result)
    missing = runner.invoke(app, ["archive", "audit", "--db", str(db), "--gpu", "3"])
    assert missing.exit_code == 2 and "--gpu 3: no such GPU here" in said(missing)
    assert audits(db) == []


def test_the_best_first_until_one_passes(db, stand_in):
    slower, cheat = 80.0, Rejected(Status.CHEAT, "the output came from torch.nn.functional", threat=16)
    judge = stand_in({"k = 1": slower, "k = 2": 81.0, "k = 3": 100.0})
    result = runner.invoke(app, ["archive", "audit", "--db", str(db)])
    assert result.exit_code == 0, result.output
    # a time that did not hold is judged once more; stopped at the first that passed; the interpreter kernel never
    assert judge.judged == ["k = 1", "k = 1", "k = 2"]
    assert audits(db) == [("k = 1", 0, None), ("k = 2", 1, None)]  # no run made them
    text = said(result)
    assert "FAILED: its time did not hold" in text and "passed: accepted again" in text and "1 passed, 1 failed" in text
    with Archive.open(db, readonly=True) as archive:
        (best,) = archive.best()
        assert archive.get_attempt(best.attempt_id).code == "k = 2"

    # done: a second audit finds nothing to do, and needs no GPU for it
    again = runner.invoke(app, ["archive", "audit", "--db", str(db), "--json"])
    assert again.exit_code == 0 and "nothing to audit" in json.loads(again.output)["notes"][0]
    # a faster kernel arrives unaudited: audited on its own, and rejected when judged again
    with Archive.open(db) as archive:
        archive.record_attempt(NewAttempt(archive.start_run({}), 0, best.task_id, "k = 0", gpu_accepted(20.0), dict(H200)))
    stand_in({"k = 0": cheat})
    data = json.loads(runner.invoke(app, ["archive", "audit", "--db", str(db), "--task", "rms_norm", "--json"]).output)
    assert [(o["attempt_id"], o["audit"] and o["audit"]["audit"]["passed"]) for o in data["outcomes"]] == \
        [(5, False), (best.attempt_id, None)]  # demoted; the audited best stands
    assert "it was rejected" in data["outcomes"][0]["audit"]["audit"]["reason"]


def test_at_most_limit_audits_per_task(db, stand_in):
    stand_in({"k = 1": 500.0, "k = 2": 500.0, "k = 3": 500.0})
    report = auditing.audit_archive(db, limit=2)
    assert [o.audit.passed for o in report.outcomes] == [False, False]
    assert report.notes == ("rms_norm on NVIDIA H200: stopped after 2 audit(s) without a pass (--limit)",)
    assert [c for c, *_ in audits(db)] == ["k = 1", "k = 2"]


def test_only_on_the_gpu_model_the_times_were_measured_on(db, stand_in):
    stand_in({}, env=A100)
    result = runner.invoke(app, ["archive", "audit", "--db", str(db)])
    assert result.exit_code == 2
    assert "auditing needs the GPU the times were measured on: the attempts to audit were timed on NVIDIA H200, " \
           "and cuda:0 is NVIDIA A100-SXM4-80GB" in said(result)
    assert audits(db) == []


def test_attempts_judged_against_another_version_of_the_task_are_left(tmp_path, stand_in):
    path = tmp_path / "old.db"
    with Archive.create(path) as archive:
        old = archive.register_task(TaskRecord("rms_norm", "an-older-reference", {"name": "rms_norm"}))
        archive.record_attempt(NewAttempt(archive.start_run({}), 0, old, "k = 1", gpu_accepted(50.0), dict(H200)))
    judge = stand_in({})
    report = auditing.audit_archive(path)
    assert judge.judged == [] and report.outcomes == ()
    assert "judged against another version of the task" in report.notes[0]


def test_interpreter_only_archives_have_nothing_to_audit(tmp_path):
    path = tmp_path / "cpu.db"
    with Archive.create(path) as archive:
        task = archive.register_task(load_task("rms_norm"))
        cpu = Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter", time_us=900.0),),
                       environment=dict(synthetic.INTERPRETER))
        archive.record_attempt(NewAttempt(archive.start_run({}), 0, task, "k = cpu", cpu, dict(synthetic.INTERPRETER)))
    result = runner.invoke(app, ["archive", "audit", "--db", str(path)])
    assert result.exit_code == 0 and "nothing to audit: the archive holds no attempt verified on a GPU" in said(result)
    assert runner.invoke(app, ["archive", "audit", "--db", str(path), "--task", "softmax"]).exit_code == 2


def test_a_near_tie_of_the_audited_best_is_not_audited(tmp_path, stand_in):
    """Less than MIN_GAIN above the audited best is within the judge's noise: no run audits it, nor
    does this (a kernel clearly faster still is)."""
    from kernforge.archive.score import MIN_GAIN

    path = tmp_path / "ties.db"
    with Archive.create(path) as archive:
        task = archive.register_task(load_task("rms_norm"))
        run = archive.start_run({"task_refs": {"rms_norm": "rms_norm"}})
        best = archive.record_attempt(NewAttempt(run, 0, task, "k = 1", gpu_accepted(50.0), dict(H200)))
        archive.record_audit(best, synthetic.audit(archive.get_attempt(best).verdict))
        for seq, (code, time_us) in enumerate({"k = 2": 50.0 / (1 + MIN_GAIN / 2), "k = 3": 50.0 / (1 + MIN_GAIN / 4)}.items(), 1):
            archive.record_attempt(NewAttempt(run, seq, task, code, gpu_accepted(time_us), dict(H200)))
    judge = stand_in({})
    report = auditing.audit_archive(path)
    assert judge.judged == [] and report.outcomes == () and report.notes[0].startswith("nothing to audit")
    with Archive.open(path) as archive:
        archive.record_attempt(NewAttempt(archive.start_run({}), 0, archive.get_attempt(best).task_id, "k = 4",
                                          gpu_accepted(40.0), dict(H200)))
    judge = stand_in({"k = 4": 40.0})
    report = auditing.audit_archive(path)
    assert judge.judged == ["k = 4"] and [o.audit.passed for o in report.outcomes] == [True]
