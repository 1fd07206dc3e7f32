"""Which judge made a verdict or an audit (verifier/revision.py): a verdict is reused only by the
judge that made it, and only an audit by the installed judge makes a best, a per-shape best or an
export; a best audited by an earlier judge waits for an audit again, and says so."""

from __future__ import annotations

import shutil
from pathlib import Path

from kernforge.archive import synthetic
from kernforge.archive.content import environment_key
from kernforge.archive.records import NewAttempt
from kernforge.archive.report import audit_text, awaiting_lines
from kernforge.archive.store import Archive
from kernforge.verifier import revision
from kernforge.verifier.environment import describe
from kernforge.verifier.verdict import Accepted, ShapeResult

H200 = {"gpu": "NVIDIA H200", "driver": "570.1", "cuda": "12.8", "torch": "2.11.0", "triton": "3.6.0",
        "judge": revision.fingerprint()}
EARLIER = "0123456789abcdef"


def _accepted(time_us: float, env=H200) -> Accepted:
    return Accepted(shapes=(ShapeResult(shape={"T": 8}, hidden=False, dtype="bfloat16", timing="graph", time_us=time_us,
                                        compile_us=100.0, eager_us=200.0),), environment=dict(env))


def _by_earlier_judge(archive: Archive, audit_id: int) -> None:
    with archive._write():
        archive.conn.execute("UPDATE audits SET judge = ? WHERE id = ?", (EARLIER, audit_id))


def test_every_verdict_names_its_judge_and_a_changed_judge_is_another_environment():
    assert revision.FORMAT.fullmatch(describe("cpu")["judge"])
    assert describe("cpu")["judge"] == revision.fingerprint()
    assert environment_key(H200) != environment_key(dict(H200, judge=EARLIER))
    # a verdict from before judges were fingerprinted keeps the key it was stored under
    before = {k: v for k, v in H200.items() if k != "judge"}
    assert environment_key(before) == environment_key(dict(before, judge=None))


def test_doctor_names_the_installed_judge():
    from kernforge.loop import doctor

    assert revision.fingerprint() in doctor._judge().detail


def test_how_a_judge_judges_is_keyed_beside_its_code():
    """The sandbox it found (a machine without namespaces runs candidates unconfined), its options
    (the screen off, hidden shapes untimed) and the Python that parses a candidate: a verdict made
    one way is never reused by a judge working another."""
    base = dict(H200, python="3.11.7", sandbox="process/bwrap", judged_with="screen=on time_hidden=audit time_shapes=all")
    for field, other in (("sandbox", "process/none"), ("judged_with", "screen=off time_hidden=audit time_shapes=all"),
                         ("python", "3.12.1")):
        assert environment_key(base) != environment_key(dict(base, **{field: other})), field


