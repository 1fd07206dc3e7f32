"""Verdicts for people: the table ``kernforge eval`` prints."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .verdict import THREATS, Verdict


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def verdict_renderable(verdict: Verdict, task_name: str) -> Group:
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
        parts.append(shape_table(verdict))
    flags = getattr(verdict, "flags", ())
    for flag in flags:
        parts.append(Text(f"flag: {flag}", style="yellow"))
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


def shape_table(verdict: Verdict) -> Table:
    table = Table(show_lines=False)
    for col in ("shape", "", "timing", "time us", "spread %", "eager us", "compile us", "x eager", "x compile",
                "GB/s", "TFLOP/s", "% BW", "max err"):
        table.add_column(col, justify="right" if col not in ("shape", "", "timing") else "left")
    for s in verdict.shapes:
        table.add_row(
            s.label, "hidden" if s.hidden else "public", s.timing,
            _num(s.time_us, ".2f"), _num(s.spread_pct, ".1f"), _num(s.eager_us, ".2f"), _num(s.compile_us, ".2f"),
            _num(s.speedup_eager, ".2f"), _num(s.speedup_compile, ".2f"), _num(s.gbps, ".0f"), _num(s.tflops, ".2f"),
            _num(s.pct_bandwidth, ".0f"), _num(s.max_abs_err, ".2g"),
        )
    return table
