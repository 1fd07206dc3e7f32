"""archive/bench_runs.py: a benchmark run's problems read back from its attempts and audits (GPU
verdicts made up here; the CPU path runs for real in test_loop_benchmark.py)."""

from __future__ import annotations

import pytest

from kernforge.archive import synthetic
from kernforge.archive.bench_metrics import by_level
from kernforge.archive.bench_runs import bench_run, benchmark_runs, level_of, problem_results
from kernforge.archive.errors import ArchiveError
from kernforge.archive.store import Archive
from kernforge.verifier.verdict import Accepted, Rejected, Status

from bench_helpers import H200, REFS, add, shape


@pytest.fixture
def archive(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        yield archive


def test_problems_read_back_from_attempts_and_audits(archive):
    ids = {name: archive.register_task(synthetic.task_record(name)) for name in REFS}
    run = archive.start_run({"settings": {"tasks": ["/kb/level1", "/kb/level2"], "benchmark": "kernelbench",
                                          "models": ["m1"]}, "llm": {"model": "m1"}, "task_refs": REFS})
    # ReLU: public shape 3x over eager and 1.5x over compile; its hidden shape (10x) is not KernelBench's size
    relu = add(archive, run, 0, ids["19_ReLU"], Accepted(shapes=(shape(10, 30, 15), shape(10, 100, 100, hidden=True)),
                                                         environment=dict(H200)), "relu v1")
    archive.record_audit(relu, synthetic.audit(archive.get_attempt(relu).verdict))
    # a faster ReLU whose time did not hold in its audit: demoted, neither correct nor fast
    faster = add(archive, run, 1, ids["19_ReLU"], Accepted(shapes=(shape(5, 30, 15),), environment=dict(H200)),
                  "relu v2")
    archive.record_audit(faster, synthetic.audit(archive.get_attempt(faster).verdict, ratio=1.6))
    # Softmax: one wrong, then one correct that has no audit yet: correct, untimed
    wrong = Rejected(Status.INCORRECT, "mismatch", environment=dict(H200))
    add(archive, run, 2, ids["23_Softmax"], wrong, "softmax v1")
    unaudited = add(archive, run, 3, ids["23_Softmax"], Accepted(shapes=(shape(10, 10, 10),),
                                                                 environment=dict(H200)), "softmax v2")
    # Matmul and Gemm: never tried

    found = bench_run(archive, run)
    assert (found.benchmark, found.label, found.status) == ("kernelbench", "m1", "running")
    results = problem_results(archive, found)
    assert [(r.name, r.level, r.attempts, r.correct) for r in results] == [
        ("2_Matmul", "level1", 0, False), ("19_ReLU", "level1", 2, True), ("23_Softmax", "level1", 2, True),
        ("12_Gemm", "level2", 0, False)]  # by level, then KernelBench's number
    relu_result, softmax = results[1], results[2]
    assert (relu_result.speedup_eager, relu_result.speedup_compile) == pytest.approx((3.0, 1.5))
    assert relu_result.attempt_id == relu
    assert relu_result.gpu == "NVIDIA H200"
    assert (softmax.speedup_eager, softmax.speedup_compile, softmax.attempt_id) == (None, None, unaudited)

    level1, level2, overall = by_level(results)
    assert (level1.problems, level1.correct, level1.fast["compile"][1.0], level1.untimed["compile"]) == (3, 2, 1 / 3, 1)
    # nothing of level 2 was judged, on a GPU run: measured, and none of it fast
    assert (level2.problems, level2.correct, level2.measured, level2.fast["eager"][0.0]) == (1, 0, True, 0.0)
    assert (overall.correct, overall.fast["eager"][2.0]) == (2, 1 / 4)
    assert overall.geomean["compile"] == pytest.approx(1.5)


def test_only_benchmark_runs_are_listed_and_read(archive):
    plain = archive.start_run({"settings": {"tasks": ["rms_norm"]}, "llm": None})
    bench = archive.start_run({"settings": {"tasks": ["/kb/level1"], "benchmark": "kernelbench"}, "llm": None,
                               "task_refs": {"19_ReLU": REFS["19_ReLU"]}})
    assert [(r.run_id, r.label) for r in benchmark_runs(archive)] == [(bench, "offline")]
    assert benchmark_runs(archive, "other") == []
    with pytest.raises(ArchiveError, match=f"run {plain} .* is not a benchmark run"):
        bench_run(archive, plain)
    with pytest.raises(ArchiveError, match="no run 99"):
        bench_run(archive, 99)


@pytest.mark.parametrize("ref, level", [("/kb/level3/1_MLP.py", "level3"), ("builtin:rms_norm", "builtin"),
                                        ("/tasks/my_op", "tasks")])
def test_level_is_the_folder_of_the_problem(ref, level):
    assert level_of(ref) == level
