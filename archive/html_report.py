"""``kernforge report``: one self-contained HTML page about the archive, or about one run of it.

``write_report(db, out)`` reads the page's data (html_report_data.py), draws the plots as
Vega-Lite specs (html_report_charts.py) and writes one file holding everything it needs: the
styles, the specs and the Vega, Vega-Lite and vega-embed libraries (the bundle that
``vl-convert-python`` ships), so it opens offline, mailed or committed. vega-embed draws SVG, so
the numbers are text in the page; the tables beside the plots hold the same numbers for a
reader without JavaScript. ``png`` also takes a screenshot with headless Chromium (browser.py).

When the plots are drawn, the page's script sets ``data-rendered`` (the number of plots) and
``data-height`` (the page's height in pixels) on ``<body>``, or ``data-render-error``: what a
browser test and the screenshot read.
"""

from __future__ import annotations

import functools
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import html_report_charts as charts
from .browser import require_chromium, screenshot
from .errors import ReportError
from .html_report_data import Baseline, Counts, GpuSection, ReportData, Step, TaskSection, report_data, threat_label
from .report import BOUND_NOTE
from .score import geomean
from .store import Archive

DEFAULT_OUT = Path("kernforge-report.html")
INTERPRETER_RULE = ("Interpreter (CPU) verdicts check correctness only: their times are never plotted, ranked or"
                    " used for a best.")
CPU_ONLY = ("No timed results: every accepted attempt here was verified under the Triton interpreter (CPU),"
            " which checks correctness only. Run on a GPU for times, speedups and roofline.")
_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212529; margin: 0 auto;
       max-width: 1180px; padding: 24px; }
