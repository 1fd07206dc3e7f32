"""The data `kernforge report` draws: checked against the archive's own queries and plain SQL."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest
from report_helpers import TASKS, make_archive

from kernforge.archive import schema, synthetic
from kernforge.archive.errors import ArchiveError
from kernforge.archive.html_report_data import BASELINES, GPU_BUSY_NOT_RECORDED, ReportData, report_data
from kernforge.archive.score import GPU_TIMINGS, geomean
from kernforge.archive.store import Archive
from kernforge.verifier import revision


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_archive(tmp_path_factory.mktemp("report") / "k.db")


@pytest.fixture(scope="module")
def data(db) -> ReportData:
    with Archive.open(db, readonly=True) as archive:
        return report_data(archive)


def _gpu_times(archive: Archive, attempt_id: int) -> list[float]:
    return [t for (t,) in archive.conn.execute(
        "SELECT time_us FROM measurements WHERE attempt_id = ? AND timing IN ('graph', 'eager') AND time_us > 0",
        (attempt_id,))]


def test_the_best_of_each_task_and_gpu_is_what_archive_best_says(db, data):
    with Archive.open(db, readonly=True) as archive:
        expected = {(b.task_id, b.gpu): b for b in archive.best()}
    found = {(t.task_id, g.gpu): g for t in data.tasks for g in t.gpus if g.best}
    assert expected and found.keys() == expected.keys()
    for key, section in found.items():
        assert section.best.attempt_id == expected[key].attempt_id
        assert section.best.score == pytest.approx(expected[key].score)
        assert section.best.audit == "passed"


def test_points_are_the_accepted_gpu_timed_evaluations_with_their_geomean_time(db, data):
    with Archive.open(db, readonly=True) as archive:
        expected = {r[0]: r for r in archive.conn.execute(
            "SELECT id, gpu, task_id FROM attempts WHERE accepted = 1 AND reuse_of IS NULL AND gpu != 'cpu'")}
        points = {p.attempt_id: (t.task_id, g.gpu, p) for t in data.tasks for g in t.gpus for p in g.points}
        assert points.keys() == expected.keys()
        for attempt_id, (task_id, gpu, point) in points.items():
            assert (task_id, gpu) == (expected[attempt_id][2], expected[attempt_id][1])
            assert point.time_us == pytest.approx(geomean(_gpu_times(archive, attempt_id)))
            audits = archive.audits(attempt_id)
            assert point.audit == ("not audited" if not audits else "passed" if audits[-1].passed else "failed")
    for t in data.tasks:
        for g in t.gpus:
            assert [p.n for p in g.points] == sorted(p.n for p in g.points)
            assert all(1 <= p.n <= t.counts.attempts for p in g.points)


def test_the_running_best_is_the_best_audited_attempt_so_far(data):
    checked = 0
    for t in data.tasks:
        for g in t.gpus:
            best = None
            for p in g.points:
                if p.audit == "passed" and p.score is not None and (best is None or p.score > best.score):
                    best = p
                assert p.best_us == (best.time_us if best else None)
                checked += best is not None
            assert g.best == best
            if best:
                assert g.points[-1].best_us == best.time_us
    assert checked


def test_a_demoted_attempt_is_a_point_but_never_the_best(tmp_path):
    path = tmp_path / "k.db"
    rng = random.Random(3)
    with Archive.create(path) as archive:
        run = archive.start_run({})
        task = archive.register_task(synthetic.task_record("rms_norm"))
        ids, items = [], []
        while len(ids) < 3:
            item = synthetic.attempt(rng, run, len(items), task, "rms_norm", len(items))
            items.append(item)
            attempt_id = archive.record_attempt(item)
            if item.verdict.accepted:
                ids.append(attempt_id)
        verdicts = {i: archive.get_attempt(i) for i in ids}
        top = max(ids, key=lambda i: verdicts[i].score)
        for i in ids:  # the highest score fails its audit; the others pass
            archive.record_audit(i, synthetic.audit(verdicts[i].verdict, ratio=1.5 if i == top else 1.0))
        data = report_data(archive)
        section = data.tasks[0].gpus[0]
        assert {p.attempt_id: p.audit for p in section.points}[top] == "failed"
        assert section.best is not None and section.best.attempt_id != top
        assert section.audits_failed == 1 and section.audits_passed == 2
        archive.record_audit(top, synthetic.audit(verdicts[top].verdict, ratio=1.0))  # audited again: passes
        assert report_data(archive).tasks[0].gpus[0].best.attempt_id == top


def test_counts_by_status_and_threat_match_the_attempts(db, data):
    with Archive.open(db, readonly=True) as archive:
        stats = {s.key: s for s in archive.stats().per_task}
        for t in data.tasks:
            rows = archive.conn.execute("SELECT status, threat, count(*) FROM attempts WHERE task_id = ?"
                                        " GROUP BY status, threat", (t.task_id,)).fetchall()
            by_status: dict[str, int] = {}
            for status, _, n in rows:
                by_status[status] = by_status.get(status, 0) + n
            assert dict(t.counts.by_status) == by_status
            assert dict(t.counts.by_threat) == {threat: n for _, threat, n in rows if threat}
            tallied = stats[t.task]  # the tallies the loop keeps: the same numbers another way
            assert (t.counts.attempts, t.counts.accepted, t.counts.reused) == (
                tallied.attempts, tallied.accepted, tallied.reused)
            assert (t.counts.tokens_in, t.counts.tokens_out) == (tallied.tokens_in, tallied.tokens_out)
            assert t.counts.cost_usd == pytest.approx(tallied.cost_usd)
    assert {t.task for t in data.tasks} == set(TASKS)
    assert data.totals.attempts == 80 and sum(c.attempts for c in data.per_model) == 80
    assert any(t.counts.reused for t in data.tasks) and any(t.counts.by_threat for t in data.tasks)


def test_the_best_shapes_hold_its_measurements_and_baselines(db, data):
    with Archive.open(db, readonly=True) as archive:
        for t in data.tasks:
            for g in t.gpus:
                if not g.best:
                    continue
                recorded = archive.get_attempt(g.best.attempt_id).verdict.shapes
                assert [s.label for s in g.shapes] == [s.label for s in recorded]
                for row, s in zip(g.shapes, recorded):
                    assert row.time_us == s.time_us and row.timing in GPU_TIMINGS
                    assert row.baselines == {"eager": s.eager_us, "compile": s.compile_us, "library": s.library_us}
                    assert row.speedup("compile") == pytest.approx(s.compile_us / s.time_us)
                    assert row.pct_roofline == pytest.approx(100 * s.floor_us / s.time_us)
                assert g.best.time_us == pytest.approx(geomean(s.time_us for s in recorded))


def test_the_lineage_of_each_best_is_its_parent_chain(db, data):
    with Archive.open(db, readonly=True) as archive:
        sections = [g for t in data.tasks for g in t.gpus if g.best]
        assert sections
        for g in sections:
            chain = archive.lineage(g.best.attempt_id)
            assert [s.attempt_id for s in g.lineage] == [c.id for c in chain]
            assert g.lineage[-1].attempt_id == g.best.attempt_id and g.lineage[0].parent_id is None
            for step, parent in zip(g.lineage[1:], g.lineage):
                assert step.parent_id == parent.attempt_id
            assert {s.run_id for s in g.lineage} <= {r.id for r in data.runs}
            assert g.lineage[-1].time_us == pytest.approx(g.best.time_us)


def test_one_run_holds_only_its_own_attempts(db):
    with Archive.open(db, readonly=True) as archive:
        data = report_data(archive, run_id=2)
        own = {r[0] for r in archive.conn.execute("SELECT id FROM attempts WHERE run_id = 2")}
        with pytest.raises(ArchiveError, match=r"no run 9 in .*\(runs: 1, 2\)"):
            report_data(archive, run_id=9)
    assert data.scope == "run 2" and [r.id for r in data.runs] == [2]
    assert data.totals.attempts == len(own) == 40
    points = [p for t in data.tasks for g in t.gpus for p in g.points]
    assert points and {p.attempt_id for p in points} <= own and {p.run_id for p in points} == {2}
    assert all(g.best.attempt_id in own for t in data.tasks for g in t.gpus if g.best)


def test_an_interpreter_only_archive_has_no_timed_results(tmp_path):
    path = make_archive(tmp_path / "cpu.db", runs=1, environment=synthetic.INTERPRETER)
    with Archive.open(path, readonly=True) as archive:
        data = report_data(archive)
    assert not data.timed and all(not t.gpus for t in data.tasks)
    assert sum(t.interpreter_accepted for t in data.tasks) > 0  # accepted, correct, but never timed


def test_a_library_baseline_column_slots_in(tmp_path, monkeypatch):
    """An archive from before schema v4 has no library column: read as it is, the page names the
    baseline as not recorded; the migration adds the column and the page shows what it holds."""
    path = tmp_path / "lib.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:3])
    monkeypatch.setattr(schema, "LATEST", 3)
    make_archive(path, runs=1)
    monkeypatch.undo()
    with Archive.open(path, readonly=True) as archive:
        assert [b.key for b in report_data(archive).missing_baselines] == ["library"]
    with Archive.open(path) as archive:  # a writer migrates
        assert schema.version(archive.db) == schema.LATEST
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE measurements SET library_us = compile_us * 0.9")
        # its audits were made before judges were fingerprinted: as if audited again by this one
        conn.execute("UPDATE audits SET judge = ?", (revision.fingerprint(),))
    with Archive.open(path, readonly=True) as archive:
        data = report_data(archive)
    assert [b.key for b in data.baselines] == [b.key for b in BASELINES] and not data.missing_baselines
    shapes = [s for t in data.tasks for g in t.gpus for s in g.shapes]
    assert shapes and all(s.baselines["library"] == pytest.approx(0.9 * s.baselines["compile"]) for s in shapes)


def test_what_the_archive_does_not_record_is_named_not_invented(data):
    assert GPU_BUSY_NOT_RECORDED in data.not_recorded and "not recorded" in GPU_BUSY_NOT_RECORDED
    assert all(r.wall_s is not None and r.wall_s >= 0 for r in data.runs)


def test_report_data_round_trips_through_json(data):
    assert ReportData.from_dict(json.loads(json.dumps(data.to_dict()))) == data
