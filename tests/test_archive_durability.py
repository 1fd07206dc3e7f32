"""The archive survives SIGKILL at any instant, and readers are answered while a writer works.

A writer process records synthetic attempts (single and batched, with parents and reuses) and
prints ``seq id`` after each commit. It is killed with SIGKILL at random moments, then resumed
from ``run_status().next_seq``, many times over. Afterwards the file must be intact, every attempt
whole, the counters consistent, and everything the writer reported committed still there.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernforge.archive import synthetic
from kernforge.archive.store import Archive
from kernforge.cli import app

WRITER = r"""
import random, sys
from dataclasses import replace
from kernforge.archive import synthetic
from kernforge.archive.store import Archive

path, run_id, task_id, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
with Archive.open(path) as archive:
    status = archive.resume_run(run_id)
    seq, parent = status.next_seq, max(status.attempts.values(), default=None)
    codes = []
    print("ready", flush=True)
    while True:
        batch = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            item = synthetic.attempt(rng, run_id, seq, task_id, "rms_norm", seed * 1_000_000 + seq, parent_id=parent)
            hit = archive.lookup(task_id, rng.choice(codes), item.environment) if codes and rng.random() < 0.2 else None
            if hit is not None:  # the same code proposed again: reuse the archived verdict
                item = replace(item, code=hit.code, verdict=hit.verdict, reuse_of=hit.id)
            batch.append(item)
            seq += 1
        ids = archive.record_attempts(batch)
        sys.stdout.write("".join(f"{item.seq} {attempt_id}\n" for item, attempt_id in zip(batch, ids)))
        sys.stdout.flush()
        for item, attempt_id in zip(batch, ids):  # audits after their attempts, as a run makes them
            if item.verdict.accepted and item.reuse_of is None and rng.random() < 0.3:
                archive.record_audit(attempt_id, synthetic.audit(item.verdict, ratio=rng.choice((1.0, 1.5))), run_id)
        codes.append(batch[-1].code)
        parent = ids[-1]
"""

HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO runs (config, started, status) VALUES ('{}', 'now', 'uncommitted')")
print("holding", flush=True)
sys.stdin.read()
conn.execute("COMMIT")
"""

KILLS = 24


