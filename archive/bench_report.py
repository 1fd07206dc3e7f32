"""Benchmark runs for people: KernelBench's metrics per level, each problem's result, and several
runs side by side (``kernforge bench kernelbench`` and ``kernforge bench report``).

Every table fits the terminal (tables.FitTable): problem names are never cut; the least
important columns go first. A figure that needs a GPU time reads "not measured" for a run judged
on the CPU interpreter, never a number made from the interpreter's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import Group
from rich.text import Text

from .bench_metrics import OVERALL, THRESHOLDS, Metrics, ProblemResult, by_level
from .bench_runs import BenchRun, problem_results
from .store import Archive
from .tables import Col, FitTable, fmt_x

NOT_MEASURED = "not measured"
CPU_NOTE = ("judged on the CPU (Triton interpreter): correctness only, so fast_p and speedups are not measured; "
            "run on a GPU for them")
METRICS_NOTE = ("fast_p: share of ALL problems with a correct kernel more than p times faster than the baseline "
                "(KernelBench); geomean: geometric-mean speedup over the correct, timed problems; speedups at each "
                "problem's public shapes, of its fastest audited kernel")


@dataclass(frozen=True)
class BenchReport:
    """One benchmark run with its problems' results and its metrics per level and overall."""

    run: BenchRun
    problems: tuple[ProblemResult, ...]
    metrics: tuple[Metrics, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run.to_dict(), "metrics": [m.to_dict() for m in self.metrics],
                "problems": [p.to_dict() for p in self.problems]}


def bench_report(archive: Archive, run: BenchRun) -> BenchReport:
    problems = problem_results(archive, run)
    return BenchReport(run, tuple(problems), tuple(by_level(problems)))


# ---- cells --------------------------------------------------------------------------------------
def _share(value: float | None, n: int) -> str:
    if value is None:
        return NOT_MEASURED
    return f"{round(value * n)} ({100 * value:.0f}%)"


def _metric_rows(m: Metrics, *, timed: bool = True) -> list[tuple[str, str]]:
    """(metric, cell) for one group, in the order the tables show them; ``timed=False``: one row
    saying the time-based metrics were not measured, instead of a row for each."""
    rows = [("problems", str(m.problems)), ("correct", _share(m.correctness, m.problems) if m.problems else "-")]
    if not timed:
        return rows + [("fast_p, speedups", NOT_MEASURED)]
    for baseline, name in (("eager", "eager"), ("compile", "compile")):
        for p in THRESHOLDS:
            rows.append((f"fast_{p:g} {name}", _share(m.fast_p(baseline, p), m.problems)))
    rows.append(("faster than compile", _share(m.faster_than_compile, m.problems)))
    for baseline in ("eager", "compile"):
        value = m.geomean[baseline]
        cell = NOT_MEASURED if not m.measured else fmt_x(value)
        if m.measured and m.untimed[baseline]:
            cell += f" ({m.untimed[baseline]} untimed)"
        rows.append((f"geomean x {baseline}", cell))
    return rows


def _groups(report: BenchReport) -> list[Metrics]:
    """The levels and the overall group; one level alone needs no separate overall column."""
    return [m for m in report.metrics if len(report.metrics) > 2 or m.group != OVERALL]


# ---- one run --------------------------------------------------------------------------------------
def metrics_table(report: BenchReport) -> FitTable:
    groups = _groups(report)
    timed = any(m.measured for m in groups)
    table = FitTable([Col("metric")] + [Col(m.group, "right") for m in groups],
                     title=f"run {report.run.run_id} ({report.run.label}): {report.run.benchmark} metrics",
                     title_justify="left", caption_justify="left")
    cells = [_metric_rows(m, timed=timed) for m in groups]
    for i, (name, _) in enumerate(cells[0]):
        table.add_row(name, *(c[i][1] for c in cells))
    table.caption = METRICS_NOTE if timed else CPU_NOTE
    return table


