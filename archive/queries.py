"""Reading the archive: attempts, content lookups, best, audits, population, lineage, stats, search, SQL.

``Queries`` is mixed into ``Archive`` (store.py); it needs ``self.conn``, ``self.db`` and
``self.path``. Every public method turns SQLite's errors into ``ArchiveError`` (``guarded``).

**Best means audited.** An attempt can be a best (``best``, ``best_per_shape``, the export, the
population's ``audited``) only when its latest audit passed: judged again in a fresh worker on
fresh inputs, accepted again and about as fast (verifier/audit.py). An attempt never audited, or
whose latest audit failed (demoted), stays an accepted attempt and a possible parent, never a best.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from sqlite_utils import Database

from kernforge.verifier import revision
from kernforge.verifier.audit import Audit
from kernforge.verifier.verdict import BOUNDED, SAW_HIDDEN, ShapeResult, Verdict, verdict_from_dict

from .content import code_hash, environment_fields, environment_key
from .errors import ArchiveError, ReadOnlyError
from .records import (AttemptRecord, AttemptSummary, AuditRecord, AwaitingAudit, BestEntry, Population, ShapeBest, TaskBaselines,
                      StatRow, Stats)
from .schema import RANKED_SHAPE
from .score import near_tie_band

_SHAPE_FIELDS = tuple(f.name for f in fields(ShapeResult))
_ATTEMPT_FIELDS = tuple(f.name for f in fields(AttemptRecord) if f.name != "verdict")
_SUMMARY = (
    "SELECT a.id, t.name AS task, a.status, a.reason, a.created, a.parent_id, a.threat, a.model,"
    " a.proposer, a.score, a.gpu, a.reuse_of FROM attempts a JOIN tasks t ON t.id = a.task_id"
)
#: Rejections a parent may be repaired from; cheats and sandbox violations are never evolved.
REPAIRABLE = ("static_rejected", "compile_error", "runtime_error", "incorrect", "timeout", "crashed")
#: PRAGMAs ``sql`` allows: they only read. Any other PRAGMA (optimize, wal_checkpoint, ...) may write.
_READ_PRAGMAS = {
    "application_id", "collation_list", "compile_options", "data_version", "database_list", "encoding",
    "foreign_key_check", "foreign_key_list", "freelist_count", "function_list", "index_info", "index_list",
    "index_xinfo", "integrity_check", "journal_mode", "module_list", "page_count", "page_size", "pragma_list",
    "quick_check", "schema_version", "table_info", "table_list", "table_xinfo", "user_version",
}
#: ... and these of them with an argument (a table or index name, or a row limit); with one, the
#: others would set a value
_ARG_PRAGMAS = {
    "foreign_key_check", "foreign_key_list", "index_info", "index_list", "index_xinfo", "integrity_check",
    "quick_check", "table_info", "table_xinfo", "table_list",
}
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
#: The latest audit of each audited attempt of one task on one GPU model (parameters: task id, GPU).
#: SQLite takes the bare column ``passed`` from the row holding ``max(id)``: the latest audit.
#: Only the installed judge's audits count (verifier/revision.py): one by an earlier judge, which
#: may have accepted what this one rejects, leaves the attempt awaiting an audit again.
_JUDGE = revision.fingerprint()
assert revision.FORMAT.fullmatch(_JUDGE)  # written into the SQL below as a literal
#: an audits row's condition: made by the installed judge
CURRENT_AUDIT = f"judge = '{_JUDGE}'"
_LATEST_AUDITS = ("SELECT attempt_id, passed, max(id) AS audit_id FROM audits WHERE task_id = ? AND gpu = ?"
                  f" AND {CURRENT_AUDIT} GROUP BY attempt_id")
#: Whether an attempt row ``a``'s evaluation passed its latest audit by the installed judge (1, 0,
#: or NULL: never audited by it)
_AUDIT_PASSED = ("(SELECT u.passed FROM audits u WHERE u.attempt_id = coalesce(a.reuse_of, a.id)"
                 f" AND u.judge = '{_JUDGE}' ORDER BY u.id DESC LIMIT 1)")


def explain(path: Path, error: sqlite3.Error) -> ArchiveError:
    text = str(error)
    if "locked" in text or "busy" in text:
        return ArchiveError(f"{path} is busy: another process held its write lock past the busy timeout; try again")
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return ArchiveError(f"{path} is corrupt or not a kernforge archive: {text}")
    if "readonly" in text or "read-only" in text:
        return ReadOnlyError(f"{path} is open read-only: {text}")
    return ArchiveError(f"{path}: {text}")


def guarded(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as error:
            raise explain(self.path, error) from None

    return wrapper


def _shape(row: Mapping[str, Any]) -> ShapeResult:
    values = {k: row[k] for k in _SHAPE_FIELDS if k in row}
    return ShapeResult.from_dict(values | {"shape": json.loads(row["shape"]), "hidden": bool(row["hidden"])})


def _audit(row: Mapping[str, Any]) -> AuditRecord:
    audit = Audit.from_dict({
        "passed": bool(row["passed"]), "reason": row["reason"], "recorded_us": row["recorded_us"],
        "measured_us": row["measured_us"], "verdict": json.loads(row["verdict"]) if row["verdict"] else None,
        "details": json.loads(row["details"]),
    })
    return AuditRecord(id=row["id"], attempt_id=row["attempt_id"], task_id=row["task_id"], gpu=row["gpu"],
                       created=row["created"], audit=audit, run_id=row["run_id"], judge=row.get("judge"))


class Queries:
    conn: sqlite3.Connection
    db: Database
    path: Path

    # ---- attempts --------------------------------------------------------------------------
    @guarded
    def get_attempt(self, attempt_id: int) -> AttemptRecord:
        found = self._records("a.id = ?", [attempt_id])
        if not found:
            raise ArchiveError(f"no attempt {attempt_id} in {self.path}")
        return found[0]

    @guarded
    def lookup(self, task_id: int, code: str, environment: Mapping[str, Any] | str) -> AttemptRecord | None:
        """The earlier evaluation of this code (normalised) for this task in this environment."""
        key = environment if isinstance(environment, str) else environment_key(environment)
        found = self._records(
            "a.task_id = ? AND a.code_hash = ? AND a.env_key = ? AND a.reuse_of IS NULL",
            [task_id, code_hash(code), key],
        )
        return found[0] if found else None

    @guarded
    def tasks_judged_on(self, environment: Mapping[str, Any]) -> set[int]:
        """Ids of the tasks with an attempt judged on this GPU, driver, CUDA, torch and Triton, by
        any judge: their baselines, which no judge's fingerprint keys, are in the archive already."""
        return self._tasks_on(environment, "attempts a")

    @guarded
    def tasks_audited_on(self, environment: Mapping[str, Any]) -> set[int]:
        """Ids of the tasks with an audit that made its second verdict, of an attempt judged on this
        GPU, driver, CUDA, torch and Triton: an audit times the hidden shapes, so their baselines
        are in the archive too (a routine verdict times the public shapes only)."""
        return self._tasks_on(environment, "audits u JOIN attempts a ON a.id = u.attempt_id", "u.verdict IS NOT NULL")

    def _tasks_on(self, environment: Mapping[str, Any], source: str, *conditions: str) -> set[int]:
        """The task ids of ``source``'s attempts (alias ``a``) judged in ``environment``'s fields."""
        fields_ = environment_fields(environment, columns=True)
        names = sorted(fields_)
        where = " AND ".join([*conditions, *(f"e.{name} IS ?" for name in names)])
        rows = self.conn.execute(f"SELECT DISTINCT a.task_id FROM {source} JOIN environments e ON e.key = a.env_key "
                                 f"WHERE {where}", [fields_[name] for name in names])
        return {r[0] for r in rows}

    @guarded
    def reuse_count(self, attempt_id: int) -> int:
        """How many later proposals reused this attempt's verdict instead of being evaluated."""
        return self.conn.execute("SELECT count(*) FROM attempts WHERE reuse_of = ?", (attempt_id,)).fetchone()[0]

    def _records(self, where: str, params: list[Any], order: str = "") -> list[AttemptRecord]:
        rows = list(self.db.query(f"SELECT a.*, t.name AS task, {_AUDIT_PASSED} AS audit_passed FROM attempts a"
                                  f" JOIN tasks t ON t.id = a.task_id WHERE {where} {order}", params))
        for row in rows:
            row["audit_passed"] = None if row["audit_passed"] is None else bool(row["audit_passed"])
        return [AttemptRecord(**{k: row[k] for k in _ATTEMPT_FIELDS if k in row}, verdict=verdict)
                for row, verdict in zip(rows, self._verdicts(rows))]

    def _verdicts(self, rows: list[Mapping[str, Any]]) -> list[Verdict]:
        """The verdict of each attempt row; a row needs its id, reuse_of, status, reason, threat,
        evidence and env_key."""
        if not rows:
            return []
        # a reuse row shows its original's measurements: the verdict it reused
        sources = {row["reuse_of"] or row["id"] for row in rows}
        marks = ",".join("?" * len(sources))
        shapes: dict[int, list[ShapeResult]] = {}
        for m in self.db.query(f"SELECT * FROM measurements WHERE attempt_id IN ({marks}) ORDER BY attempt_id, idx",
                               list(sources)):
            shapes.setdefault(m["attempt_id"], []).append(_shape(m))
        keys = {row["env_key"] for row in rows}
        envs = {e["key"]: json.loads(e["info"]) for e in self.db.query(
            f"SELECT key, info FROM environments WHERE key IN ({','.join('?' * len(keys))})", list(keys))}
        out = []
        for row in rows:
            evidence = json.loads(row["evidence"])
            out.append(verdict_from_dict({
                "status": row["status"], "reason": row["reason"], "threat": row["threat"], "evidence": evidence,
                "flags": evidence.get("flags", ()), "environment": envs.get(row["env_key"], {}),
                "shapes": [s.to_dict() for s in shapes.get(row["reuse_of"] or row["id"], ())],
            }))
        return out

    # ---- best ------------------------------------------------------------------------------
    def _tasks(self, name: str | None) -> list[dict[str, Any]]:
        rows = list(self.db.query("SELECT id, name, source_hash FROM tasks ORDER BY name, id"))
        if name is None:
            return rows
        chosen = [r for r in rows if r["name"] == name]
        if not chosen:
            known = ", ".join(sorted({r["name"] for r in rows})) or "none"
            raise ArchiveError(f"no task named {name!r} in {self.path} (tasks: {known})")
        return chosen

    def _gpus(self, pattern: str | None) -> list[str]:
        gpus = [r[0] for r in self.conn.execute("SELECT DISTINCT gpu FROM environments WHERE gpu IS NOT NULL ORDER BY gpu")]
        if pattern is None:
            return gpus
        chosen = [g for g in gpus if pattern.lower() in g.lower()]
        if not chosen:
            raise ArchiveError(f"no GPU matching {pattern!r} in {self.path} (GPUs: {', '.join(gpus) or 'none'})")
        return chosen

    def _best_audited(self, task_id: int, gpu: str) -> tuple[int, int] | None:
        """(attempt id, audit id) of the best attempt by score whose latest audit passed."""
        return self.conn.execute(
            f"SELECT a.id, l.audit_id FROM ({_LATEST_AUDITS}) l JOIN attempts a ON a.id = l.attempt_id"
            " WHERE l.passed = 1 AND a.score IS NOT NULL ORDER BY a.score DESC, a.id LIMIT 1", (task_id, gpu)).fetchone()

    def _passed_ids(self, task_id: int, gpu: str) -> list[int]:
        """The attempts of a task on a GPU model whose latest audit passed."""
        rows = self.conn.execute(f"SELECT attempt_id FROM ({_LATEST_AUDITS}) WHERE passed = 1 ORDER BY attempt_id",
                                 (task_id, gpu))
        return [r[0] for r in rows]

    @guarded
    def gpu_models(self) -> list[str]:
        """The GPU models the archive holds verdicts from (the interpreter is not one)."""
        return self._gpus(None)

    @guarded
    def best_for(self, record: AttemptRecord) -> BestEntry | None:
        """The audited best of ``record``'s task version on its GPU model; None where there is none."""
        return next((b for b in self.best(task=record.task) if b.task_id == record.task_id and b.gpu == record.gpu), None)

    @guarded
    def best(self, task: str | None = None, gpu: str | None = None) -> list[BestEntry]:
        """The best attempt by score (score.py) for each task version and GPU model, among the
        attempts whose latest audit passed (see the module docstring).

        The audits are few (a new best's, and ``kernforge archive audit``'s), and the query reads
        only them and their attempts, so the cost does not grow with the archive.
        """
        winners = []
        for t in self._tasks(task):
            for g in self._gpus(gpu):
                row = self._best_audited(t["id"], g)
                if row:
                    winners.append((t, *row))
        ids = [attempt_id for _, attempt_id, _ in winners]
        records = {r.id: r for r in self._records(f"a.id IN ({','.join('?' * len(ids))})", ids)} if ids else {}
        audits = self._audits_by_id([audit_id for *_, audit_id in winners])
        out = []
        for t, attempt_id, audit_id in winners:
            a = records[attempt_id]
            out.append(BestEntry(
                task=t["name"], task_id=t["id"], source_hash=t["source_hash"], gpu=a.gpu, attempt_id=a.id,
                score=a.score, speedup_eager=a.speedup_eager, pct_roofline=a.pct_roofline, model=a.model,
                created=a.created, shapes=tuple(a.verdict.shapes), audit=audits[audit_id],
            ))
        return out

    @guarded
    def best_per_shape(self, task: str | None = None, gpu: str | None = None) -> list[ShapeBest]:
        """The fastest accepted GPU time per shape label (for dispatch by shape), of any attempt
        whose latest audit passed."""
        out = []
        for t in self._tasks(task):
            for g in self._gpus(gpu):
                ids = self._passed_ids(t["id"], g)
                if not ids:
                    continue
                fastest: dict[str, Mapping[str, Any]] = {}
                for m in self.db.query(
                    f"SELECT * FROM measurements WHERE attempt_id IN ({','.join('?' * len(ids))}) AND {RANKED_SHAPE}"
                    " ORDER BY label, time_us, attempt_id", ids):
                    fastest.setdefault(m["label"], m)
                for label, m in fastest.items():
                    out.append(ShapeBest(
                        task=t["name"], gpu=g, label=label, attempt_id=m["attempt_id"], time_us=m["time_us"],
                        hidden=bool(m["hidden"]), dtype=m["dtype"], speedup_eager=m["speedup_eager"],
                        speedup_compile=m["speedup_compile"], pct_roofline=m["pct_roofline"],
                        bounded=m.get("method") == BOUNDED,
                    ))
        return out

    @guarded
    def baselines(self, task: str, source_hash: str | None = None) -> list[TaskBaselines]:
        """Per GPU model, the baselines of ``task`` (the version with ``source_hash``, else its
        newest) from its newest accepted GPU-timed attempt; none when it has none."""
        versions = [r for r in self.db.query("SELECT id, source_hash FROM tasks WHERE name = ? ORDER BY id DESC", [task])
                    if source_hash is None or r["source_hash"] == source_hash]
        if not versions:
            return []
        task_id = versions[0]["id"]
        newest = self.conn.execute(
            "SELECT gpu, max(id) FROM attempts a WHERE task_id = ? AND accepted = 1 AND reuse_of IS NULL AND EXISTS"
            " (SELECT 1 FROM measurements m WHERE m.attempt_id = a.id AND m.timing IN ('graph', 'eager'))"
            " GROUP BY gpu ORDER BY gpu", (task_id,)).fetchall()
        records = {r.id: r for r in self._records(f"a.id IN ({','.join('?' * len(newest))})", [i for _, i in newest])} \
            if newest else {}
        return [TaskBaselines(task=task, gpu=gpu, attempt_id=i, shapes=tuple(records[i].verdict.shapes)) for gpu, i in newest]

    # ---- audits ----------------------------------------------------------------------------
    def _audits_by_id(self, ids: list[int]) -> dict[int, AuditRecord]:
        if not ids:
            return {}
        rows = self.db.query(f"SELECT * FROM audits WHERE id IN ({','.join('?' * len(ids))})", ids)
        return {row["id"]: _audit(row) for row in rows}

    @guarded
    def audits(self, attempt_id: int) -> list[AuditRecord]:
        """Every audit of an attempt's evaluation (the original, for a reuse row), oldest first."""
        row = self.conn.execute("SELECT coalesce(reuse_of, id) FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        if row is None:
            raise ArchiveError(f"no attempt {attempt_id} in {self.path}")
        return [_audit(r) for r in self.db.query("SELECT * FROM audits WHERE attempt_id = ? ORDER BY id", [row[0]])]

    @guarded
    def latest_audits(self, attempt_ids: Sequence[int], any_judge: bool = False) -> dict[int, AuditRecord]:
        """The latest audit by the installed judge of each of these attempts that has one
        (``any_judge``: by whichever judge, for a record of what an earlier run measured)."""
        ids = sorted(set(attempt_ids))
        if not ids:
            return {}
        judge = "" if any_judge else f" AND {CURRENT_AUDIT}"
        last = [r[0] for r in self.conn.execute(
            f"SELECT max(id) FROM audits WHERE attempt_id IN ({','.join('?' * len(ids))}){judge} GROUP BY attempt_id", ids)]
        return {a.attempt_id: a for a in self._audits_by_id(last).values()}

    @guarded
    def earlier_audits(self) -> int:
        """How many audits an earlier judge made (or one from before judges were fingerprinted)."""
        return self.conn.execute(f"SELECT count(*) FROM audits WHERE coalesce({CURRENT_AUDIT}, 0) = 0").fetchone()[0]

    @guarded
    def awaiting_audit(self, task: str | None = None, gpu: str | None = None) -> list[AwaitingAudit]:
        """Each task version and GPU model with accepted, scored attempts but no best: none of them
        passed its latest audit (never audited, or demoted)."""
        out = []
        for t in self._tasks(task):
            for g in self._gpus(gpu):
                if self._best_audited(t["id"], g):
                    continue
                accepted = self.conn.execute(
                    "SELECT count(*) FROM attempts WHERE task_id = ? AND gpu = ? AND score IS NOT NULL",
                    (t["id"], g)).fetchone()[0]
                if not accepted:
                    continue
                audited, failed = self.conn.execute(
                    f"SELECT count(*), coalesce(sum(l.passed = 0), 0) FROM ({_LATEST_AUDITS}) l"
                    " JOIN attempts a ON a.id = l.attempt_id WHERE a.score IS NOT NULL", (t["id"], g)).fetchone()
                earlier = self.conn.execute(
                    "SELECT count(DISTINCT u.attempt_id) FROM audits u JOIN attempts a ON a.id = u.attempt_id"
                    f" WHERE u.task_id = ? AND u.gpu = ? AND a.score IS NOT NULL AND u.passed = 1 AND coalesce(u.{CURRENT_AUDIT}, 0) = 0"
                    f" AND u.attempt_id NOT IN (SELECT attempt_id FROM audits WHERE task_id = ? AND {CURRENT_AUDIT})",
                    (t["id"], g, t["id"])).fetchone()[0]
                out.append(AwaitingAudit(task=t["name"], gpu=g, accepted=accepted, audited=audited, failed=failed,
                                         earlier=earlier))
        return out

    @guarded
    def audit_candidates(self, task_id: int, gpu: str, limit: int) -> list[AttemptRecord]:
        """A task version's scored evaluations on a GPU model, best first, leaving out the demoted
        (latest audit failed) and the near-ties of its audited best (never audited, less than
        ``score.MIN_GAIN`` above it: within the judge's noise, which no run audits either): what
        ``kernforge archive audit`` goes through until one passes."""
        best = self._best_audited(task_id, gpu)
        score = self.conn.execute("SELECT score FROM attempts WHERE id = ?", (best[0],)).fetchone()[0] if best else None
        tie = (f" AND NOT (a.score > ? AND a.score <= ? AND {_AUDIT_PASSED} IS NULL)", near_tie_band(score)) \
            if score is not None else ("", ())
        ids = [r[0] for r in self.conn.execute(
            f"SELECT a.id FROM attempts a WHERE a.task_id = ? AND a.gpu = ? AND a.score IS NOT NULL"
            f" AND coalesce({_AUDIT_PASSED}, 1) = 1{tie[0]} ORDER BY a.score DESC, a.id LIMIT ?",
            (task_id, gpu, *tie[1], int(limit)))]
        records = {r.id: r for r in self._records(f"a.id IN ({','.join('?' * len(ids))})", ids)} if ids else {}
        return [records[i] for i in ids]

    @guarded
    def task_refs(self) -> dict[str, str]:
        """How each task was named when a run loaded it (a built-in name, a file or a folder): the
        newest run's reference per task name."""
        refs: dict[str, str] = {}
        for (config,) in self.conn.execute("SELECT config FROM runs ORDER BY id"):
            stored = json.loads(config).get("task_refs")
            if isinstance(stored, Mapping):
                refs.update({str(k): str(v) for k, v in stored.items()})
        return refs

    # ---- parents ---------------------------------------------------------------------------
    @guarded
    def population(self, task_id: int, gpu: str | None = None, *, top: int = 8, diverse: int = 4,
                   recent: int = 4, failures: int = 4, env_key: str | None = None) -> Population:
        """Parents and inspirations for one task on one GPU model (see ``Population``).

        Pass the GPU the loop runs on: with ``gpu=None`` scores of different GPUs are mixed (and
        ``audited`` is empty: a best is per GPU model). ``env_key``: only verdicts of that
        environment, the judge among it (the CPU's, which no audit confirms: an earlier judge's
        acceptance is no best of this one's).
        """
        chosen: set[str] = set()

        def pick(where: str, params: list[Any], order: str, k: int, offset: int = 0) -> list[int]:
            # ids first (index only), a few spare: some may repeat code already picked
            rows = self.conn.execute(
                f"SELECT a.id, a.code_hash FROM attempts a WHERE {where} {order}"
                f" LIMIT {int(max(k, 0) * 3)} OFFSET {int(offset)}", params)
            picked = []
            for attempt_id, digest in rows:
                if len(picked) < k and digest not in chosen:
                    chosen.add(digest)
                    picked.append(attempt_id)
            return picked

        scope, args = ("a.task_id = ? AND a.gpu = ?", [task_id, gpu]) if gpu else ("a.task_id = ?", [task_id])
        if env_key is not None:
            scope, args = scope + " AND a.env_key = ?", args + [env_key]
        ranked = f"{scope} AND a.score IS NOT NULL"
        sections = {"top": pick(ranked, args, "ORDER BY a.score DESC", top), "diverse": []}
        best = self._best_audited(task_id, gpu) if gpu else None
        sections["audited"] = pick("a.id = ?", [best[0]], "", 1) if best else []
        scored = self.conn.execute(f"SELECT count(*) FROM attempts a WHERE {ranked}", args).fetchone()[0]
        below = scored - top
        for i in range(diverse if below > 0 else 0):
            sections["diverse"] += pick(ranked, args, "ORDER BY a.score DESC", 1, top + (i * below) // diverse)
        sections["recent"] = pick(f"{scope} AND a.accepted = 1 AND a.reuse_of IS NULL", args, "ORDER BY a.id DESC", recent)
        marks = ",".join("?" * len(REPAIRABLE))
        # a rejection made after a hidden shape is repairable whatever its status (loop/search.Member.repairable)
        sections["failures"] = pick(f"{scope} AND a.accepted = 0 AND a.reuse_of IS NULL AND (a.status IN ({marks})"
                                    f" OR coalesce(json_extract(a.evidence, '$.{SAW_HIDDEN}'), 0) = 1)",
                                    args + list(REPAIRABLE), "ORDER BY a.id DESC", failures)
        ids = [i for section in sections.values() for i in section]
        records = {r.id: r for r in self._records(f"a.id IN ({','.join('?' * len(ids))})", ids)} if ids else {}
        return Population(**{name: tuple(records[i] for i in section) for name, section in sections.items()})

    @guarded
    def lineage(self, attempt_id: int) -> list[AttemptSummary]:
        """The attempt's ancestors by parent, from the root to the attempt itself."""
        rows = list(self.db.query(
            "WITH RECURSIVE chain(id, depth) AS (SELECT ?, 0 UNION ALL SELECT a.parent_id, c.depth + 1"
            " FROM attempts a JOIN chain c ON a.id = c.id WHERE a.parent_id IS NOT NULL)"
            f" SELECT s.* FROM chain c JOIN ({_SUMMARY}) s ON s.id = c.id ORDER BY c.depth DESC", [attempt_id]))
        if not rows:
            raise ArchiveError(f"no attempt {attempt_id} in {self.path}")
        return [AttemptSummary.from_dict(r) for r in rows]

    # ---- stats and search ------------------------------------------------------------------
    @guarded
    def stats(self, task: str | None = None) -> Stats:
        """Per task and per model: attempts, acceptance, cheats by THREATS class, tokens, cost."""
        ids = {t["id"] for t in self._tasks(task)}
        per_task: dict[str, dict[str, Any]] = {}
        per_model: dict[str, dict[str, Any]] = {}
        sums = ("sum(l.attempts) AS attempts, sum(l.reused) AS reused, sum(l.tokens_in) AS tokens_in,"
                " sum(l.tokens_out) AS tokens_out, sum(l.cost_usd) AS cost_usd, l.status, l.threat")
        marks = ",".join("?" * len(ids))
        for key, table in (("t.name", per_task), ("coalesce(nullif(l.model, ''), nullif(l.proposer, ''), '-')", per_model)):
            for row in self.db.query(
                f"SELECT {key} AS key, {sums} FROM tallies l JOIN tasks t ON t.id = l.task_id"
                f" WHERE l.task_id IN ({marks}) GROUP BY 1, l.status, l.threat", list(ids),
            ):
                _tally(table.setdefault(row["key"], {"key": row["key"]}), row)
        return Stats(
            per_task=tuple(StatRow.from_dict(v) for _, v in sorted(per_task.items())),
            per_model=tuple(StatRow.from_dict(v) for _, v in sorted(per_model.items())),
        )

    @guarded
    def search(self, text: str, limit: int = 20) -> list[AttemptSummary]:
        """Attempts whose code or verdict reason contains these words (full-text, best first)."""
        if not any(ch.isalnum() for ch in text):
            raise ArchiveError(f"nothing to search for in {text!r}: give words, e.g. `kernforge archive search tl.dot`")
        rows = self.db.query(
            f"{_SUMMARY} JOIN attempts_fts f ON f.rowid = a.id WHERE attempts_fts MATCH ? ORDER BY f.rank LIMIT ?",
            [self.db.quote_fts(text), int(limit)])
        return [AttemptSummary.from_dict(r) for r in rows]

    def sql(self, query: str, limit: int | None = None) -> tuple[list[str], list[tuple], bool]:
        """Run one read-only statement: (columns, rows, truncated). Writes are refused.

        Three locks: the file is opened ``mode=ro`` (CLI) and ``PRAGMA query_only``; an authorizer
        allows only reads (no ATTACH, which could create a file, no PRAGMA that sets anything).
        """

        if not query.strip():
            raise ArchiveError('no query given: `kernforge archive sql "SELECT status, count(*) FROM attempts GROUP BY 1"`'
                               " (tables: tasks, runs, attempts, measurements, audits, environments, tallies)")

        def authorize(action: int, arg1: Any, arg2: Any, _db: Any, _trigger: Any) -> int:
            if action in _ALLOWED_ACTIONS:
                return sqlite3.SQLITE_OK
            if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master":
                # SQLite asks this while connecting a virtual table (FTS5, pragma_* functions);
                # a real write to the schema needs PRAGMA writable_schema, which is refused below
                return sqlite3.SQLITE_OK
            name = str(arg1).lower()
            if action == sqlite3.SQLITE_PRAGMA and name in _READ_PRAGMAS and (arg2 is None or name in _ARG_PRAGMAS):
                return sqlite3.SQLITE_OK
            return sqlite3.SQLITE_DENY

        self.conn.set_authorizer(authorize)
        try:
            cursor = self.conn.execute(query)
            columns = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchall() if limit is None else cursor.fetchmany(limit + 1)
        except (sqlite3.DatabaseError, sqlite3.Warning) as error:
            if any(word in str(error) for word in ("authoriz", "readonly", "may not be modified")):
                raise ReadOnlyError(
                    "refused: `archive sql` is read-only; it runs one query (SELECT, WITH, or a PRAGMA that reads),"
                    " never a statement that writes, attaches or changes settings"
                ) from None
            if isinstance(error, sqlite3.Warning) or "one statement" in str(error):
                raise ArchiveError(f"one statement at a time: {error}") from None
            raise explain(self.path, error) from None
        finally:
            self.conn.set_authorizer(None)
            if self.conn.in_transaction:
                self.conn.rollback()
        if cursor.description is None:
            raise ArchiveError("the query ran no statement (only comments?): give one SELECT, WITH or reading PRAGMA")
        truncated = limit is not None and len(rows) > limit
        return columns, [tuple(r) for r in rows[:limit]], truncated


def _tally(into: dict[str, Any], row: Mapping[str, Any]) -> None:
    for name in ("attempts", "reused", "tokens_in", "tokens_out", "cost_usd"):
        into[name] = into.get(name, 0) + row[name]
    if row["status"] == "accepted":
        into["accepted"] = into.get("accepted", 0) + row["attempts"]
    by_status = into.setdefault("by_status", {})
    by_status[row["status"]] = by_status.get(row["status"], 0) + row["attempts"]
    if row["threat"]:
        cheats = into.setdefault("cheats", {})
        cheats[row["threat"]] = cheats.get(row["threat"], 0) + row["attempts"]
