"""The archive store: opening, schema and migrations, content addressing, idempotent one-transaction writes."""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import replace

import pytest
import sqlite_utils

from kernforge.archive import schema, store, synthetic
from kernforge.archive.content import code_hash, environment_key, normalize_code
from kernforge.archive.errors import ArchiveError, ConflictError, ReadOnlyError
from kernforge.archive.records import AttemptRecord, NewAttempt, RunStatus, TaskRecord
from kernforge.archive.store import Archive
from kernforge.verifier.checks import Check
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status

H200 = synthetic.H200
A100 = synthetic.A100


def timed(t: int, time_us: float, compile_us: float = 20.0, eager_us: float = 40.0, timing: str = "graph") -> ShapeResult:
    return ShapeResult(shape={"T": t, "H": 4096}, hidden=False, dtype="bfloat16", timing=timing, time_us=time_us,
                       compile_us=compile_us, eager_us=eager_us, speedup_compile=compile_us / time_us,
                       speedup_eager=eager_us / time_us, floor_us=time_us / 4)


def accepted(*times: float, env=H200) -> Accepted:
    return Accepted(shapes=tuple(timed(2**i, t) for i, t in enumerate(times)), environment=dict(env))


@pytest.fixture
def archive(tmp_path):
    with Archive.create(tmp_path / "k.db") as opened:
        yield opened


@pytest.fixture
def ids(archive):
    return archive.register_task(synthetic.task_record("rms_norm")), archive.start_run({"model": "m"})


def new(ids, seq, code, verdict, **kw) -> NewAttempt:
    task_id, run_id = ids
    return NewAttempt(run_id=run_id, seq=seq, task_id=task_id, code=code, verdict=verdict, **kw)


def counts(archive) -> dict[str, int]:
    return {t: archive.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("attempts", "measurements", "tallies", "environments")}


# ---- opening --------------------------------------------------------------------------------
def test_create_sets_up_wal_schema_and_indexes(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        db = archive.db
        assert db.journal_mode == "wal"
        assert schema.version(db) == schema.LATEST
        assert set(schema.OUR_TABLES) <= set(db.table_names())
        assert archive.conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
        assert db["attempts"].detect_fts() == "attempts_fts"
        indexes = {i.name for i in db["attempts"].indexes} | {i.name for i in db["measurements"].indexes}
        assert {"attempts_content", "attempts_ranked", "measurements_ranked", "idx_attempts_run_id_seq"} <= indexes


def test_create_twice_opens_the_same_archive(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        run = archive.start_run({})
    with Archive.create(tmp_path / "k.db") as archive:
        assert archive.run_status(run).run.status == "running"
    with pytest.raises(ArchiveError, match="already exists"):
        Archive.create(tmp_path / "k.db", exist_ok=False)


def test_open_missing_file_is_an_error_and_creates_nothing(tmp_path):
    for readonly in (False, True):
        with pytest.raises(ArchiveError, match="no archive at"):
            Archive.open(tmp_path / "nope.db", readonly=readonly)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    (b"this is not sqlite at all" * 200, "not a kernforge archive or is corrupt"),
    (b"", "empty file"),
])
def test_open_junk_or_empty_file(tmp_path, content, message):
    path = tmp_path / "junk.db"
    path.write_bytes(content)
    for readonly in (False, True):
        with pytest.raises(ArchiveError, match=message):
            Archive.open(path, readonly=readonly)
    assert path.read_bytes() == content


def test_open_foreign_sqlite_file(tmp_path):
    path = tmp_path / "other.db"
    sqlite_utils.Database(path)["dogs"].insert({"name": "Cleo"})
    with pytest.raises(ArchiveError, match="not a kernforge archive"):
        Archive.open(path)


def test_open_newer_schema_is_refused(tmp_path):
    Archive.create(tmp_path / "k.db").close()
    conn = sqlite3.connect(tmp_path / "k.db")
    conn.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    conn.close()
    with pytest.raises(ArchiveError, match="newer than this kernforge"):
        Archive.open(tmp_path / "k.db")


