"""The report's plots as Vega-Lite specs, built with altair from html_report_data's records.

Each function returns a plain-JSON spec (``Chart.to_dict()``); the page (html_report.py) embeds
them with vega-embed's SVG renderer, so every title, axis label and value label is text in the
page's DOM. Data are inline values (``alt.Data``), never a file or a URL: the page opens offline.

Times are plotted on log scales: one task's shapes and attempts span orders of magnitude, and a
ratio (a speedup) reads as the same distance wherever it lies.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import altair as alt

from .html_report_data import Baseline, Counts, GpuSection, threat_label

WIDTH = 620
#: the audit outcomes a point can have, and their colours (passed: the only kind a best is)
AUDIT_COLOURS = {"passed": "#2b8a3e", "not audited": "#868e96", "failed": "#e03131"}
BEST_COLOUR = "#1971c2"
#: the kernel's own bar first, then each baseline's
WHO_COLOURS = ("#1971c2", "#f08c00", "#9c36b5", "#0c8599")


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} us"


def progress(task: str, section: GpuSection, baselines: Sequence[Baseline]) -> dict[str, Any]:
    """Each accepted GPU-timed attempt's time, the running best (a step line) and, for scale, the
    baselines' times over the best's shapes (dashed rules)."""
    best = section.best
    title = (f"{task} on {section.gpu}: best {_us(best.time_us)} (attempt {best.attempt_id})" if best
             else f"{task} on {section.gpu}: no audited best yet")
    points = [p.to_dict() for p in section.points]
    base = alt.Chart(alt.Data(values=points))
    x = alt.X("n:Q", title="attempt (n-th of the task, rejections included)", scale=alt.Scale(zero=False))
    y = alt.Y("time_us:Q", title="time per call (us, geometric mean over shapes)", scale=alt.Scale(type="log"))
    dots = base.mark_circle(size=60, opacity=0.8).encode(
        x=x, y=y,
        color=alt.Color("audit:N", title="audit", scale=alt.Scale(domain=list(AUDIT_COLOURS),
                                                                    range=list(AUDIT_COLOURS.values()))),
        tooltip=[alt.Tooltip("attempt_id:Q", title="attempt"), alt.Tooltip("time_us:Q", title="us", format=".3f"),
                 alt.Tooltip("score:Q", format=".3f"), "audit:N", "model:N", alt.Tooltip("run_id:Q", title="run"),
                 "created:N"],
    )
    layers: list[Any] = [dots]
    if best is not None:
        layers.append(base.transform_filter("datum.best_us != null").mark_line(
            interpolate="step-after", color=BEST_COLOUR, strokeWidth=2).encode(
            x="n:Q", y=alt.Y("best_us:Q", scale=alt.Scale(type="log")),
            tooltip=[alt.Tooltip("best_us:Q", title="running best (us)", format=".3f")]))
        rules = [{"baseline": b.label, "us": section.baseline_geomean(b.key)} for b in baselines]
        rules = [r for r in rules if r["us"]]
        if rules:
            ruled = alt.Chart(alt.Data(values=rules))
            layers.append(ruled.mark_rule(strokeDash=[6, 4], color="#495057").encode(
                y=alt.Y("us:Q", scale=alt.Scale(type="log")), tooltip=["baseline:N", alt.Tooltip("us:Q", format=".3f")]))
            layers.append(ruled.mark_text(align="left", dx=4, dy=-6, color="#495057", fontSize=11).encode(
                y=alt.Y("us:Q", scale=alt.Scale(type="log")), x=alt.value(0), text="baseline:N"))
    return alt.layer(*layers).properties(title=title, width=WIDTH, height=280).to_dict()


def versus_baselines(section: GpuSection, baselines: Sequence[Baseline]) -> dict[str, Any]:
    """Per shape of the best: its time beside each recorded baseline's (grouped bars, log scale)."""
    who = ["kernforge best"] + [b.label for b in baselines]
    rows = []
    for s in section.shapes:
        if s.time_us is None:
            continue
        shape = s.label + (" (hidden)" if s.hidden else "")
        rows.append({"shape": shape, "who": who[0], "us": s.time_us, "speedup": 1.0})
        for b in baselines:
            if s.baselines.get(b.key):
                rows.append({"shape": shape, "who": b.label, "us": s.baselines[b.key], "speedup": s.speedup(b.key)})
    # a bar on a log scale needs a floor to grow from (zero is minus infinity): the power of ten below the lowest
    floor = 10.0 ** math.floor(math.log10(min((r["us"] for r in rows), default=1.0)))
    return alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        x=alt.X("shape:N", title=None, sort=None, axis=alt.Axis(labelAngle=-30, labelLimit=200)),
        xOffset=alt.XOffset("who:N", sort=who),
        y=alt.Y("us:Q", title="time per call (us)", scale=alt.Scale(type="log", domainMin=floor)),
        y2=alt.Y2(datum=floor),
        color=alt.Color("who:N", title=None, sort=who,
                        scale=alt.Scale(domain=who, range=list(WHO_COLOURS[:len(who)]))),
        tooltip=["shape:N", "who:N", alt.Tooltip("us:Q", format=".3f"),
                 alt.Tooltip("speedup:Q", title="best is x faster", format=".2f")],
    ).properties(title=f"best (attempt {section.best.attempt_id if section.best else '-'}) against the baselines, per shape",
                 width=WIDTH, height=260).to_dict()