def test_the_same_code_under_another_judge_is_judged_again(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        archive.record_attempt(NewAttempt(run, 0, task, "k = 1", _accepted(50.0, dict(H200, judge=EARLIER)),
                                          dict(H200, judge=EARLIER)))
        assert archive.lookup(task, "k = 1", dict(H200, judge=EARLIER)) is not None
        assert archive.lookup(task, "k = 1", H200) is None
        # and its second evaluation is stored beside the first, not refused as a duplicate
        archive.record_attempt(NewAttempt(run, 1, task, "k = 1", _accepted(60.0), dict(H200)))
        assert archive.lookup(task, "k = 1", H200).verdict.shapes[0].time_us == 60.0


def test_only_an_audit_by_the_installed_judge_makes_a_best(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        fast = archive.record_attempt(NewAttempt(run, 0, task, "k = 1", _accepted(25.0), dict(H200)))
        slow = archive.record_attempt(NewAttempt(run, 1, task, "k = 2", _accepted(50.0), dict(H200)))
        for attempt in (fast, slow):
            record = archive.record_audit(attempt, synthetic.audit(archive.get_attempt(attempt).verdict))
            assert record.judge == revision.fingerprint() and record.current
        assert [b.attempt_id for b in archive.best()] == [fast]

        _by_earlier_judge(archive, archive.audits(fast)[-1].id)  # the fast one's audit: an earlier judge's
        assert [b.attempt_id for b in archive.best()] == [slow]
        assert [s.attempt_id for s in archive.best_per_shape()] == [slow]
        assert archive.get_attempt(fast).audit_passed is None  # the loop audits it again, as a leftover
        record = archive.get_attempt(fast)
        shown = audit_text(record, archive.audits(fast)).plain
        assert "by an earlier judge: counts no more" in shown and "no audit by this judge" in shown

        _by_earlier_judge(archive, archive.audits(slow)[-1].id)
        assert archive.best() == []
        (waiting,) = archive.awaiting_audit()
        assert (waiting.accepted, waiting.audited, waiting.earlier) == (2, 0, 2)
        assert "2 passed an audit by an earlier version of the judge" in awaiting_lines([waiting])

        archive.record_audit(fast, synthetic.audit(archive.get_attempt(fast).verdict))  # audited again, now
        assert [b.attempt_id for b in archive.best()] == [fast] and archive.awaiting_audit() == []


def test_an_archive_from_before_fingerprints_has_every_best_audited_again(tmp_path):
    """An older archive's audits carry no judge: after the migration none of them counts."""
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        attempt = archive.record_attempt(NewAttempt(run, 0, task, "k = 1", _accepted(25.0), dict(H200)))
        archive.record_audit(attempt, synthetic.audit(archive.get_attempt(attempt).verdict))
        with archive._write():
            archive.conn.execute("UPDATE audits SET judge = NULL")
        assert archive.best() == []
        assert archive.awaiting_audit()[0].earlier == 1


def test_the_fingerprint_follows_the_judges_source_and_only_it(tmp_path):
    root = Path(revision.__file__).resolve().parents[1]
    copy = tmp_path / "kernforge"
    for part in ("verifier", "sandbox", "tasks", "loop"):
        shutil.copytree(root / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    assert revision.fingerprint_of(copy) == revision.fingerprint()
    (copy / "verifier" / "core").write_bytes(b"\0" * 64)  # a stray file no install holds
    assert revision.fingerprint_of(copy) == revision.fingerprint()
    assembly = copy / "loop" / "evaluate.py"  # the judge's workers' specs: hidden paths, fork
    assembly.write_text(assembly.read_text() + "\n")
    assert revision.fingerprint_of(copy) != revision.fingerprint()
    assembly.write_text(assembly.read_text()[:-1])
    builtin = next(p for p in (copy / "tasks" / "builtin").rglob("*.py"))
    builtin.write_text(builtin.read_text() + "\n# a built-in task's version is its own source's\n")
    assert revision.fingerprint_of(copy) == revision.fingerprint()
    rule = copy / "verifier" / "defences" / "values.py"
    rule.write_text(rule.read_text().replace("\n", "\n\n", 1))
    assert revision.fingerprint_of(copy) != revision.fingerprint()


def test_on_the_cpu_only_this_judges_verdicts_make_the_population(tmp_path):
    """No audit confirms an interpreter verdict: an earlier judge's acceptance would be the run's
    best and its parent on a resume. Asked with the run's environment key, the population holds
    only this judge's verdicts."""
    cpu = {"gpu": None, "device": "cpu", "torch": "2.13.0", "triton": "3.6.0", "judge": revision.fingerprint()}
    shapes = (ShapeResult(shape={"T": 8}, hidden=False, dtype="float32", timing="interpreter", time_us=5.0),)
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        for seq, judge in enumerate((EARLIER, revision.fingerprint())):
            env = dict(cpu, judge=judge)
            archive.record_attempt(NewAttempt(run, seq, task, f"k = {seq}", Accepted(shapes=shapes, environment=env), env))
        mine = archive.population(task, "cpu", env_key=environment_key(cpu))
        assert [a.code for a in mine.recent] == ["k = 1"]
        assert len(archive.population(task, "cpu").recent) == 2


def test_show_says_an_unaudited_kernel_within_the_judges_noise_of_the_best_is_a_near_tie(tmp_path):
    """No run audits a kernel less than MIN_GAIN fitter than the audited best (loop/search.py):
    `archive show` says so, where it would otherwise only say that it was never audited."""
    from kernforge.archive.report import show_json
    from kernforge.archive.score import MIN_GAIN

    with Archive.create(tmp_path / "a.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        best = archive.record_attempt(NewAttempt(run, 0, task, "k = 1", _accepted(50.0), dict(H200)))
        archive.record_audit(best, synthetic.audit(archive.get_attempt(best).verdict))
        tie = archive.record_attempt(NewAttempt(run, 1, task, "k = 2", _accepted(50.0 / (1 + MIN_GAIN / 2)), dict(H200)))
        ahead = archive.record_attempt(NewAttempt(run, 2, task, "k = 3", _accepted(50.0 / (1 + 3 * MIN_GAIN)), dict(H200)))
        slower = archive.record_attempt(NewAttempt(run, 3, task, "k = 4", _accepted(60.0), dict(H200)))
        assert archive.best_for(archive.get_attempt(tie)).attempt_id == best
        said = {i: audit_text(archive.get_attempt(i), archive.audits(i), archive.best_for(archive.get_attempt(i))).plain
                for i in (best, tie, ahead, slower)}
        assert said[tie].startswith(f"not audited: a near-tie with the best, attempt {best}") and "2%" in said[tie]
        for i in (ahead, slower):
            assert said[i].startswith("not audited: never a best until an audit passes"), said[i]
        assert "passed" in said[best]
        record = archive.get_attempt(tie)
        assert show_json(record, [], 0, [], archive.best_for(record))["near_tie_of"] == best
        assert show_json(archive.get_attempt(ahead), [], 0, [], archive.best_for(archive.get_attempt(ahead)))["near_tie_of"] is None
        # a CPU attempt (no GPU model) has no best to be near
        cpu = archive.record_attempt(NewAttempt(run, 4, task, "k = 5", _accepted(1.0, env={}), {}))
        assert archive.best_for(archive.get_attempt(cpu)) is None
