"""The archive's schema, built by ordered migrations. ``PRAGMA user_version`` is the schema version.

A migration is a function of the database, run inside one write transaction together with the
version bump, so a crash mid-migration leaves the previous version intact. Never edit a released
migration; append a new one to ``MIGRATIONS``.
"""

from __future__ import annotations

import json
from typing import Callable

from sqlite_utils import Database

from .errors import ArchiveError

#: Condition shared by the partial index on measurements and the query that ranks shapes;
#: SQLite uses a partial index only when the query repeats its condition.
RANKED_SHAPE = "accepted = 1 AND timing IN ('graph', 'eager') AND time_us IS NOT NULL"

OUR_TABLES = ("tasks", "runs", "environments", "attempts", "measurements", "tallies", "audits", "judge_baselines")


def _v1_initial(db: Database) -> None:
    db["tasks"].create(
        {"id": int, "name": str, "source_hash": str, "spec": str, "created": str},
        pk="id", not_null={"name", "source_hash", "spec", "created"},
    )
    db["tasks"].create_index(["name", "source_hash"], unique=True)

    db["runs"].create(
        {
            "id": int, "config": str, "started": str, "ended": str, "status": str,
            "attempts": int, "tokens_in": int, "tokens_out": int, "cost_usd": float,
            "seconds": float, "resumes": int,
        },
        pk="id", not_null={"config", "started", "status"},
        defaults={"attempts": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "seconds": 0.0, "resumes": 0},
    )

    db["environments"].create(
        {"key": str, "gpu": str, "driver": str, "cuda": str, "torch": str, "triton": str, "info": str, "created": str},
        pk="key", not_null={"info", "created"},
    )

    db["attempts"].create(
        {
            "id": int, "run_id": int, "seq": int, "task_id": int, "parent_id": int, "reuse_of": int,
            "proposer": str, "model": str, "prompt": str, "response": str,
            "code": str, "code_hash": str,
            "tokens_in": int, "tokens_out": int, "cost_usd": float, "latency_s": float,
            # the verdict; per-shape results live in measurements
            "status": str, "accepted": int, "threat": int, "reason": str, "evidence": str,
            "env_key": str, "gpu": str, "n_shapes": int,
            # see score.py; NULL unless accepted with GPU timings, and on reuse rows
            "score": float, "speedup_eager": float, "pct_roofline": float,
            "created": str,
        },
        pk="id",
        foreign_keys=[
            ("run_id", "runs", "id"), ("task_id", "tasks", "id"), ("parent_id", "attempts", "id"),
            ("reuse_of", "attempts", "id"), ("env_key", "environments", "key"),
        ],
        not_null={
            "run_id", "seq", "task_id", "code", "code_hash", "status", "accepted", "reason",
            "evidence", "env_key", "gpu", "n_shapes", "created",
        },
    )
    # idempotency key: a killed run re-recording its last attempt finds it here
    db["attempts"].create_index(["run_id", "seq"], unique=True)
    # population: newest accepted / newest failures of a task
    db["attempts"].create_index(["task_id", "accepted", "id"])
    # content addressing: one evaluation per (task, code, environment); reuse rows point at it
    db.execute(
        "CREATE UNIQUE INDEX attempts_content ON attempts (task_id, code_hash, env_key) WHERE reuse_of IS NULL"
    )
    db.execute("CREATE INDEX attempts_reuse ON attempts (reuse_of) WHERE reuse_of IS NOT NULL")
    # best per task/GPU and the population's top: a seek, whatever the archive's size
    db.execute("CREATE INDEX attempts_ranked ON attempts (task_id, gpu, score DESC) WHERE score IS NOT NULL")

    db["measurements"].create(
        {
            "id": int, "attempt_id": int, "idx": int,
            # copied from the attempt (never updated) so per-shape ranking needs no join
            "task_id": int, "gpu": str, "accepted": int,
            "shape": str, "label": str, "hidden": int, "dtype": str, "timing": str,
            "time_us": float, "spread_pct": float, "eager_us": float, "compile_us": float,
            "speedup_eager": float, "speedup_compile": float, "gbps": float, "tflops": float,
            "pct_bandwidth": float, "pct_flops": float, "pct_roofline": float, "floor_us": float,
            "max_abs_err": float, "max_rel_err": float,
        },
        pk="id",
        foreign_keys=[("attempt_id", "attempts", "id")],
        not_null={"attempt_id", "idx", "task_id", "gpu", "accepted", "shape", "label", "hidden", "dtype", "timing"},
    )
    db["measurements"].create_index(["attempt_id", "idx"], unique=True)
    db.execute(f"CREATE INDEX measurements_ranked ON measurements (task_id, gpu, label, time_us) WHERE {RANKED_SHAPE}")

    # Running totals per (task, proposer, model, status, threat), bumped in the same transaction
    # as each attempt, so `stats` reads a few hundred rows instead of every attempt.
    # threat 0 means none (NULL would defeat the primary key).
    db["tallies"].create(
        {
            "task_id": int, "proposer": str, "model": str, "status": str, "threat": int,
            "attempts": int, "reused": int, "tokens_in": int, "tokens_out": int, "cost_usd": float,
        },
        pk=("task_id", "proposer", "model", "status", "threat"),
        foreign_keys=[("task_id", "tasks", "id")],
        not_null={"attempts", "reused", "tokens_in", "tokens_out", "cost_usd"},
    )

    db["attempts"].enable_fts(["code", "reason"], create_triggers=True)