def _verdict(p: ProblemResult) -> str:
    if p.attempts == 0:
        return "left out" if p.left_out else "not tried"
    return "yes" if p.correct else "no"


def problems_table(report: BenchReport) -> FitTable:
    measured = any(p.on_gpu for p in report.problems)
    table = FitTable([Col("problem"), Col("level", drop=3), Col("attempts", "right", drop=2), Col("correct"),
                      Col("x eager", "right", drop=1), Col("x compile", "right"), Col("attempt", "right", drop=4)],
                     title=f"run {report.run.run_id}: {len(report.problems)} problem(s)", title_justify="left",
                     caption_justify="left")
    for p in report.problems:
        speeds = [fmt_x(p.speedup_eager), fmt_x(p.speedup_compile)] if measured else ["-", "-"]
        table.add_row(p.name, p.level, str(p.attempts), _verdict(p), *speeds, str(p.attempt_id or "-"))
    table.caption = ("x eager / x compile: the fastest correct kernel's speedups (audited, GPU times)"
                     if measured else CPU_NOTE)
    return table


def report_view(report: BenchReport) -> Group:
    left_out = [Text(f"{p.name} left out: {p.left_out}") for p in report.problems if p.left_out]
    return Group(metrics_table(report), problems_table(report), *left_out,
                 Text(f"run {report.run.run_id} {report.run.status}; `kernforge bench report {report.run.run_id}` "
                      "shows it again, `kernforge bench report RUN RUN` compares it with another"))


# ---- several runs side by side --------------------------------------------------------------------
def _run_header(report: BenchReport) -> str:
    return f"run {report.run.run_id} {report.run.label}"


def compare_view(reports: Sequence[BenchReport]) -> Group:
    """A metrics table per level (and overall), then every problem: one column per run."""
    parts: list[Any] = []
    groups = list(dict.fromkeys(m.group for r in reports for m in _groups(r)))
    timed = any(m.measured for r in reports for m in r.metrics)
    for group in groups:
        table = FitTable([Col("metric")] + [Col(_run_header(r), "right") for r in reports],
                         title=f"{group}: runs side by side", title_justify="left", caption_justify="left")
        per_run = []
        for r in reports:
            found = next((m for m in r.metrics if m.group == group), None)
            per_run.append(dict(_metric_rows(found, timed=timed)) if found else {})
        names = [name for name, _ in _metric_rows(reports[0].metrics[-1], timed=timed)]
        for name in names:
            table.add_row(name, *(cells.get(name, "-") for cells in per_run))
        parts.append(table)
    problems = list(dict.fromkeys(p.name for r in reports for p in r.problems))
    table = FitTable([Col("problem")] + [Col(_run_header(r), "right") for r in reports],
                     title="problems: correct, and x compile where measured", title_justify="left",
                     caption_justify="left")
    by_run = [{p.name: p for p in r.problems} for r in reports]
    for name in problems:
        cells = []
        for found in by_run:
            p = found.get(name)
            if p is None:
                cells.append("-")
            elif not p.correct:
                cells.append(_verdict(p))
            else:
                cells.append("yes " + fmt_x(p.speedup_compile) if p.on_gpu and p.speedup_compile else "yes")
        table.add_row(name, *cells)
    table.caption = METRICS_NOTE if timed else CPU_NOTE
    parts.append(table)
    return Group(*parts)


def runs_table(runs: Sequence[BenchRun]) -> FitTable:
    table = FitTable([Col("run", "right"), Col("benchmark", drop=2), Col("proposer", wrap=True), Col("status"),
                      Col("problems", "right"), Col("attempts", "right", drop=1), Col("started", drop=3)],
                     title=f"{len(runs)} benchmark run(s)", title_justify="left", caption_justify="left",
                     caption="`kernforge bench report RUN` shows one; `kernforge bench report RUN RUN` compares them")
    for r in runs:
        table.add_row(str(r.run_id), r.benchmark, r.label, r.status, str(len(r.problems)), str(r.attempts),
                      r.started[:16].replace("T", " "))
    return table
