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
from rich.text import Text

from kernforge.verifier.verdict import THREATS, ShapeResult, Verdict, describe, printable

from .records import (AttemptRecord, AttemptSummary, AuditRecord, AwaitingAudit, BestEntry, ShapeBest, StatRow, Stats,
                      TaskBaselines)
from .score import BASELINES, MIN_GAIN, SlowBaseline, is_gpu_timed, library_summary, near_tie, roofline_pct, slow_baselines
from .tables import Col, FitTable, fmt_num, fmt_us, fmt_x


#: what a time of record marked as a bound means (ShapeResult.bounded)
BOUND_NOTE = ("<= a bound, not a measurement: what the shape's timed batch paid once outgrew a tenth of its window, so "
              "its time of record is the long batch's own figure less 10% (an honest kernel's own time is likely lower, "
              "and its speedups there higher: the baselines are timed in one process)")


def _time(s: ShapeResult | ShapeBest) -> str:
    """A time of record, marked ``<=`` where it is a bound (``BOUND_NOTE``)."""
    return ("<= " if s.bounded else "") + fmt_us(s.time_us)


def _speedup(s: ShapeResult | ShapeBest, value: float | None) -> str:
    """A speedup at a shape, marked ``>=`` where its time of record is a bound."""
    return (">= " if s.bounded and value is not None else "") + fmt_x(value)


def _bound_caption(table: FitTable, rows: Iterable[ShapeResult | ShapeBest]) -> None:
    if any(r.bounded for r in rows):
        table.caption = "\n".join([table.caption or "", BOUND_NOTE]).strip()


def _shape_lines(shapes: Iterable[ShapeResult]) -> str:
    lines = []
    for s in shapes:
        if s.time_us is not None:
            hidden = " (hidden)" if s.hidden else ""
            lines.append(f"{s.label or '(default)'}{hidden}: {_time(s)}")
    return "\n".join(lines) or "-"


def awaiting_lines(awaiting: Sequence[AwaitingAudit]) -> str:
    """Why a task and GPU have no best although they have accepted GPU attempts, and what to run."""
    lines = []
    for w in awaiting:
        audited = f"{w.audited} audited, {w.failed} of them failed" if w.audited else "none audited"
        if w.earlier:
            audited += f"; {w.earlier} passed an audit by an earlier version of the judge, which counts no more"
        lines.append(f"{w.task} on {w.gpu}: {w.accepted} accepted GPU attempt(s), none passed an audit by this "
                     f"judge ({audited}); `kernforge archive audit --task {w.task}` audits them")
    return "\n".join(lines)


def _caption(table: FitTable, empty: bool, awaiting: Sequence[AwaitingAudit]) -> None:
    if awaiting:
        table.caption = awaiting_lines(awaiting)
    elif empty:
        table.caption = "no accepted attempt with GPU timings yet (interpreter runs are never ranked)"


def _flagged(value: str, baseline: str, slow: Sequence[SlowBaseline]) -> str:
    """A speedup cell, marked ``!`` when its baseline is far slower than the roofline floor."""
    return value + " !" if any(s.baseline == baseline for s in slow) else value


def best_table(entries: Sequence[BestEntry], awaiting: Sequence[AwaitingAudit] = ()) -> FitTable:
    table = FitTable([Col("task"), Col("gpu", wrap=True, drop=4), Col("best time per shape"),
                      Col("x eager", "right", drop=2), Col("x compile", "right"), Col("x library", "right", drop=6),
                      Col("% roofline", "right", drop=3), Col("attempt", "right"), Col("model", drop=5),
                      Col("audit", wrap=True, drop=1)],
                     title=f"best per task and GPU ({len(entries)})",
                     caption="x compile (the score) and x eager: geometric-mean speedups; every best passed its audit")
    _caption(table, not entries, awaiting)
    flags, libraries = [], {}
    for e in entries:
        slow = slow_baselines(e.shapes)
        x_library, library = library_summary(e.shapes)
        if library:
            libraries.setdefault(library, []).append(e.task)
        flags += [f"{e.task} on {e.gpu}: {s.line()}" for s in slow]
        audit = f"passed: {fmt_us(e.audit.audit.measured_us)} again" if e.audit else "-"
        table.add_row(e.task, e.gpu, _shape_lines(e.shapes), _flagged(fmt_x(e.speedup_eager), "eager", slow),
                      _flagged(fmt_x(e.score), "compile", slow), _flagged(fmt_x(x_library), "library", slow),
                      fmt_num(e.pct_roofline, ".1f"), str(e.attempt_id),
                      e.model or "-", audit)
    if len(libraries) == 1:
        flags.insert(0, f"x library: over {next(iter(libraries))}, where it covers the op and is installed")
    elif libraries:  # a task's first installed library that agrees with its reference: say which, per task
        over = "; ".join(f"{', '.join(sorted(set(tasks)))} over {name}" for name, tasks in sorted(libraries.items()))
        flags.insert(0, f"x library: {over}")
    if flags:
        table.caption = "\n".join([table.caption or "", *flags]).strip()
    _bound_caption(table, [s for e in entries for s in e.shapes if s.time_us is not None])
    return table