def start(script: str, *args: object, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def seeded(tmp_path):
    path = tmp_path / "k.db"
    with Archive.create(path) as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({"test": "durability"})
    return path, run, task


def check_whole(path: Path) -> int:
    """Every invariant a half-written attempt would break; returns the number of attempts."""
    conn = sqlite3.connect(path)
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    assert q("PRAGMA integrity_check") == [("ok",)]
    assert q("PRAGMA foreign_key_check") == []
    conn.execute("INSERT INTO attempts_fts(attempts_fts) VALUES ('integrity-check')")
    n = q("SELECT count(*) FROM attempts")[0][0]
    assert q("SELECT count(*) FROM attempts_fts") == [(n,)]
    runs = [r for (r,) in q("SELECT id FROM runs")]
    for run in runs:  # seqs dense from 0: nothing lost in the middle, nothing recorded twice
        seqs = [s for (s,) in q(f"SELECT seq FROM attempts WHERE run_id = {run} ORDER BY seq")]
        assert seqs == list(range(len(seqs)))
    # every evaluated attempt has all its measurements; reuse rows have none and point at an evaluation
    assert q("SELECT a.id FROM attempts a WHERE a.n_shapes != (SELECT count(*) FROM measurements m"
             " WHERE m.attempt_id = a.id)") == []
    assert q("SELECT a.id FROM attempts a LEFT JOIN attempts o ON o.id = a.reuse_of WHERE a.reuse_of IS NOT NULL"
             " AND (o.reuse_of IS NOT NULL OR o.code_hash != a.code_hash OR a.n_shapes != 0)") == []
    assert q("SELECT id FROM attempts WHERE reuse_of IS NULL AND n_shapes < 2") == []
    assert q("SELECT id FROM attempts WHERE accepted = 1 AND reuse_of IS NULL AND gpu != 'cpu'"
             " AND score IS NULL") == []
    # every audit belongs to an accepted evaluation, with its task and GPU
    assert q("SELECT u.id FROM audits u JOIN attempts a ON a.id = u.attempt_id WHERE a.reuse_of IS NOT NULL"
             " OR a.accepted = 0 OR u.task_id != a.task_id OR u.gpu != a.gpu") == []
    # counters written in the same transactions agree with the attempts
    assert q("SELECT id, attempts, tokens_in, tokens_out, round(cost_usd, 9) FROM runs WHERE attempts > 0"
             " ORDER BY id") == q("SELECT run_id, count(*), sum(tokens_in), sum(tokens_out), round(sum(cost_usd), 9)"
                                  " FROM attempts GROUP BY run_id ORDER BY run_id")
    by_key = "task_id, proposer, model, status, coalesce(threat, 0)"
    assert q(f"SELECT {by_key}, attempts, reused, tokens_in FROM tallies ORDER BY 1, 2, 3, 4, 5") == q(
        f"SELECT {by_key}, count(*), sum(reuse_of IS NOT NULL), sum(tokens_in) FROM attempts"
        f" GROUP BY {by_key} ORDER BY 1, 2, 3, 4, 5")
    conn.close()
    return n


def test_sigkill_at_random_points_loses_nothing_committed(seeded):
    path, run, task = seeded
    rng = random.Random(2024)
    reported: dict[int, int] = {}
    for round_ in range(KILLS):
        writer = start(WRITER, path, run, task, round_ + 1)
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        time.sleep(rng.uniform(0.0, 0.25))  # where the kill lands: before, inside or after a commit
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        # what it reported before dying was committed; a line cut short by the kill was not reported
        for line in writer.stdout.read().split("\n")[:-1]:
            seq, attempt_id = map(int, line.split())
            assert reported.setdefault(seq, attempt_id) == attempt_id
        writer.stdout.close()
        writer.stderr.close()
    n = check_whole(path)
    assert len(reported) > KILLS and n >= len(reported)
    audits = sqlite3.connect(path).execute("SELECT count(*) FROM audits").fetchone()[0]
    assert audits > 0  # audits were written (and killed) among the attempts
    with Archive.open(path) as archive:
        status = archive.run_status(run)
        assert {seq: status.attempts[seq] for seq in reported} == reported
        assert status.run.resumes == KILLS
        for attempt_id in rng.sample(sorted(status.attempts.values()), 50):
            record = archive.get_attempt(attempt_id)  # each reads back as a whole verdict
            assert len(record.verdict.shapes) >= 2
        # still writable: the next seq goes in after the last kill
        item = synthetic.attempt(rng, run, status.next_seq, task, "rms_norm", 99)
        assert archive.record_attempt(item) == max(status.attempts.values()) + 1
    check_whole(path)


def test_two_writers_killed_together(seeded):
    path, run, task = seeded
    with Archive.open(path) as archive:
        other = archive.start_run({"test": "second writer"})
    rng = random.Random(7)
    for round_ in range(6):
        writers = [start(WRITER, path, r, task, 100 + 2 * round_ + i) for i, r in enumerate((run, other))]
        for writer in writers:
            assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        time.sleep(rng.uniform(0.05, 0.3))
        for writer in writers:
            writer.send_signal(signal.SIGKILL)
        for writer in writers:
            writer.communicate()
    with Archive.open(path) as archive:
        assert {archive.run_status(r).run.resumes for r in (run, other)} == {6}
        assert min(len(archive.run_status(r).attempts) for r in (run, other)) > 0
    check_whole(path)


def _cli(*args: object):
    return CliRunner().invoke(app, ["archive", *map(str, args)])


def _fill(path, run, task, count):
    rng = random.Random(1)
    with Archive.open(path) as archive:
        items = [synthetic.attempt(rng, run, seq, task, "rms_norm", seq) for seq in range(count)]
        for item, attempt_id in zip(items, archive.record_attempts(items)):
            if item.verdict.accepted:  # audited: a best to read
                archive.record_audit(attempt_id, synthetic.audit(item.verdict))


def test_cli_reads_while_a_writer_holds_its_transaction(seeded):
    path, run, task = seeded
    _fill(path, run, task, 20)
    holder = start(HOLDER, path, stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "holding", holder.stderr.read()
        best = _cli("best", "--db", path, "--json")
        assert best.exit_code == 0, best.output
        assert json.loads(best.output)["best"]
        stats = _cli("stats", "--db", path, "--json")
        assert stats.exit_code == 0, stats.output
        assert sum(r["attempts"] for r in json.loads(stats.output)["per_task"]) == 20
        runs = _cli("sql", "SELECT status FROM runs", "--db", path, "--json")
        assert json.loads(runs.output)["rows"] == [["running"]]  # the open transaction is not visible
        assert _cli("show", 1, "--db", path).exit_code == 0
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    runs = _cli("sql", "SELECT status FROM runs ORDER BY id", "--db", path, "--json")
    assert json.loads(runs.output)["rows"] == [["running"], ["uncommitted"]]


def test_cli_reads_while_a_writer_writes_continuously(seeded):
    path, run, task = seeded
    _fill(path, run, task, 20)
    writer = start(WRITER, path, run, task, 7)
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        assert writer.stdout.readline().split()  # it is committing
        seen = []
        for _ in range(10):
            for command in (["best"], ["stats"], ["best", "--shapes"]):
                result = _cli(*command, "--db", path, "--json")
                assert result.exit_code == 0, result.output
            stats = json.loads(_cli("stats", "--db", path, "--json").output)
            seen.append(sum(r["attempts"] for r in stats["per_task"]))
        assert seen == sorted(seen) and seen[0] >= 20
    finally:
        writer.kill()
        writer.communicate()
    check_whole(path)