def _v2_audits(db: Database) -> None:
    """The audit of a would-be best (verifier/audit.py): the code judged again in a fresh worker on
    fresh inputs, its time confirmed. An attempt may be audited several times; its latest audit
    decides whether it can be a best (queries.py). Rows are only ever added, never updated."""
    db["audits"].create(
        {
            "id": int, "attempt_id": int,
            # the run that made the audit; NULL for `kernforge archive audit`
            "run_id": int,
            # copied from the attempt (never updated) so "best per task and GPU" reads no attempts to
            # find the audited ones
            "task_id": int, "gpu": str,
            "passed": int, "reason": str,
            # geometric means over the shapes both verdicts timed on the GPU (microseconds)
            "recorded_us": float, "measured_us": float,
            # the second verdict (JSON, verdict.to_dict()), NULL when none was made; the audit's details
            "verdict": str, "details": str,
            "created": str,
        },
        pk="id",
        foreign_keys=[("attempt_id", "attempts", "id"), ("run_id", "runs", "id"), ("task_id", "tasks", "id")],
        not_null={"attempt_id", "task_id", "gpu", "passed", "reason", "details", "created"},
    )
    # the latest audit of an attempt: a seek
    db["audits"].create_index(["attempt_id", "id"])
    # the audited attempts of a task on a GPU model
    db["audits"].create_index(["task_id", "gpu", "attempt_id"])


def _v3_run_owner(db: Database) -> None:
    """Who is running a run now, so a second process cannot resume it meanwhile: ``owner`` names
    the process (host, boot, pid, start time; NULL once the run stopped), ``heartbeat`` is when it
    last said it is alive (every few seconds), and ``seconds`` becomes the run's wall time so far."""
    db["runs"].add_column("owner", str)
    db["runs"].add_column("heartbeat", str)


def _v4_library_baseline(db: Database) -> None:
    """The third baseline per shape: a production kernel library's time (``library_us``), the
    speedup over it, and which library and version (verifier/library.py). NULL where no library
    covers the task or none was installed."""
    db["measurements"].add_column("library_us", float)
    db["measurements"].add_column("speedup_library", float)
    db["measurements"].add_column("library", str)


def _v5_baselines(db: Database) -> None:
    """The judge's baselines (eager, torch.compile, a library, per task version, shape, batch and
    software stack: ``verifier/judge.py`` keys them), kept with the attempts: a run on a fresh
    machine (a new container each night, a resumed benchmark on another lease) starts with the
    baselines an earlier run measured instead of measuring them again before its first verdicts."""
    db["judge_baselines"].create({"key": str, "figures": str, "recorded": str}, pk="key")