def baselines_text(found: Sequence[TaskBaselines]) -> str:
    """``tasks show``'s section on the measured baselines: per GPU, each baseline against the
    roofline floor at the largest timed shape, a ``!`` line for each one far slower."""
    if not found:
        return "## Baselines: none measured in this archive yet (a GPU run records them beside each candidate)"
    lines = ["## Baselines measured (newest accepted GPU attempt), at the largest timed shape"]
    for b in found:
        timed = [s for s in b.shapes if is_gpu_timed(s) and s.floor_us]
        if not timed:
            continue
        largest = max(timed, key=lambda s: s.floor_us)
        parts = [f"{name} {fmt_us(getattr(largest, field, None))}" for name, field in BASELINES
                 if getattr(largest, field, None)]
        lines.append(f"- {b.gpu}, {largest.label}: {', '.join(parts)}; roofline floor {fmt_us(largest.floor_us)} "
                     f"(attempt {b.attempt_id})")
        lines += [f"  {s.line()}" for s in slow_baselines(b.shapes)]
    return "\n".join(lines)


def shape_best_table(rows: Sequence[ShapeBest], awaiting: Sequence[AwaitingAudit] = ()) -> FitTable:
    table = FitTable([Col("task"), Col("gpu", wrap=True, drop=4), Col("shape"), Col("dtype", drop=5),
                      Col("time", "right"), Col("x eager", "right", drop=2), Col("x compile", "right"),
                      Col("% roofline", "right", drop=3), Col("attempt", "right")],
                     title=f"fastest accepted time per shape, audited attempts only ({len(rows)})")
    _caption(table, not rows, awaiting)
    for r in rows:
        table.add_row(r.task, r.gpu, r.label + (" (hidden)" if r.hidden else ""), r.dtype, _time(r),
                      _speedup(r, r.speedup_eager), _speedup(r, r.speedup_compile), fmt_num(r.pct_roofline, ".1f"),
                      str(r.attempt_id))
    _bound_caption(table, rows)
    return table


def _cheats(row: StatRow) -> str:
    return "\n".join(f"#{k} {THREATS.get(k, '?')}: {v}" for k, v in sorted(row.cheats.items())) or "-"


def stats_tables(stats: Stats) -> Group:
    tables = []
    for title, rows in (("per task", stats.per_task), ("per model", stats.per_model)):
        table = FitTable([Col("task" if title == "per task" else "model"), Col("attempts", "right"),
                          Col("accepted", "right"), Col("rate", "right"), Col("reused", "right", drop=3),
                          Col("cheats caught", wrap=True, drop=4), Col("tokens in", "right", drop=2),
                          Col("tokens out", "right", drop=1), Col("cost $", "right")], title=title)
        for r in rows:
            table.add_row(r.key, str(r.attempts), str(r.accepted), f"{100 * r.acceptance_rate:.1f}%", str(r.reused),
                          _cheats(r), f"{r.tokens_in:,}", f"{r.tokens_out:,}", f"{r.cost_usd:.2f}")
        tables.append(table)
    return Group(*tables)