def _v2_add_note(db):
    db["runs"].add_column("note", str)


def test_pending_migration_runs_on_writable_open_only(tmp_path, monkeypatch):
    Archive.create(tmp_path / "k.db").close()
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS + (_v2_add_note,))
    monkeypatch.setattr(schema, "LATEST", len(schema.MIGRATIONS))
    with pytest.raises(ArchiveError, match="archive migrate"):
        Archive.open(tmp_path / "k.db", readonly=True)
    with Archive.open(tmp_path / "k.db") as archive:
        assert schema.version(archive.db) == schema.LATEST
        assert "note" in archive.db["runs"].columns_dict
    with Archive.open(tmp_path / "k.db", readonly=True) as archive:
        assert archive.runs() == []


def test_failed_migration_leaves_the_previous_version(tmp_path, monkeypatch):
    Archive.create(tmp_path / "k.db").close()

    def broken(db):
        db["half_done"].create({"id": int}, pk="id")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS + (broken,))
    monkeypatch.setattr(schema, "LATEST", len(schema.MIGRATIONS))
    with pytest.raises(RuntimeError, match="migration bug"):
        Archive.open(tmp_path / "k.db")
    db = sqlite_utils.Database(tmp_path / "k.db")
    assert schema.version(db) == schema.LATEST - 1
    assert "half_done" not in db.table_names()


def test_readonly_archive_refuses_writes(tmp_path):
    Archive.create(tmp_path / "k.db").close()
    with Archive.open(tmp_path / "k.db", readonly=True) as archive:
        with pytest.raises(ReadOnlyError):
            archive.start_run({})


# ---- content addressing ---------------------------------------------------------------------
SAME = [
    ("x = 1\n", "x=1"),
    ("def f(a, b):\n    return a+b  # add\n", "def f(a,b):\n\n    # comment\n    return (a + b)\n"),
    ("s = 'abc'", 's = "abc"'),
    ("broken(  \n\n  code\r\n", "broken(\n  code"),
]
DIFFERENT = [
    ("x = 1", "x = 2"),
    ("src = '// tile 64'", "src = '// tile 128'"),  # comments inside CUDA strings are code
    ("broken(", "broken(()"),
]


@pytest.mark.parametrize("a, b", SAME)
def test_cosmetic_differences_hash_alike(a, b):
    assert code_hash(a) == code_hash(b)


@pytest.mark.parametrize("a, b", DIFFERENT)
def test_real_differences_hash_apart(a, b):
    assert code_hash(a) != code_hash(b)


def test_normalize_falls_back_to_text_for_unparsable_code():
    assert normalize_code("def (:\n   x  \n\n") == "def (:\n   x"


def test_environment_key_uses_gpu_driver_and_versions_only():
    assert environment_key(H200) == environment_key(H200 | {"sms": 132, "memory_gib": 139.8})
    assert environment_key(H200) != environment_key(H200 | {"driver": "580.00"})
    assert environment_key(H200) != environment_key(A100)
    assert environment_key(H200) != environment_key(synthetic.INTERPRETER)


