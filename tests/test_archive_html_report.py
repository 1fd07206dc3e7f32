"""`kernforge report`'s page: self-contained, with what the data holds; in headless Chromium, the
plots drawn as SVG showing the archive's numbers; a full-page screenshot."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import struct

import pytest
from report_helpers import make_archive

from kernforge.archive import synthetic
from kernforge.archive.browser import dump_dom, find_chromium, page_height
from kernforge.archive.errors import ArchiveError, ReportError
from kernforge.archive.html_report import CPU_ONLY, INTERPRETER_RULE, render, write_report
from kernforge.archive.html_report_data import GPU_BUSY_NOT_RECORDED, report_data
from kernforge.archive.store import Archive

needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="needs headless Chromium (apt-get install chromium; .ci/run installs it)")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return make_archive(tmp_path_factory.mktemp("report") / "k.db")


@pytest.fixture(scope="module")
def data(db):
    with Archive.open(db, readonly=True) as archive:
        return report_data(archive)


@pytest.fixture(scope="module")
def page(db, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "report.html"
    result = write_report(db, out)
    return out, result


def _specs(text: str) -> dict:
    blob = re.search(r'<script type="application/json" id="kf-specs">(.*?)</script>', text, re.S).group(1)
    return json.loads(blob)


def _data_of(spec):
    """Every ``data`` object in a Vega-Lite spec, layers included."""
    if isinstance(spec, dict):
        if isinstance(spec.get("data"), dict):
            yield spec["data"]
        for value in spec.values():
            yield from _data_of(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _data_of(value)


def _svg_text(dom: str) -> str:
    """The text of every <text> element inside the page's SVG plots."""
    svgs = re.findall(r"<svg\b.*?</svg>", dom, re.S)
    return " ".join(html.unescape(t) for svg in svgs for t in re.findall(r"<text\b[^>]*>([^<]*)</text>", svg))


def test_the_page_is_self_contained(page):
    out, result = page
    text = out.read_text()
    assert result.out == out and result.bytes == len(text.encode()) and result.plots == len(_specs(text))
    assert "vegaEmbed" in text and "<link" not in text
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<img[^>]+src=[\"']https?:", text)
    for spec in _specs(text).values():  # every plot carries its data: nothing to fetch
        found = list(_data_of(spec))
        assert found and all("values" in d and "url" not in d for d in found)


def test_the_page_holds_every_task_best_and_note(page, data):
    text = html.unescape(page[0].read_text())
    assert INTERPRETER_RULE in text and GPU_BUSY_NOT_RECORDED in text
    assert "kernel library" in text  # a column of the archive since schema v4 (NULL where none was measured)
    assert "kernel library baseline: not recorded in this archive" not in text
    bests = [(t, g) for t in data.tasks for g in t.gpus if g.best]
    assert bests
    for t, g in bests:
        assert f"{t.task} on {g.gpu}: best {g.best.time_us:.2f} us (attempt {g.best.attempt_id})" in text
        for step in g.lineage:
            assert f"<td class=\"n\">{step.attempt_id}</td>" in page[0].read_text()
    for t in data.tasks:
        assert f"{t.counts.tokens_in:,}" in text and f"{t.counts.cost_usd:.4f}" in text


def test_plots_per_task_and_gpu(page, data):
    specs = _specs(page[0].read_text())
    titles = [json.dumps(s.get("title", "")) for s in specs.values()]
    sections = [(t, g) for t in data.tasks for g in t.gpus]
    for t, g in sections:
        assert any(f"{t.task} on {g.gpu}" in title for title in titles)
    with_best = sum(1 for _, g in sections if g.best)
    with_cheats = sum(1 for t in data.tasks if t.counts.by_threat)
    # progress per GPU; baselines and roofline per best; verdicts per task; cheats where caught
    assert len(specs) == len(sections) + 2 * with_best + len(data.tasks) + with_cheats


def test_a_cpu_only_archive_says_it_has_no_timed_results(tmp_path):
    path = make_archive(tmp_path / "cpu.db", runs=1, environment=synthetic.INTERPRETER)
    result = write_report(path, tmp_path / "cpu.html")
    text = html.unescape((tmp_path / "cpu.html").read_text())
    assert not result.timed and "no timed results" in result.summary()
    assert CPU_ONLY in text and "not plotted" in text
    titles = " ".join(json.dumps(s.get("title", "")) for s in _specs(text).values())
    assert "best" not in titles and "us" not in titles.split()  # no time plotted, only verdict counts


