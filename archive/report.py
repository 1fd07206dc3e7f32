"""The archive for people: the rich tables and panels of ``kernforge archive ...``.

The CLI only parses, calls the archive and prints what these functions build; ``--json`` output
is the records' ``to_dict``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from rich.console import Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kernforge.verifier.verdict import THREATS, ShapeResult, describe

from .records import AttemptRecord, AttemptSummary, AuditRecord, AwaitingAudit, BestEntry, ShapeBest, StatRow, Stats
from .score import is_gpu_timed, roofline_pct


def _num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _shape_lines(shapes: Iterable[ShapeResult]) -> str:
    lines = []
    for s in shapes:
        if s.time_us is not None:
            hidden = " (hidden)" if s.hidden else ""
            lines.append(f"{s.label or '(default)'}{hidden}: {s.time_us:.2f} us")
    return "\n".join(lines) or "-"


def awaiting_lines(awaiting: Sequence[AwaitingAudit]) -> str:
    """Why a task and GPU have no best although they have accepted GPU attempts, and what to run."""
    lines = []
    for w in awaiting:
        audited = f"{w.audited} audited, {w.failed} of them failed" if w.audited else "none audited"
        lines.append(f"{w.task} on {w.gpu}: {w.accepted} accepted GPU attempt(s), none passed an audit ({audited}); "
                     f"`kernforge archive audit --task {w.task}` audits them")
    return "\n".join(lines)


def _caption(table: Table, empty: bool, awaiting: Sequence[AwaitingAudit]) -> None:
    if awaiting:
        table.caption = awaiting_lines(awaiting)
    elif empty:
        table.caption = "no accepted attempt with GPU timings yet (interpreter runs are never ranked)"


def best_table(entries: Sequence[BestEntry], awaiting: Sequence[AwaitingAudit] = ()) -> Table:
    table = Table(title=f"best per task and GPU ({len(entries)})",
                  caption="score = geo-mean speedup vs torch.compile; every best passed its audit")
    for col in ("task", "gpu", "best time per shape", "x eager", "x compile", "% roofline", "attempt", "model", "audit"):
        table.add_column(col, justify="right" if col in ("x eager", "x compile", "% roofline", "attempt") else "left")
    _caption(table, not entries, awaiting)
    for e in entries:
        audit = f"passed: {_num(e.audit.audit.measured_us)} us again" if e.audit else "-"
        table.add_row(e.task, e.gpu, _shape_lines(e.shapes), _num(e.speedup_eager), _num(e.score),
                      _num(e.pct_roofline, ".1f"), str(e.attempt_id), e.model or "-", audit)
    return table


def shape_best_table(rows: Sequence[ShapeBest], awaiting: Sequence[AwaitingAudit] = ()) -> Table:
    table = Table(title=f"fastest accepted time per shape, audited attempts only ({len(rows)})")
    for col in ("task", "gpu", "shape", "dtype", "time us", "x eager", "x compile", "% roofline", "attempt"):
        table.add_column(col)
    _caption(table, not rows, awaiting)
    for r in rows:
        table.add_row(r.task, r.gpu, r.label + (" (hidden)" if r.hidden else ""), r.dtype, _num(r.time_us),
                      _num(r.speedup_eager), _num(r.speedup_compile), _num(r.pct_roofline, ".1f"), str(r.attempt_id))
    return table


def _cheats(row: StatRow) -> str:
    return "\n".join(f"#{k} {THREATS.get(k, '?')}: {v}" for k, v in sorted(row.cheats.items())) or "-"


def stats_tables(stats: Stats) -> Group:
    tables = []
    for title, rows in (("per task", stats.per_task), ("per model", stats.per_model)):
        table = Table(title=title)
        for col in ("task" if title == "per task" else "model", "attempts", "accepted", "rate", "reused",
                    "cheats caught", "tokens in", "tokens out", "cost $"):
            table.add_column(col)
        for r in rows:
            table.add_row(r.key, str(r.attempts), str(r.accepted), f"{100 * r.acceptance_rate:.1f}%", str(r.reused),
                          _cheats(r), f"{r.tokens_in:,}", f"{r.tokens_out:,}", f"{r.cost_usd:.2f}")
        tables.append(table)
    return Group(*tables)


def measurements_table(shapes: Sequence[ShapeResult]) -> Table:
    table = Table(title="measurements")
    for col in ("shape", "dtype", "timing", "time us", "spread %", "eager us", "compile us", "x eager",
                "x compile", "GB/s", "TFLOP/s", "% roofline", "max abs err"):
        table.add_column(col)
    for s in shapes:
        table.add_row(
            (s.label or "(default)") + (" (hidden)" if s.hidden else ""), s.dtype, s.timing, _num(s.time_us),
            _num(s.spread_pct, ".1f"), _num(s.eager_us), _num(s.compile_us), _num(s.speedup_eager),
            _num(s.speedup_compile), _num(s.gbps, ".0f"), _num(s.tflops, ".1f"), _num(roofline_pct(s), ".1f"),
            _num(s.max_abs_err, ".2e"),
        )
    return table


def summary_table(rows: Sequence[AttemptSummary], title: str) -> Table:
    table = Table(title=title)
    for col in ("attempt", "task", "status", "score", "model", "gpu", "reason"):
        table.add_column(col)
    for r in rows:
        status = r.status + (f" #{r.threat}" if r.threat else "") + (f" (reuse of {r.reuse_of})" if r.reuse_of else "")
        table.add_row(str(r.id), r.task, status, _num(r.score), r.model or r.proposer or "-", r.gpu, r.reason)
    return table


def audit_text(record: AttemptRecord, audits: Sequence[AuditRecord]) -> Text:
    """The attempt's audits (the latest decides), or why it has none."""
    v = record.verdict
    if not audits:
        if v.accepted and any(is_gpu_timed(s) for s in v.shapes):
            return Text("not audited: never a best until an audit passes (`kernforge archive audit` audits the best)",
                        style="yellow")
        return Text("not audited (only accepted verdicts with GPU times are audited)", style="dim")
    out = Text()
    for i, a in enumerate(audits):
        latest = i == len(audits) - 1
        word = "passed" if a.passed else "FAILED"
        where = f"run {a.run_id}" if a.run_id is not None else "kernforge archive audit"
        out.append(f"audit {a.id} ({where}, {a.created}){' latest' if latest else ''}: ",
                   "bold" if latest else "")
        out.append(f"{word}: {a.audit.reason}", ("green" if a.passed else "red") if latest else "dim")
        if not latest:
            out.append("\n")
    return out