def test_lookup_returns_the_earlier_verdict_and_reuse_is_counted(archive, ids):
    first = archive.record_attempt(new(ids, 0, "x = 1  # v1", accepted(10, 5), tokens_in=100, cost_usd=0.5))
    hit = archive.lookup(ids[0], "x=1", H200)
    assert hit is not None and hit.id == first and hit.verdict == archive.get_attempt(first).verdict
    assert archive.lookup(ids[0], "x = 2", H200) is None
    assert archive.lookup(ids[0], "x = 1", A100) is None
    other_task = archive.register_task(synthetic.task_record("softmax"))
    assert archive.lookup(other_task, "x = 1", H200) is None

    again = archive.record_attempt(new(ids, 1, "x=1", hit.verdict, reuse_of=hit.id, tokens_in=70, cost_usd=0.25))
    reuse = archive.get_attempt(again)
    assert reuse.reuse_of == first and reuse.score is None and reuse.tokens_in == 70
    assert reuse.verdict.status is Status.ACCEPTED and reuse.verdict.shapes == hit.verdict.shapes
    assert archive.reuse_count(first) == 1
    assert archive.conn.execute("SELECT count(*) FROM measurements WHERE attempt_id = ?", (again,)).fetchone()[0] == 0
    row = archive.stats().per_task[0]
    assert (row.attempts, row.reused, row.accepted, row.tokens_in, row.cost_usd) == (2, 1, 2, 170, 0.75)
    assert archive.lookup(ids[0], "x = 1", H200).id == first  # still the evaluated one
    assert archive.best() == []  # not audited: not a best
    archive.record_audit(first, synthetic.audit(hit.verdict))
    assert [b.attempt_id for b in archive.best()] == [first]
    assert archive.lookup(ids[0], "x = 1", H200).audit_passed is True and reuse.audit_passed is None
    assert archive.get_attempt(again).audit_passed is True  # a reuse row shows its original's audit


def test_a_rejection_keeps_its_check(archive, ids):
    """``Rejected.check`` is its own field; the archive stores it as ``evidence["check"]`` and reads it back."""
    verdict = Rejected(Status.CHEAT, "forward ran torch compute ops", threat=16, check=Check.TORCH_OPS,
                       evidence={"torch_ops": ["aten::mul"]}, environment=dict(H200))
    attempt = archive.record_attempt(new(ids, 0, "z = 1", verdict))
    stored = json.loads(archive.conn.execute("SELECT evidence FROM attempts WHERE id = ?", (attempt,)).fetchone()[0])
    assert stored == {"check": "runtime trace", "torch_ops": ["aten::mul"]}
    back = archive.get_attempt(attempt).verdict
    assert back == verdict and back.check is Check.TORCH_OPS and back.key == ("cheat", 16, "runtime trace")


def test_second_evaluation_of_the_same_code_is_stored_as_a_reuse(archive, ids):
    first = archive.record_attempt(new(ids, 0, "y = 1", accepted(10)))
    second = archive.record_attempt(new(ids, 1, "y  =  1", accepted(1)))  # a race: evaluated twice
    assert archive.get_attempt(second).reuse_of == first
    archive.record_audit(first, synthetic.audit(archive.get_attempt(first).verdict))
    assert [b.score for b in archive.best()] == [2.0]


def test_reuse_of_must_name_an_evaluation_of_the_same_code(archive, ids):
    first = archive.record_attempt(new(ids, 0, "z = 1", accepted(10)))
    before = counts(archive)
    with pytest.raises(ArchiveError, match="not an evaluation of this code"):
        archive.record_attempt(new(ids, 1, "z = 2", accepted(10), reuse_of=first))
    assert counts(archive) == before


# ---- idempotency and transactions ----------------------------------------------------------
def test_recording_a_seq_twice_returns_the_first_attempt(archive, ids):
    a = archive.record_attempt(new(ids, 0, "a = 1", accepted(10), tokens_in=5))
    before, run_before = counts(archive), archive.run_status(ids[1]).run
    assert archive.record_attempt(new(ids, 0, "a = 1  # replayed after a crash", accepted(10), tokens_in=5)) == a
    assert counts(archive) == before and archive.run_status(ids[1]).run == run_before
    with pytest.raises(ConflictError, match="seq 0 with different code"):
        archive.record_attempt(new(ids, 0, "a = 2", accepted(10)))