def measurements_table(shapes: Sequence[ShapeResult]) -> FitTable:
    """Per-shape results (``archive show`` and ``eval``); at 80 columns the rates and errors go first."""
    table = FitTable([Col("shape"), Col("dtype", drop=8), Col("timing", drop=4), Col("time", "right"),
                      Col("spread", "right", drop=5), Col("eager", "right", drop=3), Col("compile", "right", drop=2),
                      Col("x eager", "right", drop=1), Col("x compile", "right"), Col("GB/s", "right", drop=9),
                      Col("TFLOP/s", "right", drop=10), Col("% roofline", "right", drop=6),
                      Col("max abs err", "right", drop=7)], title="measurements")
    for s in shapes:
        table.add_row(
            (s.label or "(default)") + (" (hidden)" if s.hidden else ""), s.dtype, s.timing, _time(s),
            fmt_num(s.spread_pct, ".1f", "%"), fmt_us(s.eager_us), fmt_us(s.compile_us), _speedup(s, s.speedup_eager),
            _speedup(s, s.speedup_compile), fmt_num(s.gbps, ".0f"), fmt_num(s.tflops, ".1f"), fmt_num(roofline_pct(s), ".1f"),
            fmt_num(s.max_abs_err, ".2e"),
        )
    _bound_caption(table, shapes)
    return table


def summary_table(rows: Sequence[AttemptSummary], title: str) -> FitTable:
    table = FitTable([Col("attempt", "right"), Col("task"), Col("status", wrap=True), Col("score", "right", drop=2),
                      Col("model", drop=3), Col("gpu", wrap=True, drop=1), Col("reason", wrap=True, drop=4)],
                     title=title)
    for r in rows:
        status = r.status + (f" #{r.threat}" if r.threat else "") + (f" (reuse of {r.reuse_of})" if r.reuse_of else "")
        table.add_row(str(r.id), r.task, status, fmt_x(r.score), r.model or r.proposer or "-", r.gpu, Text(printable(r.reason)))
    return table


def _tied(record: AttemptRecord, audits: Sequence[AuditRecord], best: BestEntry | None) -> BestEntry | None:
    """``best`` where ``record``, never audited, is a near-tie of it (score.near_tie)."""
    if audits or best is None or best.attempt_id == record.id or not near_tie(record.score, best.score):
        return None
    return best


def audit_text(record: AttemptRecord, audits: Sequence[AuditRecord], best: BestEntry | None = None) -> Text:
    """The attempt's audits (the latest decides), or why it has none; ``best``: its task's audited
    best on its GPU model, where there is one (a near-tie with it is said to be one)."""
    v = record.verdict
    if not audits:
        if best := _tied(record, audits, best):
            return Text(f"not audited: a near-tie with the best, attempt {best.attempt_id} (score {fmt_num(record.score)} "
                        f"against {fmt_num(best.score)}, less than {MIN_GAIN:.0%} apart, the judge's own noise), so no run "
                        "audits it and it is not the best (`kernforge archive audit` audits the best first)", style="yellow")
        if v.accepted and any(is_gpu_timed(s) for s in v.shapes):
            return Text("not audited: never a best until an audit passes (`kernforge archive audit` audits the best)",
                        style="yellow")
        return Text("not audited (only accepted verdicts with GPU times are audited)", style="dim")
    out = Text()
    current = [a for a in audits if a.current]
    deciding = current[-1] if current else None
    for a in audits:
        latest = a is deciding
        word = "passed" if a.passed else "FAILED"
        where = f"run {a.run_id}" if a.run_id is not None else "kernforge archive audit"
        judge = "" if a.current else ", by an earlier judge: counts no more"
        out.append(f"audit {a.id} ({where}, {a.created}{judge}){' latest' if latest else ''}: ",
                   "bold" if latest else "")
        out.append(f"{word}: {a.audit.reason}", ("green" if a.passed else "red") if latest else "dim")
        out.append("\n")
    if deciding is None:
        out.append("no audit by this judge: never a best until one passes (`kernforge archive audit` audits the best)",
                   "yellow")
    out.rstrip()
    return out