h1 { margin: 0 0 4px; } h2 { margin-top: 40px; border-bottom: 2px solid #dee2e6; padding-bottom: 4px; }
h3 { margin-top: 28px; color: #1971c2; }
.meta, .note { color: #495057; } .note { background: #f1f3f5; border-left: 4px solid #adb5bd; padding: 6px 10px; }
.warn { background: #fff4e6; border-left-color: #f08c00; }
table { border-collapse: collapse; margin: 10px 0 18px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e9ecef; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f8f9fa; } td.n { text-align: right; } tr.best td { font-weight: 600; background: #e7f5ff; }
.row { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.scroll { max-height: 420px; overflow: auto; } code { background: #f1f3f5; padding: 0 3px; }
"""
_SCRIPT = """
(function () {
  const specs = JSON.parse(document.getElementById("kf-specs").textContent);
  const ids = Object.keys(specs);
  const status = document.getElementById("kf-status");
  Promise.all(ids.map(id => vegaEmbed("#" + id, specs[id], {renderer: "svg", actions: false})))
    .then(() => { document.body.dataset.rendered = String(ids.length); status.remove(); })
    .catch(error => {
      document.body.dataset.renderError = String(error);
      status.textContent = "The plots could not be drawn (" + error + "); the tables hold the same numbers.";
    })
    .finally(() => { document.body.dataset.height = String(document.documentElement.scrollHeight); });
})();
"""


@dataclass(frozen=True)
class ReportResult:
    out: Path
    bytes: int
    tasks: int
    plots: int
    timed: bool
    png: Path | None = None

    def summary(self) -> str:
        line = f"wrote {self.out} ({self.bytes / 1e6:.1f} MB, {self.tasks} task(s), {self.plots} plot(s))"
        if not self.timed:
            line += "; no timed results (interpreter verdicts are correctness only)"
        return line + (f" and the screenshot {self.png}" if self.png else "")


def write_report(db: str | Path, out: str | Path = DEFAULT_OUT, *, run_id: int | None = None,
                 png: str | Path | None = None) -> ReportResult:
    """Write the page for ``run_id`` (None: the whole archive) to ``out``; with ``png``, a screenshot too."""
    out = Path(out)
    _check_writable(out, "--out")
    if png is not None:
        _check_writable(Path(png), "--png")
        require_chromium()  # before the work, not after it
    with Archive.open(db, readonly=True) as archive:
        data = report_data(archive, run_id)
    page, plots = render(data)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as error:
        raise ReportError(f"cannot write {out}: {error.strerror or error}") from None
    if png is not None:
        screenshot(out, Path(png))
    return ReportResult(out=out, bytes=len(page.encode()), tasks=len(data.tasks), plots=plots, timed=data.timed,
                        png=Path(png) if png is not None else None)


def _check_writable(path: Path, option: str) -> None:
    if path.is_dir():
        raise ReportError(f"{option} {path} is a folder; name the file to write, e.g. {path / 'kernforge-report.html'}")
    folder = path.parent
    if not folder.is_dir():
        raise ReportError(f"cannot write {path}: folder {folder} does not exist")
    existed = path.exists()
    try:  # the one sure test, as root too: open it for writing (and leave no empty file behind)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ReportError(f"cannot write {path}: {error.strerror or error}") from None
    if not existed:
        path.unlink()


# ---- the page ----------------------------------------------------------------------------------
def render(data: ReportData) -> tuple[str, int]:
    """The page's HTML and how many plots it holds."""
    specs: dict[str, dict[str, Any]] = {}
    body = [_header(data), _summary(data)]
    body += [_task(t, data, specs) for t in data.tasks]
    blob = json.dumps(specs, allow_nan=False).replace("<", "\\u003c")  # never a "</script>" inside
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>kernforge report: {_e(data.scope)}</title>\n<style>{_STYLE}</style>\n"
        f"<script>{_vega_bundle()}</script>\n</head>\n<body>\n"
        "<p id=\"kf-status\" class=\"note warn\">The plots need JavaScript; the tables hold the same numbers.</p>\n"
        + "\n".join(body)
        + f"\n<script type=\"application/json\" id=\"kf-specs\">{blob}</script>\n<script>{_SCRIPT}</script>\n"
        "</body>\n</html>\n"
    )
    return page, len(specs)


@functools.lru_cache(maxsize=1)
def _vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script (globals ``vegaEmbed``, ``vega``, ``vegaLite``),
    for the Vega-Lite version altair writes specs for (the newest vl-convert has, if it lacks that)."""
    import altair as alt
    import vl_convert as vlc

    wanted = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    version = wanted if wanted in vlc.get_vegalite_versions() else None
    return vlc.javascript_bundle(vl_version=version).replace("</script", "<\\/script")


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = (),
           classes: Sequence[str] | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="n">{_e(c)}</td>' if j in numeric else f"<td>{_e(c)}</td>" for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    return "".join(out) + "</table>"


def _note(text: str, warn: bool = False) -> str:
    return f'<p class="note{" warn" if warn else ""}">{_e(text)}</p>'


def _plot(specs: dict[str, dict[str, Any]], spec: dict[str, Any]) -> str:
    ident = f"kf-plot-{len(specs)}"
    specs[ident] = spec
    return f'<div class="plot" id="{ident}"></div>'


def _header(data: ReportData) -> str:
    gpus = sorted({g.gpu for t in data.tasks for g in t.gpus})
    return (f"<header><h1>kernforge report: {_e(data.scope)}</h1>"
            f'<p class="meta">archive <code>{_e(data.db)}</code> · generated {_e(data.generated)} · '
            f"{len(data.tasks)} task(s) · GPUs with timed results: {_e(', '.join(gpus) or 'none')}</p></header>")


def _summary(data: ReportData) -> str:
    parts = ['<section id="summary"><h2>Summary</h2>']
    if not data.tasks:
        parts.append(_note(f"No attempts in {data.scope}.", warn=True))
    elif not data.timed:
        parts.append(_note(CPU_ONLY, warn=True))
    parts.append(_note(INTERPRETER_RULE + " A best is the highest-score attempt (geometric-mean speedup against"
                       " torch.compile) whose latest audit passed, as `kernforge archive best` shows."))
    for b in data.missing_baselines:
        parts.append(_note(f"{b.label} baseline: not recorded in this archive (its measurements have no"
                           f" {b.column} column); only {', '.join(x.label for x in data.baselines) or 'no baseline'}"
                           " can be compared."))
    parts += [_note(line) for line in data.not_recorded]
    counts = [t.counts for t in data.tasks] + ([data.totals] if len(data.tasks) > 1 else [])
    names = [_task_title(t, data) for t in data.tasks] + (["all tasks"] if len(data.tasks) > 1 else [])
    best = {id(t.counts): "; ".join(f"{g.gpu}: {_num(g.best.time_us)} us" for g in t.gpus if g.best) or "-"
            for t in data.tasks}
    parts.append("<h3>Tasks: verdicts, tokens and cost</h3>")
    parts.append(_table(
        ("task", "attempts", "accepted", "acceptance", "reused", "cheats caught", "tokens in", "tokens out",
         "cost (USD)", "best (geomean time)"),
        [(name, *_count_cells(c), best.get(id(c), "-")) for name, c in zip(names, counts)], numeric=range(1, 9)))
    if data.per_model:
        parts.append("<h3>Models and proposers</h3>")
        parts.append(_table(("model", "attempts", "accepted", "acceptance", "reused", "cheats caught", "tokens in",
                             "tokens out", "cost (USD)"),
                            [(c.key, *_count_cells(c)) for c in data.per_model], numeric=range(1, 9)))
    if data.runs:
        parts.append("<h3>Runs</h3>")
        parts.append(_table(
            ("run", "status", "started", "ended", "wall time (s)", "attempts", "tokens in", "tokens out", "cost (USD)",
             "proposer latency (s)", "resumes"),
            [(r.id, r.status, r.started, r.ended or "-", _num(r.wall_s, ".0f"), r.attempts, f"{r.tokens_in:,}",
              f"{r.tokens_out:,}", f"{r.cost_usd:.4f}", _num(r.proposer_s, ".0f"), r.resumes) for r in data.runs],
            numeric=(0, 4, 5, 6, 7, 8, 9, 10)))
    return "\n".join(parts) + "</section>"


def _count_cells(c: Counts) -> tuple[Any, ...]:
    return (c.attempts, c.accepted, f"{100 * c.acceptance_rate:.0f}%", c.reused, sum(c.by_threat.values()),
            f"{c.tokens_in:,}", f"{c.tokens_out:,}", f"{c.cost_usd:.4f}")


def _task_title(task: TaskSection, data: ReportData) -> str:
    versions = sum(1 for t in data.tasks if t.task == task.task)
    return task.task if versions == 1 else f"{task.task} (version {task.source_hash[:10]})"


def _task(task: TaskSection, data: ReportData, specs: dict[str, dict[str, Any]]) -> str:
    title = _task_title(task, data)
    c = task.counts
    parts = [f'<section class="task" id="task-{task.task_id}"><h2>{_e(title)}</h2>',
             f'<p class="meta">{c.attempts} attempt(s) in {_e(data.scope)}: {c.accepted} accepted, {c.reused} reused'
             f" an earlier verdict; {c.tokens_in:,} tokens in, {c.tokens_out:,} out; ${c.cost_usd:.4f}.</p>"]
    if task.interpreter_accepted:
        parts.append(_note(f"{task.interpreter_accepted} accepted attempt(s) were verified under the interpreter"
                           " (CPU): correct, but with no time of record, so they are not plotted."))
    if not task.gpus:
        parts.append(_note("No accepted attempt of this task has GPU times: nothing to plot or rank.", warn=True))
    for section in task.gpus:
        parts.append(_gpu(title, section, data.baselines, specs))
    parts.append("<h3>Verdicts</h3><div class=\"row\">")
    parts.append(_plot(specs, charts.verdicts(c)))
    parts.append(_plot(specs, charts.cheats(c)) if c.by_threat else _note("No cheat caught."))
    parts.append("</div>")
    return "\n".join(parts) + "</section>"


def _gpu(title: str, section: GpuSection, baselines: Sequence[Baseline], specs: dict[str, dict[str, Any]]) -> str:
    parts = [f"<h3>{_e(section.gpu)}</h3>", _plot(specs, charts.progress(title, section, baselines)),
             f'<p class="meta">{len(section.points)} accepted GPU-timed attempt(s); audits by this judge: '
             f"{section.audits_passed} passed, {section.audits_failed} failed (demoted). The step line is the running "
             "best.</p>"]
    best = section.best
    if best is None:
        parts.append(_note("None of these attempts passed an audit by this judge (one by an earlier version of it "
                           "counts no more), so the task has no best on this GPU yet:"
                           f" `kernforge archive audit --task {title}` audits them.", warn=True))
        return "\n".join(parts)
    ratios = [f"x{_num(geomean(s.speedup(b.key) for s in section.shapes))} vs {b.label}" for b in baselines]
    parts.append(f"<p><b>Best: attempt {best.attempt_id}</b> (run {best.run_id}, seq {best.seq}, {_e(best.model)}):"
                 f" {_num(best.time_us)} us, geometric mean over {sum(1 for s in section.shapes if s.time_us)}"
                 f" shape(s); {_e(', '.join(ratios))}; score {_num(best.score, '.3f')};"
                 f" {_num(section.best_pct_roofline, '.1f')}% of roofline on average. Its latest audit passed.</p>")
    parts.append(_plot(specs, charts.versus_baselines(section, baselines)))
    parts.append(_table(
        ("shape", "dtype", "timing", "time (us)", *[f"{b.label} (us)" for b in baselines],
         *[f"x {b.label}" for b in baselines], "% roofline"),
        [(s.label + (" (hidden)" if s.hidden else ""), s.dtype, s.timing, ("<= " if s.bounded else "") + _num(s.time_us),
          *[_num(s.baselines.get(b.key)) for b in baselines],
          *[(">= " if s.bounded and s.speedup(b.key) else "") + _num(s.speedup(b.key)) for b in baselines],
          _num(s.pct_roofline, ".1f")) for s in section.shapes],
        numeric=range(3, 5 + 2 * len(baselines))))
    if any(s.bounded for s in section.shapes):
        parts.append(_note(BOUND_NOTE))
    if any(s.pct_roofline is not None for s in section.shapes):
        parts.append(_plot(specs, charts.roofline(section)))
    else:
        parts.append(_note("No roofline figure recorded for these shapes (the task has no roofline model)."))
    parts.append(f"<h4>Lineage of the best (root first, {len(section.lineage)} attempt(s))</h4>")
    parts.append(f'<div class="scroll">{_lineage(section.lineage, best.attempt_id)}</div>')
    return "\n".join(parts)


def _lineage(steps: Sequence[Step], best_id: int) -> str:
    def status(s: Step) -> str:
        return s.status + (f" ({threat_label(s.threat)})" if s.threat else "")

    def reason(s: Step) -> str:
        text = (f"reused attempt {s.reuse_of}'s verdict; " if s.reuse_of else "") + s.reason
        return text if len(text) <= 160 else text[:157] + "..."

    return _table(("attempt", "run", "parent", "status", "time (us)", "score", "model", "reason"),
                  [(s.attempt_id, s.run_id, s.parent_id or "-", status(s), _num(s.time_us), _num(s.score, ".3f"),
                    s.model, reason(s)) for s in steps],
                  numeric=(0, 1, 2, 4, 5), classes=["best" if s.attempt_id == best_id else "" for s in steps])