def test_attempt_and_its_measurements_are_one_transaction(archive, ids, monkeypatch):
    archive.record_attempt(new(ids, 0, "ok = 1", accepted(10, 20)))
    before, run_before = counts(archive), archive.run_status(ids[1]).run
    real = store._BatchWriter._insert

    def failing(self, table, rows):
        if table == "measurements":  # the attempt rows are in; their measurements fail
            raise OSError("disk vanished")
        return real(self, table, rows)

    monkeypatch.setattr(store._BatchWriter, "_insert", failing)
    with pytest.raises(OSError):
        archive.record_attempt(new(ids, 1, "boom = 1", accepted(5, 6), environment=A100, tokens_in=9))
    with pytest.raises(OSError):
        archive.record_attempts([new(ids, 1, "b = 1", accepted(5)), new(ids, 2, "b = 2", accepted(6))])
    assert counts(archive) == before
    assert archive.run_status(ids[1]) == RunStatus(run=run_before, attempts={0: 1})
    assert not archive.conn.in_transaction
    monkeypatch.undo()
    assert archive.record_attempt(new(ids, 1, "boom = 1", accepted(5, 6))) == 2


def test_unknown_run_task_or_parent_is_a_clear_error(archive, ids):
    task_id, run_id = ids
    for kw, message in (({"run_id": 99}, "no run 99"), ({"task_id": 42}, "no task 42"),
                        ({"parent_id": 7}, "parent attempt 7")):
        base = dict(run_id=run_id, seq=0, task_id=task_id, code="p = 1", verdict=accepted(1)) | kw
        with pytest.raises(ArchiveError, match=message):
            archive.record_attempt(NewAttempt(**base))
    assert counts(archive)["attempts"] == 0


def test_batch_links_parents_within_the_batch(archive, ids):
    first, child = archive.record_attempts([new(ids, 0, "p = 1", accepted(4)),
                                            new(ids, 1, "p = 2", accepted(3), parent_id=1)])
    assert archive.get_attempt(child).parent_id == first


def test_runs_track_budget_and_resume(archive, ids):
    task_id, run_id = ids
    archive.record_attempt(new(ids, 0, "r = 1", accepted(4), tokens_in=10, tokens_out=3, cost_usd=0.5, latency_s=2.0))
    archive.record_attempt(new(ids, 1, "r = 2", Rejected(Status.TIMEOUT, "slow"), tokens_in=1, latency_s=3.5))
    archive.finish_run(run_id, "interrupted")
    status = archive.resume_run(run_id)
    run = status.run
    assert (run.status, run.ended, run.resumes, run.attempts) == ("running", None, 1, 2)
    assert (run.tokens_in, run.tokens_out, run.cost_usd, run.seconds) == (11, 3, 0.5, 0.0)
    assert status.next_seq == 2 and sorted(status.attempts) == [0, 1]
    archive.finish_run(run_id, seconds=12.5)  # the wall time, from the process that ran it
    assert (archive.run_status(run_id).run.status, archive.run_status(run_id).run.seconds) == ("finished", 12.5)
    with pytest.raises(ArchiveError, match="finishes as one of"):
        archive.finish_run(run_id, "exploded")
    with pytest.raises(ArchiveError, match="no run 5"):
        archive.resume_run(5)


def test_register_task_is_stable_per_version(archive):
    a = archive.register_task(TaskRecord("t", "h1", {"name": "t"}))
    assert archive.register_task(TaskRecord("t", "h1", {"name": "t"})) == a
    assert archive.register_task(TaskRecord("t", "h2", {"name": "t"})) != a


def test_register_a_real_task_hashes_what_judges_it():
    from kernforge.tasks.loader import load_task

    task = load_task("rms_norm")
    record = TaskRecord.from_task(task)
    assert record.spec == task.public_spec() and "hidden_shapes" not in record.spec
    assert TaskRecord.from_task(task) == record