def show(record: AttemptRecord, lineage: Sequence[AttemptSummary], reuses: int,
         audits: Sequence[AuditRecord] = (), best: BestEntry | None = None) -> Group:
    v = record.verdict
    head = Text.assemble(
        (f"attempt {record.id}", "bold"), f"  task {record.task}  run {record.run_id} seq {record.seq}  ",
        f"gpu {record.gpu}  model {record.model or record.proposer or '-'}  {record.created}\n",
        (describe(v), "green" if v.accepted else "red"),
        f"\nscore {fmt_num(record.score)}  x eager {fmt_num(record.speedup_eager)}  "
        f"% roofline {fmt_num(record.pct_roofline, '.1f')}  tokens {record.tokens_in}/{record.tokens_out}  "
        f"cost ${record.cost_usd:.4f}  latency {record.latency_s:.1f}s",
    )
    if record.reuse_of:
        head.append(f"\nverdict reused from attempt {record.reuse_of} (same code, task and environment)")
    if reuses:
        head.append(f"\nreused by {reuses} later proposal(s)")
    parts: list[Any] = [Panel(head), Panel(audit_text(record, audits, best), title="audit"),
                        Syntax(printable(record.code), "python", line_numbers=True, word_wrap=True)]
    evidence = {k: val for k, val in dict(v.evidence).items() if val}
    if evidence:
        parts.append(Panel(Text(json.dumps(evidence, indent=2, sort_keys=True, default=str)), title="evidence"))
    if v.shapes:
        parts.append(measurements_table(v.shapes))
    parts.append(summary_table(lineage, "lineage (root first)"))
    return Group(*parts)


def show_json(record: AttemptRecord, lineage: Sequence[AttemptSummary], reuses: int,
              audits: Sequence[AuditRecord] = (), best: BestEntry | None = None) -> dict[str, Any]:
    tied = _tied(record, audits, best)
    return {"attempt": record.to_dict(), "lineage": [r.to_dict() for r in lineage], "reused_by": reuses,
            "audits": [a.to_dict() for a in audits], "near_tie_of": tied.attempt_id if tied else None}


def sql_table(columns: Sequence[str], rows: Sequence[tuple], truncated: bool) -> Group:
    table = FitTable([Col(c, wrap=True) for c in columns])
    for row in rows:
        table.add_row(*(Text("NULL" if v is None else printable(str(v))) for v in row))  # cells hold candidates' code
    note = f"first {len(rows)} rows shown (--limit 0 shows all)" if truncated else f"{len(rows)} row(s)"
    return Group(table, Text(note, style="dim"))


def verdict_view(verdict: Verdict, task_name: str) -> Group:
    """A verdict for ``kernforge eval``: status, reason, the measurements table (the one ``archive
    show`` prints), flags, evidence, and where it was judged."""
    head = Text()
    if verdict.accepted:
        head.append("ACCEPTED", style="bold green")
    else:
        head.append(verdict.status.value.upper(), style="bold red")
        if verdict.threat:
            head.append(f"  THREATS #{verdict.threat} ({THREATS[verdict.threat]})", style="red")
    head.append(f"  {task_name}\n")
    head.append(verdict.reason)
    parts: list[Any] = [head]
    if verdict.shapes:
        parts.append(measurements_table(verdict.shapes))
    for flag in getattr(verdict, "flags", ()):
        parts.append(Text(f"flag: {flag}", style="yellow"))
    for flag in getattr(verdict, "hidden_flags", ()):
        parts.append(Text(f"flag (at a hidden shape, never shown to the model): {flag}", style="yellow"))
    evidence = dict(verdict.evidence)
    if not verdict.accepted and evidence:
        error = evidence.pop("error", None)
        lines = [f"{k}: {v}" for k, v in evidence.items() if k not in ("diagnostics", "findings")]
        if lines:
            parts.append(Text("evidence: " + "; ".join(lines)[:1500], style="dim"))
        if error:
            parts.append(Text(str(error)[-2000:], style="dim"))
    env = verdict.environment
    if env:
        where = env.get("gpu") or f"CPU ({env.get('arch', 'interpreter')})"
        parts.append(Text(f"on {where}; torch {env.get('torch')}, triton {env.get('triton')}; "
                          f"verdict in {env.get('verify_seconds', '?')} s", style="dim"))
    return Group(*parts)