def roofline(section: GpuSection) -> dict[str, Any]:
    """The best's % of roofline per shape (its time against the hardware floor of the shape)."""
    rows = [{"shape": s.label + (" (hidden)" if s.hidden else ""), "pct": s.pct_roofline}
            for s in section.shapes if s.pct_roofline is not None]
    base = alt.Chart(alt.Data(values=rows)).encode(x=alt.X("shape:N", title=None, sort=None,
                                                           axis=alt.Axis(labelAngle=-30, labelLimit=200)))
    bars = base.mark_bar(color=BEST_COLOUR).encode(y=alt.Y("pct:Q", title="% of roofline"),
                                                   tooltip=["shape:N", alt.Tooltip("pct:Q", format=".1f")])
    labels = base.mark_text(dy=-6, fontSize=11).encode(y="pct:Q", text=alt.Text("pct:Q", format=".1f"))
    ceiling = alt.Chart(alt.Data(values=[{"pct": 100}])).mark_rule(strokeDash=[6, 4], color="#495057").encode(y="pct:Q")
    return alt.layer(bars, labels, ceiling).properties(
        title="% of roofline per shape (100 = the hardware floor)", width=WIDTH, height=220).to_dict()


def verdicts(counts: Counts) -> dict[str, Any]:
    """Attempts by verdict status (accepted in green), a bar and a count each."""
    rows = [{"status": k, "attempts": v, "kind": "accepted" if k == "accepted" else "rejected"}
            for k, v in counts.by_status.items()]
    return _count_bars(rows, "status", f"verdicts by status ({counts.attempts} attempts)",
                       alt.Color("kind:N", legend=None, scale=alt.Scale(domain=["accepted", "rejected"],
                                                                         range=["#2b8a3e", "#e8590c"])))


def cheats(counts: Counts) -> dict[str, Any]:
    """Cheats caught, by THREATS class."""
    rows = [{"threat": threat_label(k), "attempts": v} for k, v in counts.by_threat.items()]
    return _count_bars(rows, "threat", f"cheats caught by THREATS class ({sum(counts.by_threat.values())})",
                       alt.value("#c92a2a"))


def _count_bars(rows: list[dict[str, Any]], field: str, title: str, color: Any) -> dict[str, Any]:
    base = alt.Chart(alt.Data(values=rows)).encode(
        y=alt.Y(f"{field}:N", title=None, sort="-x", axis=alt.Axis(labelLimit=260)))
    bars = base.mark_bar().encode(x=alt.X("attempts:Q", title="attempts"), color=color,
                                  tooltip=[f"{field}:N", "attempts:Q"])
    labels = base.mark_text(align="left", dx=3, fontSize=11).encode(x="attempts:Q", text="attempts:Q")
    return alt.layer(bars, labels).properties(title=title, width=300, height=alt.Step(18)).to_dict()
