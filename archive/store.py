"""The archive the loop writes to: ``Archive.create(path)`` / ``Archive.open(path)``.

Every write is one ``BEGIN IMMEDIATE`` transaction: an attempt, its verdict, its per-shape
measurements, the run's budget and the stats tallies commit together or not at all, so a process
killed at any instant leaves whole attempts only. ``(run_id, seq)`` is each attempt's idempotency
key: a resumed run asks ``run_status`` for ``next_seq``, and recording a seq twice returns the
first attempt instead of adding a second.

Content addressing (see content.py): ``lookup(task_id, code, environment)`` returns the archived
verdict for the same normalised code, task and environment. The loop then records the proposal
with ``reuse_of`` set instead of evaluating again; that writes a *reuse row*: an attempt with its
own prompt, response, tokens and cost, the original's verdict fields, no measurements and no
score. ``reused`` in ``stats`` counts these rows. If two workers evaluate the same code at once,
the second to commit is stored as a reuse of the first: the archive never holds two evaluations.

Audits (``record_audit``): an evaluated attempt judged again from scratch before it may be a best
(verifier/audit.py). Each is its own transaction, written after the attempt's: a process killed
between the two leaves an attempt with no audit, which is simply not a best.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import quote

from sqlite_utils import Database

from kernforge.tasks.spec import Task
from kernforge.verifier import revision
from kernforge.verifier.audit import Audit

from . import schema
from .content import code_hash, environment_fields, environment_key
from .errors import ArchiveError, ConflictError, ReadOnlyError, RunBusyError
from .queries import Queries, guarded
from .records import AuditRecord, NewAttempt, RunRecord, RunStatus, TaskRecord
from .score import roofline_pct, summarize

DEFAULT_PATH = Path("kernforge.db")
#: How long a writer waits for another writer's transaction before giving up (seconds).
BUSY_TIMEOUT_S = 30.0
RUN_STATUSES = ("running", "finished", "failed", "interrupted")


def private_files(db: Path) -> tuple[str, ...]:
    """What a sandbox must hide of the archive at ``db``: the folder it lies in (its journal and WAL
    files come and go there) and each of its files by name, for where that folder is one a worker
    needs (a checkout's root, say) and stays in sight. The archive's stored reasons name hidden
    shapes, and it holds every candidate's code."""
    path = Path(os.path.abspath(db))
    return (str(path.parent),) + tuple(str(path) + suffix for suffix in ("", "-wal", "-shm", "-journal"))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _CannotOpen(Exception):
    """SQLite could not open the file or its -wal/-shm beside it, or could not write: maybe read-only."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _cannot_open(error: sqlite3.Error) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM)
    return any(w in str(error) for w in ("unable to open", "readonly database", "access permission"))


def read_only_reason(path: Path) -> str | None:
    """Why this process cannot write ``path`` (and the -wal/-shm files beside it), or None."""
    path = Path(path).resolve()
    folder = path.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    except OSError:
        pass
    if path.exists() and not os.access(path, os.W_OK):
        return "the file is not writable"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is not writable, and SQLite keeps its -wal and -shm files beside it"
    return None


def gpu_label(environment: Mapping[str, Any]) -> str:
    """The GPU model results are compared within; "cpu" for the Triton interpreter."""
    return str(environment.get("gpu") or "cpu")


class Archive(Queries):
    """One archive file. Use as a context manager, or call ``close()``."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self.conn = conn
        self.db = Database(conn, execute_plugins=False)
        self._columns: dict[str, tuple[str, ...]] = {}

    # ---- opening ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path = DEFAULT_PATH, *, exist_ok: bool = True) -> "Archive":
        """Create a new archive file, or (``exist_ok``) open the existing archive at ``path``."""
        path = Path(path)
        if path.exists() and path.stat().st_size > 0:
            if not exist_ok:
                raise ArchiveError(f"{path} already exists")
            return cls.open(path)
        if not path.parent.is_dir():
            raise ArchiveError(f"cannot create {path}: folder {path.parent} does not exist")
        return cls._connect(path, mode="rwc", readonly=False, creating=True)

    @classmethod
    def open(cls, path: str | Path = DEFAULT_PATH, *, readonly: bool = False) -> "Archive":
        """Open an existing archive; a missing file is an error, never a new empty archive.

        ``readonly`` archives (what the CLI uses) never write, not even a migration: an archive
        with an older schema must be opened writable once (``kernforge archive migrate``).
        """
        path = Path(path)
        if not path.exists():
            raise ArchiveError(f"no archive at {path} (a run creates one; or point --db at an existing file)")
        if not path.is_file():
            raise ArchiveError(f"{path} is not a file")
        return cls._connect(path, mode="ro" if readonly else "rw", readonly=readonly, creating=False)

    @classmethod
    def _connect(cls, path: Path, *, mode: str, readonly: bool, creating: bool) -> "Archive":
        try:
            return cls._connect_uri(path, f"mode={mode}", readonly=readonly, creating=creating)
        except _CannotOpen as cannot:
            why = read_only_reason(path)
            if why is None:
                raise ArchiveError(f"{path} is not a kernforge archive or is corrupt: {cannot.error}") from None
            if not readonly:
                raise ReadOnlyError(f"{path} is read-only ({why}): this command writes to the archive; copy it to a "
                                    "writable folder, or point --db at another file") from None
            wal = Path(f"{path}-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise ReadOnlyError(f"{path} cannot be read in place ({why}): its write-ahead log {wal} holds commits "
                                    "that SQLite must replay; copy the archive with its -wal file to a writable folder")
            # Nothing can write it (no -shm: no writer has it open; read-only: none can open it
            # later) and every commit is in the file: SQLite may read it as an immutable file,
            # needing neither a -shm nor a lock beside it.
            try:
                return cls._connect_uri(path, "mode=ro&immutable=1", readonly=True, creating=False)
            except _CannotOpen as again:
                raise ArchiveError(f"{path} is not a kernforge archive or is corrupt: {again.error}") from None

    @classmethod
    def _connect_uri(cls, path: Path, query: str, *, readonly: bool, creating: bool) -> "Archive":
        uri = f"file:{quote(str(path.resolve()))}?{query}"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        except sqlite3.Error as error:
            raise ArchiveError(f"cannot open {path}: {error}") from None
        try:
            archive = cls(conn, path, readonly=readonly)
            archive._prepare(creating)
        except ArchiveError:
            conn.close()
            raise
        except sqlite3.Error as error:
            conn.close()
            if _cannot_open(error):
                raise _CannotOpen(error) from None
            raise ArchiveError(f"{path} is not a kernforge archive or is corrupt: {error}") from None
        return archive

    def _prepare(self, creating: bool) -> None:
        self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self.conn.execute("PRAGMA foreign_keys = ON")
        if not creating and schema.check(self.db, str(self.path)) == 0:
            raise ArchiveError(f"{self.path} is an empty file, not a kernforge archive")
        if self.readonly:
            if schema.version(self.db) < schema.LATEST and "judge" not in self.db["audits"].columns_dict \
                    and "audits" in self.db.table_names():
                # an archive from before judges were fingerprinted, read as it is (it may be on a
                # read-only disk): its audits are no judge's, so none makes a best (schema._v7_judge)
                self.conn.execute("CREATE TEMP VIEW audits AS SELECT *, NULL AS judge FROM main.audits")
            self.conn.execute("PRAGMA query_only = ON")
            if set(schema.pending(self.db, str(self.path))) - schema.READ_COMPATIBLE:
                raise ArchiveError(
                    f"{self.path} has an older archive schema; upgrade it with `kernforge archive migrate --db {self.path}`"
                )
            return
        self.db.enable_wal()  # persistent: readers never wait for the writer
        self.migrate()

    def migrate(self) -> int:
        """Apply pending migrations, each in its own transaction; returns the schema version."""
        for migration in schema.pending(self.db, str(self.path)):
            with self._write():
                # re-read inside the lock: another process may have migrated meanwhile
                current = schema.version(self.db)
                if schema.MIGRATIONS[current:current + 1] == (migration,):
                    schema.apply(self.db, migration, current + 1)
        return schema.version(self.db)

    def close(self) -> None:
        self.conn.close()

    def columns(self, table: str) -> tuple[str, ...]:
        if table not in self._columns:
            self._columns[table] = tuple(c.name for c in self.db[table].columns)
        return self._columns[table]

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction. IMMEDIATE takes the write lock up front (waiting up to the busy
        timeout), so a transaction that read first never fails on upgrading to a writer."""
        if self.readonly:
            raise ReadOnlyError(f"{self.path} is open read-only")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.execute("COMMIT")

    # ---- tasks and runs --------------------------------------------------------------------
    @guarded
    def judge_baselines(self) -> dict[str, dict[str, Any]]:
        """The judge's baselines kept here, by the judge's key (none in an archive older than v5)."""
        if "judge_baselines" not in self.db.table_names():
            return {}
        return {key: json.loads(figures) for key, figures in self.conn.execute("SELECT key, figures FROM judge_baselines")}

    @guarded
    def keep_judge_baselines(self, entries: Mapping[str, Mapping[str, Any]]) -> int:
        """Add the judge's baselines not kept yet (a key's figures never change); how many were new."""
        if not entries:
            return 0
        with self._write():
            before = self.conn.total_changes
            self.conn.executemany("INSERT OR IGNORE INTO judge_baselines (key, figures, recorded) VALUES (?, ?, ?)",
                                  [(k, json.dumps(v, sort_keys=True), _now()) for k, v in entries.items()])
            return self.conn.total_changes - before

    def register_task(self, task: Task | TaskRecord) -> int:
        """The id of this task version (name + hash of what judges it), adding it if new."""
        record = TaskRecord.from_task(task) if isinstance(task, Task) else task
        with self._write():
            self.db["tasks"].insert(
                {"name": record.name, "source_hash": record.source_hash,
                 "spec": json.dumps(record.spec, sort_keys=True), "created": _now()},
                ignore=True,
            )
            row = self.conn.execute(
                "SELECT id FROM tasks WHERE name = ? AND source_hash = ?", (record.name, record.source_hash)
            ).fetchone()
        return row[0]

    @guarded
    def start_run(self, config: Mapping[str, Any], owner: str | None = None) -> int:
        """A new run, ``running``, held by ``owner`` (the process running it; see ``resume_run``)."""
        now = _now()
        row = {"config": json.dumps(config, sort_keys=True, default=str), "started": now, "status": "running"}
        if owner is not None:
            row |= {"owner": owner, "heartbeat": now}
        with self._write():
            return self.db["runs"].insert(row).last_pk

    @guarded
    def set_left_out(self, run_id: int, reasons: Mapping[str, str]) -> None:
        """The run's tasks this session left out before judging any (too large for its devices),
        each with why (``config["left_out"]``; replaced each session: a resumed run on a larger GPU
        may judge them)."""
        with self._write():
            config = dict(self._run_row(run_id).config)
            if not reasons and "left_out" not in config:
                return  # nothing to say, nothing said before
            if reasons:
                config["left_out"] = dict(reasons)
            else:
                config.pop("left_out", None)
            self.conn.execute("UPDATE runs SET config = ? WHERE id = ?",
                              (json.dumps(config, sort_keys=True, default=str), run_id))

    @guarded
    def finish_run(self, run_id: int, status: str = "finished", *, owner: str | None = None,
                   seconds: float | None = None) -> None:
        """Mark the run stopped (``status``) and let go of it; ``seconds``: its wall time so far.
        With ``owner``, only if that process still holds it (one that took it over keeps it)."""
        if status not in RUN_STATUSES[1:]:
            raise ArchiveError(f"a run finishes as one of {RUN_STATUSES[1:]}, not {status!r}")
        with self._write():
            run = self._run_row(run_id)
            if owner is not None and run.owner not in (None, owner):
                return
            self.conn.execute("UPDATE runs SET status = ?, ended = ?, owner = NULL, seconds = coalesce(?, seconds)"
                              " WHERE id = ?", (status, _now(), seconds, run_id))

    @guarded
    def resume_run(self, run_id: int, owner: str | None = None,
                   holder_alive: Callable[[str, float], bool] | None = None) -> RunStatus:
        """Mark a killed or stopped run running again, held by ``owner``; continue it from ``next_seq``.

        A run another process still holds is refused (``RunBusyError``): ``holder_alive(holder,
        seconds since its last heartbeat)`` says whether that process is alive. A holder that died
        without letting go (SIGKILL, a power cut) is not alive, and the run is taken over."""
        with self._write():
            run = self._run_row(run_id)
            if run.owner and run.owner != owner and holder_alive is not None:
                age = _age_s(run.heartbeat)
                if holder_alive(run.owner, age):
                    where = run.owner.split("|", 1)[0]
                    pid = run.owner.rsplit("/", 2)[-2] if run.owner.count("/") >= 2 else "?"
                    raise RunBusyError(
                        f"run {run_id} in {self.path} is still running (process {pid} on {where}, alive "
                        f"{age:.0f}s ago): it cannot be resumed meanwhile. Wait for it to end, or stop it "
                        "(Ctrl-C or kill it) and resume it then")
            now = _now()
            self.conn.execute(
                "UPDATE runs SET status = 'running', ended = NULL, resumes = resumes + 1, owner = ?, heartbeat = ?"
                " WHERE id = ?", (owner, now if owner else None, run_id),
            )
        return self.run_status(run_id)

    @guarded
    def heartbeat(self, run_id: int, owner: str, seconds: float) -> bool:
        """``owner`` is alive and has run ``seconds`` of wall time; False if it no longer holds the run."""
        with self._write():
            changed = self.conn.execute("UPDATE runs SET heartbeat = ?, seconds = ? WHERE id = ? AND owner = ?",
                                        (_now(), seconds, run_id, owner)).rowcount
        return changed == 1

    @guarded
    def run_status(self, run_id: int) -> RunStatus:
        run = self._run_row(run_id)
        seqs = self.conn.execute("SELECT seq, id FROM attempts WHERE run_id = ? ORDER BY seq", (run_id,))
        return RunStatus(run=run, attempts=dict(seqs.fetchall()))

    @guarded
    def runs(self) -> list[RunRecord]:
        return [_run(row) for row in self.db.query("SELECT * FROM runs ORDER BY id")]

    def _run_row(self, run_id: int) -> RunRecord:
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise ArchiveError(f"no run {run_id} in {self.path}")
        return _run(rows[0])

    # ---- attempts --------------------------------------------------------------------------
    @guarded
    def record_attempt(self, attempt: NewAttempt) -> int:
        """Write one attempt, its verdict and its per-shape results in one transaction; its id."""
        return self.record_attempts([attempt])[0]

    @guarded
    def record_attempts(self, attempts: Sequence[NewAttempt]) -> list[int]:
        """Write several attempts in one transaction (all or none); their ids, in order."""
        with self._write():
            writer = _BatchWriter(self)
            ids = [writer.add(a) for a in attempts]
            writer.flush()
        return ids

    # ---- audits ----------------------------------------------------------------------------
    @guarded
    def record_audit(self, attempt_id: int, audit: Audit, run_id: int | None = None) -> AuditRecord:
        """Write one audit of an evaluated attempt (not a reuse row: audit its original) in one
        transaction; the stored record. ``run_id``: the run that made it (None from the CLI)."""
        with self._write():
            row = self.conn.execute("SELECT task_id, gpu, reuse_of FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row is None:
                raise ArchiveError(f"no attempt {attempt_id} in {self.path}")
            task_id, gpu, reuse_of = row
            if reuse_of is not None:
                raise ArchiveError(f"attempt {attempt_id} reused the verdict of attempt {reuse_of}; audit attempt {reuse_of}")
            if run_id is not None:
                self._run_row(run_id)
            created = _now()
            # a writer migrates on open (v7 adds the column); tests build older archives with it too
            judged_by = {"judge": revision.fingerprint()} if "judge" in self.db["audits"].columns_dict else {}
            audit_id = self.db["audits"].insert(judged_by | {
                "attempt_id": attempt_id, "run_id": run_id, "task_id": task_id, "gpu": gpu,
                "passed": int(audit.passed), "reason": audit.reason, "recorded_us": audit.recorded_us,
                "measured_us": audit.measured_us,
                "verdict": json.dumps(audit.verdict.to_dict(), sort_keys=True, default=str) if audit.verdict else None,
                "details": json.dumps(dict(audit.details), sort_keys=True, default=str), "created": created,
            }).last_pk  # this process's judge made it: queries.py counts only its audits
        return AuditRecord(id=audit_id, attempt_id=attempt_id, task_id=task_id, gpu=gpu, created=created, audit=audit,
                           run_id=run_id, judge=judged_by.get("judge"))


def _age_s(stamp: str | None) -> float:
    """Seconds since an archive timestamp (infinite without one)."""
    if not stamp:
        return float("inf")
    return max(0.0, (datetime.now(timezone.utc) - datetime.fromisoformat(stamp)).total_seconds())


def _run(row: Mapping[str, Any]) -> RunRecord:
    return RunRecord.from_dict(dict(row) | {"config": json.loads(row["config"])})


class _BatchWriter:
    """Builds the rows of a batch of attempts; the caller holds the write transaction.

    Ids are assigned here (max id + 1, safe under the write lock) so one batch insert per table
    can link measurements to attempts.
    """

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.conn = archive.conn
        self.next_id = (self.conn.execute("SELECT max(id) FROM attempts").fetchone()[0] or 0) + 1
        self.attempts: list[dict[str, Any]] = []
        self.measurements: list[dict[str, Any]] = []
        self.environments: dict[str, dict[str, Any]] = {}
        self.tallies: dict[tuple, list[float]] = {}
        self.run_totals: dict[int, list[float]] = {}
        self.by_seq: dict[tuple[int, int], tuple[int, str]] = {}
        self.by_content: dict[tuple[int, str, str], dict[str, Any]] = {}
        self.known: dict[str, set[int]] = {"runs": set(), "tasks": set()}

    def add(self, a: NewAttempt) -> int:
        digest = code_hash(a.code)
        seen = self.by_seq.get((a.run_id, a.seq)) or self._stored_seq(a.run_id, a.seq)
        if seen is not None:
            if seen[1] != digest:
                raise ConflictError(f"run {a.run_id} already has attempt seq {a.seq} with different code (attempt {seen[0]})")
            return seen[0]
        self._require("runs", a.run_id)
        self._require("tasks", a.task_id)
        env = dict(a.environment or a.verdict.environment)
        key = environment_key(env)
        self.environments.setdefault(key, env)
        original = self._original(a, digest, key)
        attempt_id, self.next_id = self.next_id, self.next_id + 1
        self._require_parent(a.parent_id)
        row = {
            "id": attempt_id, "run_id": a.run_id, "seq": a.seq, "task_id": a.task_id, "parent_id": a.parent_id,
            "proposer": a.proposer, "model": a.model, "prompt": a.prompt, "response": a.response,
            "code": a.code, "code_hash": digest, "tokens_in": a.tokens_in, "tokens_out": a.tokens_out,
            "cost_usd": a.cost_usd, "latency_s": a.latency_s, "env_key": key, "gpu": gpu_label(env),
            "created": _now(), "reuse_of": None,
        }
        if original is not None:
            row |= {k: original[k] for k in ("status", "accepted", "threat", "reason", "evidence")}
            row |= {"reuse_of": original["id"], "n_shapes": 0,
                    "score": None, "speedup_eager": None, "pct_roofline": None}
        else:
            v = a.verdict
            row |= {"status": v.status.value, "accepted": int(v.accepted), "threat": v.threat, "reason": v.reason,
                    # the stored form (to_dict) keeps a rejection's check in the evidence: Rejected.evidence has none
                    "evidence": json.dumps(v.to_dict()["evidence"], sort_keys=True, default=str), "n_shapes": len(v.shapes)}
            row |= summarize(v.shapes) if v.accepted else {"score": None, "speedup_eager": None, "pct_roofline": None}
            self.by_content[(a.task_id, digest, key)] = row
            self._measure(row, v.shapes)
        self.attempts.append(row)
        self.by_seq[(a.run_id, a.seq)] = (attempt_id, digest)
        self._count(a, row)
        return attempt_id

    def _stored_seq(self, run_id: int, seq: int) -> tuple[int, str] | None:
        return self.conn.execute(
            "SELECT id, code_hash FROM attempts WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()

    def _require(self, table: str, ident: int) -> None:
        if ident in self.known[table]:
            return
        if self.conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (ident,)).fetchone() is None:
            raise ArchiveError(f"no {table[:-1]} {ident} in {self.archive.path}")
        self.known[table].add(ident)

    def _require_parent(self, parent_id: int | None) -> None:
        if parent_id is None:
            return
        if self.attempts and self.attempts[0]["id"] <= parent_id <= self.attempts[-1]["id"]:
            return  # recorded earlier in this batch
        if self.conn.execute("SELECT 1 FROM attempts WHERE id = ?", (parent_id,)).fetchone() is None:
            raise ArchiveError(f"parent attempt {parent_id} is not in {self.archive.path}")

    def _original(self, a: NewAttempt, digest: str, key: str) -> dict[str, Any] | None:
        """The evaluated attempt this one reuses: the named ``reuse_of``, or any with the same key."""
        cols = "id, status, accepted, threat, reason, evidence"
        found = self.by_content.get((a.task_id, digest, key))
        if found is None:
            cur = self.conn.execute(
                f"SELECT {cols} FROM attempts WHERE task_id = ? AND code_hash = ? AND env_key = ? AND reuse_of IS NULL",
                (a.task_id, digest, key),
            )
            hit = cur.fetchone()
            found = dict(zip(cols.split(", "), hit)) if hit else None
        if a.reuse_of is not None and (found is None or found["id"] != a.reuse_of):
            raise ArchiveError(
                f"attempt {a.reuse_of} is not an evaluation of this code for task {a.task_id} in environment {key}"
            )
        return found

    def _measure(self, row: dict[str, Any], shapes: Sequence[Any]) -> None:
        for idx, s in enumerate(shapes):
            values = s.to_dict()
            values |= {
                "attempt_id": row["id"], "idx": idx, "task_id": row["task_id"], "gpu": row["gpu"],
                "accepted": row["accepted"], "shape": json.dumps(values["shape"]), "label": s.label,
                "hidden": int(s.hidden), "pct_roofline": roofline_pct(s),
            }
            self.measurements.append(values)

    def _count(self, a: NewAttempt, row: dict[str, Any]) -> None:
        reused = int(row["reuse_of"] is not None)
        tally = self.tallies.setdefault((a.task_id, a.proposer, a.model, row["status"], row["threat"] or 0), [0] * 5)
        for i, value in enumerate((1, reused, a.tokens_in, a.tokens_out, a.cost_usd)):
            tally[i] += value
        spent = self.run_totals.setdefault(a.run_id, [0] * 4)
        for i, value in enumerate((1, a.tokens_in, a.tokens_out, a.cost_usd)):
            spent[i] += value

    def _insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        # A prepared executemany: table.insert_all sniffs every value for JSON, which at batch
        # volume costs more than SQLite's own work; the values here are already plain.
        if not rows:
            return
        columns = self.archive.columns(table)
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        self.conn.executemany(sql, [tuple(row.get(c) for c in columns) for row in rows])

    def flush(self) -> None:
        db = self.archive.db
        for key, env in self.environments.items():
            db["environments"].insert(
                environment_fields(env, columns=True) | {"key": key, "info": json.dumps(env, sort_keys=True, default=str),
                                           "created": _now()},
                ignore=True,
            )
        self._insert("attempts", self.attempts)
        self._insert("measurements", self.measurements)
        self.conn.executemany(
            "INSERT INTO tallies (task_id, proposer, model, status, threat, attempts, reused, tokens_in,"
            " tokens_out, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET"
            " attempts = attempts + excluded.attempts, reused = reused + excluded.reused,"
            " tokens_in = tokens_in + excluded.tokens_in, tokens_out = tokens_out + excluded.tokens_out,"
            " cost_usd = cost_usd + excluded.cost_usd",
            [key + tuple(values) for key, values in self.tallies.items()],
        )
        self.conn.executemany(
            "UPDATE runs SET attempts = attempts + ?, tokens_in = tokens_in + ?, tokens_out = tokens_out + ?,"
            " cost_usd = cost_usd + ? WHERE id = ?",
            [(*spent, run_id) for run_id, spent in self.run_totals.items()],
        )