# ---- records --------------------------------------------------------------------------------
def test_records_round_trip_through_json(archive, ids):
    rng = random.Random(3)
    parent = None
    for seq in range(30):
        item = synthetic.attempt(rng, ids[1], seq, ids[0], "rms_norm", seq, parent_id=parent)
        assert NewAttempt.from_dict(json.loads(json.dumps(item.to_dict()))) == item
        parent = archive.record_attempt(item)
        if item.verdict.accepted and seq % 2:
            archive.record_audit(parent, synthetic.audit(item.verdict, ratio=1.0 + seq / 100))
    values = [archive.get_attempt(parent), archive.run_status(ids[1]), archive.stats(),
              archive.population(ids[0], "NVIDIA H200"), *archive.best(), *archive.best_per_shape(),
              *archive.lineage(parent), *archive.latest_audits(range(1, 31)).values()]
    for value in values:
        assert type(value).from_dict(json.loads(json.dumps(value.to_dict()))) == value
    assert isinstance(values[0], AttemptRecord)


# ---- audits ---------------------------------------------------------------------------------
def test_an_audit_row_round_trips(archive, ids):
    from kernforge.archive.records import AuditRecord
    from kernforge.verifier.audit import Audit

    verdict = accepted(10, 20)
    first = archive.record_attempt(new(ids, 0, "a = 1", verdict))
    slower = synthetic.audit(verdict, ratio=1.5)
    rejected = Audit.from_dict(synthetic.audit(verdict, again=Rejected(Status.INCORRECT, "max abs err 0.4 at (3, 17)",
                                                                      environment=dict(H200))).to_dict())
    assert not slower.passed and "did not hold" in slower.reason and slower.details["ratio"] == pytest.approx(1.5)
    for audit in (slower, rejected, synthetic.audit(verdict)):
        assert Audit.from_dict(json.loads(json.dumps(audit.to_dict()))) == audit
        stored = archive.record_audit(first, audit, run_id=ids[1])
        assert (stored.attempt_id, stored.run_id, stored.task_id, stored.gpu) == (first, ids[1], ids[0], "NVIDIA H200")
        assert AuditRecord.from_dict(json.loads(json.dumps(stored.to_dict()))) == stored
    back = archive.audits(first)
    assert [a.audit for a in back] == [slower, rejected, synthetic.audit(verdict)]  # oldest first, verdicts typed
    assert back[1].audit.verdict.status is Status.INCORRECT and back[0].audit.measured_us == pytest.approx(15 * 2 ** 0.5)
    assert archive.latest_audits([first]) == {first: back[-1]}
    cli = archive.record_audit(first, synthetic.audit(verdict))
    assert cli.run_id is None  # `kernforge archive audit` belongs to no run


def test_an_audit_names_an_evaluated_attempt(archive, ids):
    first = archive.record_attempt(new(ids, 0, "b = 1", accepted(10)))
    reuse = archive.record_attempt(new(ids, 1, "b=1", accepted(10), reuse_of=first))
    audit = synthetic.audit(accepted(10))
    for attempt, run, message in ((reuse, None, f"reused the verdict of attempt {first}; audit attempt {first}"),
                                  (99, None, "no attempt 99"), (first, 42, "no run 42")):
        with pytest.raises(ArchiveError, match=message):
            archive.record_audit(attempt, audit, run_id=run)
    assert archive.conn.execute("SELECT count(*) FROM audits").fetchone()[0] == 0
    archive.record_audit(first, audit)
    assert [a.attempt_id for a in archive.audits(reuse)] == [first]  # a reuse row shows its original's audits


def _archive_at(path, version: int, monkeypatch) -> int:
    """An archive at schema ``version`` (its migrations up to it only) holding one accepted
    attempt, as an older kernforge wrote it; the attempt's id."""
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:version])
    monkeypatch.setattr(schema, "LATEST", version)
    with Archive.create(path) as old:
        task, run = old.register_task(synthetic.task_record("rms_norm")), old.start_run({})
        first = old.record_attempt(NewAttempt(run, 0, task, "c = 1", accepted(10, 5)))
        assert schema.version(old.db) == version
    monkeypatch.undo()
    return first