def show(record: AttemptRecord, lineage: Sequence[AttemptSummary], reuses: int,
         audits: Sequence[AuditRecord] = ()) -> Group:
    v = record.verdict
    head = Text.assemble(
        (f"attempt {record.id}", "bold"), f"  task {record.task}  run {record.run_id} seq {record.seq}  ",
        f"gpu {record.gpu}  model {record.model or record.proposer or '-'}  {record.created}\n",
        (describe(v), "green" if v.accepted else "red"),
        f"\nscore {_num(record.score)}  x eager {_num(record.speedup_eager)}  "
        f"% roofline {_num(record.pct_roofline, '.1f')}  tokens {record.tokens_in}/{record.tokens_out}  "
        f"cost ${record.cost_usd:.4f}  latency {record.latency_s:.1f}s",
    )
    if record.reuse_of:
        head.append(f"\nverdict reused from attempt {record.reuse_of} (same code, task and environment)")
    if reuses:
        head.append(f"\nreused by {reuses} later proposal(s)")
    parts: list[Any] = [Panel(head), Panel(audit_text(record, audits), title="audit"),
                        Syntax(record.code, "python", line_numbers=True, word_wrap=True)]
    evidence = {k: val for k, val in dict(v.evidence).items() if val}
    if evidence:
        parts.append(Panel(Text(json.dumps(evidence, indent=2, sort_keys=True, default=str)), title="evidence"))
    if v.shapes:
        parts.append(measurements_table(v.shapes))
    parts.append(summary_table(lineage, "lineage (root first)"))
    return Group(*parts)


def show_json(record: AttemptRecord, lineage: Sequence[AttemptSummary], reuses: int,
              audits: Sequence[AuditRecord] = ()) -> dict[str, Any]:
    return {"attempt": record.to_dict(), "lineage": [r.to_dict() for r in lineage], "reused_by": reuses,
            "audits": [a.to_dict() for a in audits]}


def sql_table(columns: Sequence[str], rows: Sequence[tuple], truncated: bool) -> Group:
    table = Table()
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    note = f"first {len(rows)} rows shown (--limit 0 shows all)" if truncated else f"{len(rows)} row(s)"
    return Group(table, Text(note, style="dim"))