def test_one_run(db, tmp_path):
    result = write_report(db, tmp_path / "run.html", run_id=1)
    text = (tmp_path / "run.html").read_text()
    assert "kernforge report: run 1" in text and result.tasks == 2
    with Archive.open(db, readonly=True) as archive:
        assert render(report_data(archive, run_id=1))[1] == result.plots


@pytest.mark.parametrize("make_out, message", [
    (lambda tmp: tmp / "missing" / "r.html", "folder .* does not exist"),
    (lambda tmp: tmp, "is a folder"),
])
def test_an_unwritable_out_is_a_clear_error(db, tmp_path, make_out, message):
    with pytest.raises(ReportError, match=message):
        write_report(db, make_out(tmp_path))


def test_bad_input_leaves_no_file(db, tmp_path):
    out = tmp_path / "r.html"
    with pytest.raises(ArchiveError, match="no run 7"):
        write_report(db, out, run_id=7)
    with pytest.raises(ArchiveError, match="no archive at"):
        write_report(tmp_path / "none.db", out)
    assert not out.exists()


def test_png_without_a_browser_fails_before_writing(db, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNFORGE_CHROMIUM", str(tmp_path / "no-such-browser"))
    with pytest.raises(ReportError, match="no headless Chromium"):
        write_report(db, tmp_path / "r.html", png=tmp_path / "r.png")
    assert not (tmp_path / "r.html").exists()


@needs_chromium
def test_in_a_browser_the_plots_are_svg_showing_the_archive_numbers(page, data):
    out, result = page
    dom = dump_dom(out)
    body = re.search(r"<body\b[^>]*\sdata-rendered=\"(\d+)\"[^>]*>", dom)
    assert body, "the page's script did not finish drawing the plots"
    assert int(body.group(1)) == result.plots and "data-render-error" not in body.group(0)
    assert 'id="kf-status"' not in dom  # the "needs JavaScript" notice is gone once the plots are drawn
    for ident in _specs(out.read_text()):
        plot = re.search(rf'<div[^>]*id="{ident}"[^>]*>(.*?)</svg>', dom, re.S)
        assert plot and "<svg" in plot.group(1), f"{ident} drew no SVG"
    shown = _svg_text(dom)
    bests = [(t, g) for t in data.tasks for g in t.gpus if g.best]
    assert bests
    for t, g in bests:
        assert f"{t.task} on {g.gpu}: best {g.best.time_us:.2f} us (attempt {g.best.attempt_id})" in shown
        for s in g.shapes:  # the roofline bars' labels, and the shapes on the baseline bars' axis
            assert f"{s.pct_roofline:.1f}" in shown and s.label in shown
    for t in data.tasks:
        assert f"verdicts by status ({t.counts.attempts} attempts)" in shown
        for status in t.counts.by_status:
            assert status in shown


@needs_chromium
def test_png_screenshot_of_the_whole_page(db, tmp_path):
    result = write_report(db, tmp_path / "r.html", png=tmp_path / "r.png")
    png = (tmp_path / "r.png").read_bytes()
    assert result.png == tmp_path / "r.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    expected = page_height(dump_dom(tmp_path / "r.html"))
    assert width == 1280 and expected and height > 1000 and abs(height - expected) < 100


def test_a_bound_time_of_record_is_marked_in_the_page(tmp_path):
    """A best's shape whose time of record is the guard's bound (a launch-bound size) reads as one:
    its time at most, its speedups at least, and the page says why."""
    from kernforge.verifier.verdict import BOUNDED

    path = tmp_path / "bound.db"
    make_archive(path, runs=1)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE measurements SET method = ?", (BOUNDED,))
    with Archive.open(path, readonly=True) as archive:
        data = report_data(archive)
    shapes = [s for t in data.tasks for g in t.gpus for s in g.shapes if s.time_us]
    assert shapes and all(s.bounded for s in shapes)
    page, _ = render(data)
    assert "&lt;= " in page and "a bound, not a measurement" in page