def test_an_archive_written_before_audits_is_migrated(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    first = _archive_at(path, 1, monkeypatch)
    old = sqlite_utils.Database(path)
    assert "audits" not in old.table_names()
    old.close()

    with pytest.raises(ArchiveError, match="kernforge archive migrate"):
        Archive.open(path, readonly=True)
    with Archive.open(path) as archive:  # a writable open migrates
        assert schema.version(archive.db) == schema.LATEST == 8
        assert {"attempt_id", "run_id", "passed", "reason", "recorded_us", "measured_us", "verdict", "created"} \
            <= set(archive.db["audits"].columns_dict)
        assert archive.get_attempt(first).audit_passed is None and archive.best() == []
        assert [(w.task, w.accepted, w.audited) for w in archive.awaiting_audit()] == [("rms_norm", 1, 0)]
        archive.record_audit(first, synthetic.audit(archive.get_attempt(first).verdict))
    with Archive.open(path, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [first] and archive.awaiting_audit() == []


def test_an_archive_without_run_owners_is_read_as_it_is_and_migrated_by_a_writer(tmp_path, monkeypatch):
    """v3 (who holds a run) adds nothing a query reads: read-only commands read a v2 archive
    unchanged (it may be on a read-only disk); the next writer migrates it."""
    path = tmp_path / "v2.db"
    _archive_at(path, 2, monkeypatch)
    with Archive.open(path, readonly=True) as archive:
        assert schema.version(archive.db) == 2 and len(archive.runs()) == 1 and archive.stats().per_task
    with Archive.open(path) as archive:
        assert schema.version(archive.db) == schema.LATEST and archive.runs()[0].owner is None


# ---- the judge's baselines --------------------------------------------------------------------
def test_baselines_are_kept_once_by_the_judges_key(tmp_path):
    figures = {"eager_us": 120.5, "compile_us": 80.25, "compile_mode": "torch.compile(dynamic=False)"}
    with Archive.create(tmp_path / "k.db") as archive:
        assert archive.judge_baselines() == {}
        assert archive.keep_judge_baselines({"k1": figures, "k2": {"eager_us": 3.0}}) == 2
        assert archive.keep_judge_baselines({"k1": {"eager_us": 999.0}, "k3": {}}) == 1, "a kept key is never replaced"
    with Archive.open(tmp_path / "k.db", readonly=True) as archive:
        assert archive.judge_baselines() == {"k1": figures, "k2": {"eager_us": 3.0}, "k3": {}}


def test_an_archive_from_before_v5_reads_no_baselines_and_a_writer_adds_the_table(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:4])
    monkeypatch.setattr(schema, "LATEST", 4)
    Archive.create(path).close()
    monkeypatch.undo()
    with Archive.open(path, readonly=True) as archive:
        assert archive.judge_baselines() == {}
    with Archive.open(path) as archive:
        assert schema.version(archive.db) == schema.LATEST
        assert archive.keep_judge_baselines({"k": {"eager_us": 1.0}}) == 1


# ---- scores over the public shapes ------------------------------------------------------------
def test_an_attempt_scored_with_its_hidden_shapes_is_scored_again_on_its_public_ones(tmp_path, monkeypatch):
    """Routine verdicts no longer time the hidden shapes (an audit does): v6 scores an attempt
    judged before that from its public measurements, which it keeps, so old and new attempts
    rank on the same shapes. A read-only open reads the old scores as they are (consistent among
    themselves); a writer, which adds new ones, migrates first."""
    path = tmp_path / "v5.db"
    public, hidden = timed(1, 10.0, compile_us=20.0), replace(timed(2, 40.0, compile_us=10.0), hidden=True)
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:5])
    monkeypatch.setattr(schema, "LATEST", 5)
    with Archive.create(path) as old:
        task, run = old.register_task(synthetic.task_record("rms_norm")), old.start_run({})
        both = old.record_attempt(NewAttempt(run, 0, task, "c = 1", Accepted(shapes=(public, hidden), environment=dict(H200))))
        # as the code of v5 stored it: the geometric mean of 2x (public) and 0.25x (hidden)
        with old.conn:
            old.conn.execute("UPDATE attempts SET score = ?, speedup_eager = ? WHERE id = ?", [(2.0 * 0.25) ** 0.5, 1.0, both])
    monkeypatch.undo()
    with Archive.open(path, readonly=True) as archive:
        assert archive.conn.execute("SELECT score FROM attempts").fetchone()[0] == pytest.approx(0.5 ** 0.5)
    with Archive.open(path) as archive:
        row = archive.conn.execute("SELECT score, speedup_eager FROM attempts WHERE id = ?", [both]).fetchone()
        assert row == (pytest.approx(2.0), pytest.approx(4.0))
        assert len(archive.get_attempt(both).verdict.shapes) == 2, "the hidden measurement is kept"


