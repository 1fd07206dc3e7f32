"""archive/bench_report.py: the tables of one benchmark run and of two side by side, at 80 columns,
from GPU verdicts made up here."""

from __future__ import annotations

import pytest
from rich.console import Console

from kernforge.archive import synthetic
from kernforge.archive.bench_report import bench_report, compare_view, report_view, runs_table
from kernforge.archive.bench_runs import bench_run, benchmark_runs
from kernforge.archive.store import Archive
from kernforge.verifier.verdict import Accepted

from bench_helpers import H200, REFS, add, shape


@pytest.fixture
def reports(tmp_path):
    """Two models' runs: each solves ReLU (1.5x and 1.6x over torch.compile, audited) and Softmax
    (no audit yet: untimed); neither tries Matmul or Gemm."""
    with Archive.create(tmp_path / "k.db") as archive:
        ids = {name: archive.register_task(synthetic.task_record(name)) for name in REFS}
        runs = []
        for k, model in enumerate(("MiniMax-M3", "qwen3-coder-480b")):
            run = archive.start_run({"settings": {"benchmark": "kernelbench", "models": [model]},
                                     "llm": {"model": model}, "task_refs": REFS})
            relu = add(archive, run, 0, ids["19_ReLU"],
                        Accepted(shapes=(shape(10, 30, 15 + k),), environment=dict(H200)), f"relu {k}")
            archive.record_audit(relu, synthetic.audit(archive.get_attempt(relu).verdict))
            add(archive, run, 1, ids["23_Softmax"], Accepted(shapes=(shape(10, 10, 10),), environment=dict(H200)),
                 f"softmax {k}")
            runs.append(run)
        yield [bench_report(archive, bench_run(archive, r)) for r in runs], benchmark_runs(archive)


def rendered(renderable) -> str:
    console = Console(width=80, record=True)
    console.print(renderable)
    return console.export_text()


def test_one_run_fits_80_columns_with_every_metric_and_name(reports):
    text = rendered(report_view(reports[0][0]))
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    for name in REFS:
        assert name in text
    for words in ("fast_1.5 compile", "faster than compile", "geomean x compile", "1.50x (1 untimed)", "3.00x",
                  "2 (67%)", "not tried"):
        assert words in text, words
    assert "not measured" not in text  # a GPU run: level 2, never tried, is measured and not fast


def test_two_runs_side_by_side_fit_80_columns(reports):
    text = rendered(compare_view(reports[0]))
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "run 1 MiniMax-M3" in text and "qwen3-coder-480b" in text
    assert "yes 1.50x" in text and "yes 1.60x" in text
    titles = [line.split()[0] for line in text.splitlines() if "runs side by side" in line]
    assert titles == ["level1:", "level2:", "all:"]


def test_the_list_of_runs(reports):
    text = rendered(runs_table(reports[1]))
    assert "MiniMax-M3" in text and "qwen3-coder-480b" in text and "kernelbench" in text


def test_a_problem_the_run_left_out_says_why(tmp_path):
    """A problem too large for the run's devices is left out before anything is judged: the report
    says "left out" and why, not "not tried" (which reads as a run cut short)."""
    why = "12_Gemm: task too large for this GPU: the shape batch_size=1024 ... (a side file NAME.meta.py ...)"
    with Archive.create(tmp_path / "k.db") as archive:
        ids = {name: archive.register_task(synthetic.task_record(name)) for name in REFS}
        run = archive.start_run({"settings": {"benchmark": "kernelbench"}, "task_refs": REFS})
        add(archive, run, 0, ids["19_ReLU"], Accepted(shapes=(shape(10, 30, 15),), environment=dict(H200)), "relu")
        archive.set_left_out(run, {"12_Gemm": why})
        report = bench_report(archive, bench_run(archive, run))
    left = {p.name: p.left_out for p in report.problems}
    assert left["12_Gemm"] == why and left["19_ReLU"] is None and left["2_Matmul"] is None
    text = rendered(report_view(report))
    assert "left out" in text and "not tried" in text  # 2_Matmul was simply not reached
    assert "12_Gemm left out: 12_Gemm: task too large for this GPU" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80
