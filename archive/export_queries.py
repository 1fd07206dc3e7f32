"""What ``kernforge export`` reads from the archive that queries.py does not offer.

``best_per_shape`` ranks GPU timings only and ``best`` needs a score; the export also wants
kernels verified under the Triton interpreter (score NULL by design, see score.py) and, for
each accepted evaluation, every shape it was checked on with the environment it ran in. One
query per task version returns all of that; reuse rows are skipped (they hold no measurements
of their own, and their original is already in the result).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Mapping

from kernforge.verifier.verdict import ShapeResult

from .queries import explain
from .store import Archive


@dataclass(frozen=True)
class TaskVersion:
    """One row of ``tasks``: a task name and the hash of what judged its verdicts."""

    id: int
    name: str
    source_hash: str


@dataclass(frozen=True)
class Measured:
    """One shape of one accepted evaluation, with the attempt's environment."""

    attempt_id: int
    environment: Mapping[str, Any]
    shape: ShapeResult


def task_versions(archive: Archive) -> list[TaskVersion]:
    """Every task version in the archive, by name then id."""
    try:
        rows = archive.conn.execute("SELECT id, name, source_hash FROM tasks ORDER BY name, id").fetchall()
    except sqlite3.Error as error:
        raise explain(archive.path, error) from None
    return [TaskVersion(*row) for row in rows]


def accepted_count(archive: Archive, task_id: int) -> int:
    """How many accepted evaluations (not reuse rows) one task version has."""
    try:
        return archive.conn.execute(
            "SELECT count(*) FROM attempts WHERE task_id = ? AND accepted = 1 AND reuse_of IS NULL", (task_id,)
        ).fetchone()[0]
    except sqlite3.Error as error:
        raise explain(archive.path, error) from None


def accepted_shapes(archive: Archive, task_id: int) -> list[Measured]:
    """Every shape of every accepted evaluation (not reuse rows) of one task version.

    Shapes without a time are included: they still say which sizes the kernel was verified on.
    """
    columns = [f.name for f in ShapeResult.__dataclass_fields__.values()]
    try:
        cursor = archive.conn.execute(
            "SELECT m.attempt_id, e.info, m.* FROM measurements m"
            " JOIN attempts a ON a.id = m.attempt_id JOIN environments e ON e.key = a.env_key"
            " WHERE m.task_id = ? AND m.accepted = 1 AND a.reuse_of IS NULL ORDER BY m.attempt_id, m.idx",
            (task_id,),
        )
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    except sqlite3.Error as error:
        raise explain(archive.path, error) from None
    out = []
    for row in rows:
        values = dict(zip(names[2:], row[2:]))
        shape = {k: values[k] for k in columns if k in values}
        shape |= {"shape": json.loads(values["shape"]), "hidden": bool(values["hidden"])}
        out.append(Measured(attempt_id=row[0], environment=json.loads(row[1]), shape=ShapeResult.from_dict(shape)))
    return out
