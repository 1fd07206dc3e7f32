"""`kernforge archive ...`: tables for people, --json for scripts, clear errors (exit 2), read-only SQL."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from kernforge.archive import browse as browse_module
from kernforge.archive import schema, synthetic
from kernforge.archive.records import NewAttempt
from kernforge.archive.store import Archive
from kernforge.cli import app, archive_app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables unwrapped, so their cells can be asserted


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("archive") / "k.db"
    rng = random.Random(5)
    with Archive.create(path) as archive:
        run = archive.start_run({"model": "minimax-m3"})
        parent = None
        for seq in range(60):
            name = synthetic.TASKS[seq % 2]
            task = archive.register_task(synthetic.task_record(name))
            item = synthetic.attempt(rng, run, seq, task, name, seq, parent_id=parent)
            parent = archive.record_attempt(item)
            if item.verdict.accepted and seq % 3:  # audited: two in three pass, one in three fails
                archive.record_audit(parent, synthetic.audit(item.verdict, ratio=1.0 if seq % 3 == 1 else 1.5))
    return path


def invoke(*args: str):
    return runner.invoke(app, ["archive", *map(str, args)])


def test_every_archive_command_is_documented():
    for command in archive_app.registered_commands:
        assert (command.callback.__doc__ or "").strip(), command.name


def test_best_table_and_json(db):
    with Archive.open(db, readonly=True) as archive:
        expected = archive.best()
    result = invoke("best", "--db", db)
    assert result.exit_code == 0, result.output
    assert expected and all(e.audit.passed for e in expected)
    for entry in expected:
        assert entry.task in result.output and str(entry.attempt_id) in result.output
    assert "every best passed its audit" in result.output and "passed: " in result.output
    data = json.loads(invoke("best", "--db", db, "--json").output)
    assert [b["attempt_id"] for b in data["best"]] == [e.attempt_id for e in expected]
    assert all(b["audit"]["audit"]["passed"] for b in data["best"]) and data["awaiting_audit"] == []
    one = json.loads(invoke("best", "--db", db, "--task", "softmax", "--gpu", "h200", "--json").output)
    assert {b["task"] for b in one["best"]} == {"softmax"}
    shapes = json.loads(invoke("best", "--db", db, "--shapes", "--json").output)["best"]
    assert shapes and all(s["time_us"] > 0 for s in shapes)


def test_best_of_an_interpreter_only_archive_is_empty_and_says_why(tmp_path):
    path = tmp_path / "cpu.db"
    rng = random.Random(1)
    with Archive.create(path) as archive:
        run = archive.start_run({})
        task = archive.register_task(synthetic.task_record("rms_norm"))
        for seq in range(12):
            archive.record_attempt(synthetic.attempt(rng, run, seq, task, "rms_norm", seq,
                                                     environment=synthetic.INTERPRETER))
        assert archive.stats().per_task[0].accepted > 0  # accepted kernels, all verified on the CPU
    result = invoke("best", "--db", path)
    assert result.exit_code == 0 and "interpreter runs are never ranked" in " ".join(result.output.split())
    assert json.loads(invoke("best", "--db", path, "--json").output) == {"best": [], "awaiting_audit": []}
    assert json.loads(invoke("best", "--db", path, "--shapes", "--json").output) == {"best": [], "awaiting_audit": []}


def test_show_code_verdict_measurements_lineage(db):
    with Archive.open(db, readonly=True) as archive:
        attempt = archive.get_attempt(30)
    result = invoke("show", 30, "--db", db)
    assert result.exit_code == 0, result.output
    assert "_rms_norm_kernel" in result.output or "_softmax_kernel" in result.output
    assert attempt.verdict.status.value in result.output and "lineage" in result.output
    data = json.loads(invoke("show", 30, "--db", db, "--json").output)
    assert data["attempt"]["code"] == attempt.code
    assert [a["id"] for a in data["lineage"]] == list(range(1, 31))


def test_stats_table_and_json(db):
    result = invoke("stats", "--db", db)
    assert result.exit_code == 0, result.output
    assert "per task" in result.output and "per model" in result.output and "minimax-m3" in result.output
    data = json.loads(invoke("stats", "--db", db, "--json").output)
    assert sum(r["attempts"] for r in data["per_task"]) == sum(r["attempts"] for r in data["per_model"]) == 60


def test_search(db):
    data = json.loads(invoke("search", "rsqrt", "--db", db, "--limit", 5, "--json").output)
    assert len(data["attempts"]) == 5


def test_sql_reads(db):
    result = invoke("sql", "SELECT status, count(*) AS n FROM attempts GROUP BY status", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["columns"] == ["status", "n"] and sum(n for _, n in data["rows"]) == 60
    table = invoke("sql", "SELECT id FROM attempts", "--db", db, "--limit", 3)
    assert "first 3 rows shown" in table.output


@pytest.mark.parametrize("statement", [
    "DELETE FROM attempts",
    "UPDATE runs SET status = 'finished'",
    "INSERT INTO runs (config, started, status) VALUES ('{}', 'now', 'running')",
    "DROP TABLE tallies",
    "CREATE TABLE x (y)",
    "ATTACH DATABASE 'elsewhere.db' AS other",
    "PRAGMA query_only = 0",
    "PRAGMA journal_mode = delete",
    "VACUUM",
    "PRAGMA optimize",
    "PRAGMA wal_checkpoint(TRUNCATE)",
    "PRAGMA user_version = 7",
    "PRAGMA writable_schema = ON",
    "UPDATE sqlite_master SET sql = '' WHERE name = 'runs'",
    "BEGIN",
    "WITH d AS (SELECT 1) DELETE FROM attempts WHERE id IN (SELECT * FROM d)",
])
def test_sql_refuses_writes(db, statement, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = db.read_bytes()
    result = invoke("sql", statement, "--db", db)
    assert result.exit_code == 2
    assert "read-only" in result.output
    assert db.read_bytes() == before and not (tmp_path / "elsewhere.db").exists()
    assert sqlite3.connect(db).execute("SELECT count(*) FROM attempts").fetchone()[0] == 60


@pytest.mark.parametrize("statement", [
    "PRAGMA table_info(attempts)",
    "SELECT name FROM pragma_table_info('attempts')",
    "PRAGMA user_version",
    "PRAGMA integrity_check",
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT * FROM n",
    "SELECT rowid FROM attempts_fts WHERE attempts_fts MATCH 'rsqrt' LIMIT 1",
    "EXPLAIN QUERY PLAN SELECT * FROM attempts WHERE run_id = 1 AND seq = 2",
])
def test_sql_allows_reading_statements(db, statement):
    result = invoke("sql", statement, "--db", db, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"]


def test_sql_one_statement_at_a_time(db):
    result = invoke("sql", "SELECT 1; SELECT 2", "--db", db)
    assert result.exit_code == 2 and "one statement" in result.output


def test_db_from_environment_variable(db, monkeypatch):
    monkeypatch.setenv("KERNFORGE_DB", str(db))
    assert invoke("stats", "--json").exit_code == 0


@pytest.mark.parametrize("command", [["best"], ["show", "1"], ["stats"], ["search", "x"], ["sql", "SELECT 1"], ["browse"]])
def test_missing_database_is_a_clear_error(tmp_path, command):
    missing = tmp_path / "missing.db"
    result = invoke(*command, "--db", missing)
    assert result.exit_code == 2
    assert "no archive at" in result.output and "Traceback" not in result.output
    assert not missing.exists()


def test_corrupt_database_is_a_clear_error(db, tmp_path):
    corrupt = tmp_path / "corrupt.db"
    data = bytearray(db.read_bytes())
    rng = random.Random(0)
    page = 4096
    for offset in range(2 * page, len(data), page):  # keep the header page, scramble the rest
        data[offset:offset + page] = rng.randbytes(page)
    corrupt.write_bytes(bytes(data))
    for command in (["best"], ["stats"], ["show", "3"]):
        result = invoke(*command, "--db", corrupt)
        assert result.exit_code == 2, result.output
        assert "corrupt" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("content", [b"", b"GIF89a not a database at all" * 50])
def test_not_an_archive_is_a_clear_error(tmp_path, content):
    path = tmp_path / "x.db"
    path.write_bytes(content)
    result = invoke("best", "--db", path)
    assert result.exit_code == 2 and "not a kernforge archive" in result.output
    assert path.read_bytes() == content


def test_unknown_attempt_or_task(db):
    assert "no attempt 999" in invoke("show", 999, "--db", db).output
    result = invoke("best", "--task", "nope", "--db", db)
    assert result.exit_code == 2 and "no task named 'nope'" in result.output


def test_browse_without_datasette_says_how_to_install(db, monkeypatch):
    monkeypatch.setattr(browse_module.importlib.util, "find_spec", lambda name: None)
    result = invoke("browse", "--db", db)
    assert result.exit_code == 2 and "kernforge[datasette]" in result.output


def test_browse_runs_datasette_on_the_file(db, monkeypatch):
    calls = []

    class Child:
        def __init__(self, argv, **kw):
            calls.append(argv)

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(browse_module.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(browse_module.subprocess, "Popen", Child)
    result = invoke("browse", "--db", db, "--port", 9123, "--no-open")
    assert result.exit_code == 0, result.output
    assert calls[0][1:] == ["-m", "datasette", "serve", str(db), "--port", "9123"]
    assert invoke("browse", "--db", db, "--port", 0).exit_code == 2


FAKE_DATASETTE = """
import os, sys, time
open(os.environ["KF_CHILD_PID"], "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_browse_never_leaves_datasette_behind(db, tmp_path, how):
    """`archive browse` stopped by SIGTERM (systemd, kill), SIGHUP (a closed terminal) or even
    SIGKILL: Datasette goes with it instead of living on under PID 1."""
    fake = tmp_path / "fake" / "datasette"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_DATASETTE)
    pid_file = tmp_path / "child.pid"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'fake'}:{os.environ.get('PYTHONPATH', '')}",
               KF_CHILD_PID=str(pid_file))
    parent = subprocess.Popen([sys.executable, "-m", "kernforge.cli", "archive", "browse", "--db", str(db), "--no-open",
                               "--port", "18999"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert parent.poll() is None and time.monotonic() < deadline, parent.stderr.read()
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.send_signal(how)
        parent.wait(30)
    finally:
        if parent.poll() is None:
            parent.kill()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "Datasette outlived `kernforge archive browse`"
    if how != signal.SIGKILL:
        assert parent.returncode == 0 and "Traceback" not in parent.stderr.read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_search_without_words_is_an_error(db):
    for text in ("", '"', "  "):
        result = invoke("search", text, "--db", db)
        assert result.exit_code == 2 and "nothing to search for" in result.output, result.output


def test_sql_without_a_query_is_an_error(db):
    for query in ("", "   ", "/* nothing */"):
        result = invoke("sql", query, "--db", db)
        assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output, result.output
    assert invoke("sql", "SELECT 1", "--limit", "-1", "--db", db).exit_code == 2


# ---- a read-only archive ------------------------------------------------------------------------
def _read_only_view(folder):
    """A command prefix that runs in a mount namespace where ``folder`` is on a read-only file
    system (root), or None where that cannot be made here."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode:
        return None
    return ["unshare", "--mount", "sh", "-c", f'mount --bind "{folder}" "{folder}" && '
            f'mount -o remount,bind,ro "{folder}" && exec "$@"', "sh"]


@pytest.fixture
def read_only_archive(db, tmp_path):
    """(command prefix, archive path): a good archive whose file system is read-only, or (as a
    plain user) whose file and folder are not writable."""
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "k.db"
    shutil.copy(db, path)
    prefix = _read_only_view(folder)
    if prefix is None:
        if os.geteuid() == 0:
            pytest.skip("needs unshare --mount (root) or a plain user to make the archive read-only")
        path.chmod(0o444)
        folder.chmod(0o555)
        prefix = []
    yield prefix, path
    folder.chmod(0o755)


def _kernforge(prefix, *args):
    env = {k: v for k, v in os.environ.items() if k != "KERNFORGE_DB"} | {"COLUMNS": "250"}
    return subprocess.run(prefix + [sys.executable, "-m", "kernforge.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("args", [("archive", "stats"), ("archive", "best"), ("archive", "show", 1),
                                  ("archive", "sql", "SELECT count(*) FROM attempts"), ("archive", "search", "triton")])
def test_a_read_only_archive_is_read(read_only_archive, args):
    prefix, path = read_only_archive
    done = _kernforge(prefix, *args, "--db", path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "corrupt" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [("archive", "migrate"), ("run", "--task", "rms_norm", "--max-attempts", "1")])
def test_writing_a_read_only_archive_says_it_is_read_only(read_only_archive, args):
    prefix, path = read_only_archive
    done = _kernforge(prefix, *args, "--db", path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is read-only" in done.stderr and "corrupt" not in done.stderr and "Traceback" not in done.stderr


# ---- at 80 columns ------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("best",), ("best", "--shapes"), ("stats",), ("show", 3), ("search", "triton"),
                                  ("sql", "SELECT id, status, reason, code_hash FROM attempts LIMIT 5")])
def test_archive_tables_fit_80_columns(db, args, monkeypatch):
    from rich.console import Console

    from kernforge import cli

    monkeypatch.setattr(cli, "out", Console(width=80))  # an 80-column terminal
    result = invoke(*args, "--db", db)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in result.output, result.output
    with Archive.open(db, readonly=True) as archive:
        names = {r[0] for r in archive.sql("SELECT name FROM tasks")[1]}
    shown = [n for n in names if n in result.output]
    assert shown or args[0] == "sql", result.output  # task names whole


def test_migrate_reports_the_version(db):
    result = invoke("migrate", "--db", db)
    assert result.exit_code == 0 and f"schema v{schema.LATEST}" in result.output


def test_empty_archive_answers(tmp_path):
    Archive.create(tmp_path / "empty.db").close()
    best = invoke("best", "--db", tmp_path / "empty.db")
    assert best.exit_code == 0 and "no accepted attempt with GPU timings yet" in best.output
    stats = json.loads(invoke("stats", "--db", tmp_path / "empty.db", "--json").output)
    assert stats == {"per_task": [], "per_model": []}


def test_show_a_reuse_names_its_original(tmp_path):
    path = tmp_path / "reuse.db"
    rng = random.Random(2)
    with Archive.create(path) as archive:
        run, task = archive.start_run({}), archive.register_task(synthetic.task_record("rms_norm"))
        first = synthetic.attempt(rng, run, 0, task, "rms_norm", 1)
        original = archive.record_attempt(first)
        hit = archive.lookup(task, first.code + "\n# the same code again\n", first.environment)
        archive.record_attempt(NewAttempt(run, 1, task, first.code, hit.verdict, first.environment, reuse_of=hit.id))
    shown = invoke("show", 2, "--db", path)
    assert shown.exit_code == 0 and f"verdict reused from attempt {original}" in shown.output
    assert "reused by 1 later proposal" in invoke("show", original, "--db", path).output


def test_best_says_when_accepted_gpu_attempts_exist_but_none_passed_an_audit(tmp_path):
    path = tmp_path / "unaudited.db"
    rng = random.Random(4)
    with Archive.create(path) as archive:
        run = archive.start_run({})
        task = archive.register_task(synthetic.task_record("rms_norm"))
        seq, accepted = 0, []
        while len(accepted) < 3:
            item = synthetic.attempt(rng, run, seq, task, "rms_norm", seq)
            attempt = archive.record_attempt(item)
            if item.verdict.accepted:
                accepted.append((attempt, item.verdict))
            seq += 1
        archive.record_audit(accepted[0][0], synthetic.audit(accepted[0][1], ratio=1.4))  # failed: demoted
    for args in ([], ["--shapes"]):
        result = invoke("best", "--db", path, *args)
        said = " ".join(result.output.split())
        assert result.exit_code == 0, result.output
        assert "rms_norm on NVIDIA H200: 3 accepted GPU attempt(s), none passed an audit by this judge (1 audited, 1 of them failed)" \
            in said and "kernforge archive audit --task rms_norm" in said
        data = json.loads(invoke("best", "--db", path, "--json", *args).output)
        assert data["best"] == [] and data["awaiting_audit"] == [
            {"task": "rms_norm", "gpu": "NVIDIA H200", "accepted": 3, "audited": 1, "failed": 1, "earlier": 0}]


def test_show_says_how_the_attempt_was_audited(db):
    with Archive.open(db, readonly=True) as archive:
        rows = archive.sql("SELECT a.id, (SELECT count(*) FROM audits u WHERE u.attempt_id = a.id), a.accepted"
                           " FROM attempts a ORDER BY a.id")[1]
        latest = archive.latest_audits([r[0] for r in rows])
    audited = next(i for i, n, _ in rows if n and latest[i].passed)
    failed = next(i for i, n, _ in rows if n and not latest[i].passed)
    unaudited = next(i for i, n, ok in rows if not n and ok)
    rejected = next(i for i, n, ok in rows if not ok)
    for attempt, words in ((audited, "passed: accepted again in a fresh worker"), (failed, "FAILED: its time did not hold"),
                           (unaudited, "not audited: never a best until an audit passes"),
                           (rejected, "not audited (only accepted verdicts with GPU times are audited)")):
        result = invoke("show", attempt, "--db", db)
        assert result.exit_code == 0 and words in " ".join(result.output.split()), (attempt, result.output)
    data = json.loads(invoke("show", failed, "--db", db, "--json").output)
    assert [a["audit"]["passed"] for a in data["audits"]] == [False] and data["attempt"]["audit_passed"] is False


# ---- kernforge report -----------------------------------------------------------------------------
def test_report_writes_the_page(db, tmp_path):
    out = tmp_path / "page.html"
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in " ".join(result.output.split()) and out.stat().st_size > 100_000
    assert "kernforge report: the whole archive" in out.read_text()
    one = runner.invoke(app, ["report", "--db", str(db), "--run", "1", "--out", str(tmp_path / "run.html")])
    assert one.exit_code == 0 and "kernforge report: run 1" in (tmp_path / "run.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--db", "{tmp}/none.db"], "no archive at"),
    (["--run", "99"], "no run 99 in"),
    (["--out", "{tmp}/no/such/folder/r.html"], "does not exist"),
    (["--out", "{tmp}"], "is a folder"),
])
def test_report_bad_input_is_a_clear_error(db, tmp_path, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r.html"), *args])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "error:" in said and message in said and "Traceback" not in said


def test_report_help_reads_like_prose():
    result = runner.invoke(app, ["report", "--help"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0
    for words in ("opens offline in any browser", "Interpreter (CPU) verdicts check correctness only",
                  "--run", "--out", "--png", "--db"):
        assert words in said