def _v6_public_scores(db: Database) -> None:
    """Scores over the public shapes only (score.py): routine verdicts stopped timing the hidden
    shapes (an audit times them), so an attempt whose score took its hidden shapes in is scored
    again from its public measurements, and old and new attempts rank on the same shapes. The
    measurements themselves are kept as they were measured."""
    from kernforge.verifier.verdict import ShapeResult

    from .score import summarize

    names = {f for f in ShapeResult.__dataclass_fields__}
    scored = [r[0] for r in db.execute("SELECT id FROM attempts WHERE score IS NOT NULL OR speedup_eager IS NOT NULL")]
    for attempt_id in scored:
        cur = db.execute("SELECT * FROM measurements WHERE attempt_id = ? ORDER BY idx", [attempt_id])
        cols = [c[0] for c in cur.description]
        shapes = []
        for row in cur.fetchall():
            values = {k: v for k, v in zip(cols, row) if k in names}
            shapes.append(ShapeResult.from_dict(values | {"shape": json.loads(values["shape"]), "hidden": bool(values["hidden"])}))
        figures = summarize(shapes)
        db.execute("UPDATE attempts SET score = ?, speedup_eager = ?, pct_roofline = ? WHERE id = ?",
                   [figures["score"], figures["speedup_eager"], figures["pct_roofline"], attempt_id])


def _v7_judge(db: Database) -> None:
    """Which judge made each audit (verifier/revision.py's fingerprint; NULL before judges were
    fingerprinted): only an audit by the installed judge makes a best (queries.py). A verdict's
    judge is in its environment (its ``info``, and so its key: a verdict is reused only by the
    judge that made it)."""
    db["audits"].add_column("judge", str)
    db["audits"].create_index(["task_id", "gpu", "judge", "attempt_id"])


def _v8_record_method(db: Database) -> None:
    """How each shape's time of record was reached (ShapeResult.method: "difference", "single", or
    "difference, bounded" where the guard set it, a bound the display marks as such); NULL for the
    measurements made before it was kept."""
    db["measurements"].add_column("method", str)


MIGRATIONS: tuple[Callable[[Database], None], ...] = (_v1_initial, _v2_audits, _v3_run_owner, _v4_library_baseline,
                                                      _v5_baselines, _v6_public_scores, _v7_judge, _v8_record_method)
LATEST = len(MIGRATIONS)
#: Migrations a read-only reader can do without: they add nothing any query needs (an archive
#: missing only these is read as it is, a missing measurement column as NULL; the next writer
#: migrates it). v6's scores too: before it, every attempt of an archive was scored on the same
#: (public and hidden) shapes, so its ranking is consistent as it stands; attempts scored the new
#: way join it only through a writer, which migrates first.
#: v7's column is read as NULL (no judge) through a temporary view (store.Archive._prepare).
READ_COMPATIBLE = frozenset({_v3_run_owner, _v4_library_baseline, _v5_baselines, _v6_public_scores, _v7_judge,
                             _v8_record_method})


def version(db: Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def check(db: Database, path: str) -> int:
    """The schema version, after checking the file is a kernforge archive this code can read."""
    current = version(db)
    if current > LATEST:
        raise ArchiveError(
            f"{path} has archive schema v{current}, newer than this kernforge knows (v{LATEST}); upgrade kernforge"
        )
    if current == 0 and db.table_names():
        raise ArchiveError(f"{path} is a SQLite file but not a kernforge archive (tables: {', '.join(db.table_names()[:5])})")
    return current


def pending(db: Database, path: str) -> tuple[Callable[[Database], None], ...]:
    return MIGRATIONS[check(db, path):]


def apply(db: Database, migration: Callable[[Database], None], to_version: int) -> None:
    """Run one migration; the caller holds the write transaction."""
    migration(db)
    db.execute(f"PRAGMA user_version = {int(to_version)}")