def test_a_score_counts_the_public_shapes_only(archive, ids):
    task, run = ids
    hidden = replace(timed(2, 100.0, compile_us=10.0), hidden=True)
    attempt = archive.record_attempt(NewAttempt(run, 0, task, "c = 1", Accepted(shapes=(timed(1, 10.0), hidden),
                                                                                environment=dict(H200))))
    assert archive.conn.execute("SELECT score FROM attempts WHERE id = ?", [attempt]).fetchone()[0] == pytest.approx(2.0)


def test_a_bound_time_of_record_is_kept_and_shown_as_one(archive, ids, monkeypatch):
    """How a time of record was reached is kept per shape (v8): where the guard set it (the batch's
    fixed cost outgrew a tenth of its window, at launch-bound sizes) ``archive show``, the fastest
    per shape and the prompt's table mark it as a bound, its speedups as at least; an archive from
    before v8, read as it is, has every time as it was, unmarked."""
    from kernforge.archive.report import measurements_table, shape_best_table
    from kernforge.prompts.feedback import public_table
    from kernforge.verifier.verdict import BOUNDED
    from test_archive_tables import render

    shapes = (replace(timed(1, 2.81), method=BOUNDED), replace(timed(4096, 25.0), method="difference"))
    first = archive.record_attempt(new(ids, 0, "c = 1", Accepted(shapes=shapes, environment=dict(H200))))
    archive.record_audit(first, synthetic.audit(archive.get_attempt(first).verdict))
    kept = archive.get_attempt(first).verdict.shapes
    assert [s.bounded for s in kept] == [True, False] and [s.method for s in kept] == [BOUNDED, "difference"]
    shown = render(measurements_table(kept), 160)
    assert "<= 2.81 us" in shown and ">= 7.12x" in shown and "25.0 us" in shown and "<= 25.0" not in shown
    assert "a bound, not a measurement" in shown
    from kernforge.archive.report import best_table

    assert "<= 2.81 us" in render(best_table(archive.best()), 200) and "a bound" in render(best_table(archive.best()), 200)
    fastest = {r.label: r for r in archive.best_per_shape()}
    assert fastest["T=1 H=4096"].bounded and not fastest["T=4096 H=4096"].bounded
    assert "<= 2.81 us" in render(shape_best_table(list(fastest.values())), 200)
    table = public_table(kept)
    assert "| T=1 H=4096 | <= 2.81 |" in table and "| T=4096 H=4096 | 25 |" in table and "a bound, not a measurement" in table
    assert "a bound" not in render(measurements_table([shapes[1]]), 160)


def test_an_archive_from_before_record_methods_reads_every_time_unmarked(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    first = _archive_at(path, 7, monkeypatch)
    old = sqlite_utils.Database(path)
    assert "method" not in old["measurements"].columns_dict
    old.close()
    with Archive.open(path, readonly=True) as archive:  # read as it is
        assert [s.bounded for s in archive.get_attempt(first).verdict.shapes] == [False, False]
    with Archive.open(path) as archive:
        assert "method" in archive.db["measurements"].columns_dict and schema.version(archive.db) == 8
