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
    # a faster ReLU whose time did not hold in its audit: demoted, its time not believed
    faster = add(archive, run, 1, ids["19_ReLU"], Accepted(shapes=(shape(5, 30, 15),), environment=dict(H200)),
                  "relu v2")
    archive.record_audit(faster, synthetic.audit(archive.get_attempt(faster).verdict, ratio=1.6))
    # Softmax: one wrong, then one correct that has no audit yet: correct, untimed
    wrong = Rejected(Status.INCORRECT, "mismatch", environment=dict(H200))
    add(archive, run, 2, ids["23_Softmax"], wrong, "softmax v1")
    unaudited = add(archive, run, 3, ids["23_Softmax"], Accepted(shapes=(shape(10, 10, 10),),
                                                                 environment=dict(H200)), "softmax v2")
    # Gemm: its one kernel's time did not hold in the audit (on the H200, 27_SELU beside a capture):
    # correct still, as KernelBench counts correctness, and untimed
    slow = add(archive, run, 4, ids["12_Gemm"], Accepted(shapes=(shape(5, 30, 15),), environment=dict(H200)), "gemm v1")
    archive.record_audit(slow, synthetic.audit(archive.get_attempt(slow).verdict, ratio=1.3))
    # Matmul: never tried

    found = bench_run(archive, run)
    assert (found.benchmark, found.label, found.status) == ("kernelbench", "m1", "running")
    results = problem_results(archive, found)
    assert [(r.name, r.level, r.attempts, r.correct) for r in results] == [
        ("2_Matmul", "level1", 0, False), ("19_ReLU", "level1", 2, True), ("23_Softmax", "level1", 2, True),
        ("12_Gemm", "level2", 1, True)]  # by level, then KernelBench's number
    relu_result, softmax = results[1], results[2]
    assert (relu_result.speedup_eager, relu_result.speedup_compile) == pytest.approx((3.0, 1.5))
    assert relu_result.attempt_id == relu
    assert relu_result.gpu == "NVIDIA H200"
    assert (softmax.speedup_eager, softmax.speedup_compile, softmax.attempt_id) == (None, None, unaudited)

    level1, level2, overall = by_level(results)
    assert (level1.problems, level1.correct, level1.fast["compile"][1.0], level1.untimed["compile"]) == (3, 2, 1 / 3, 1)
    # level 2's one problem is correct with no believed time, on a GPU run: measured, none of it fast
    assert (level2.problems, level2.correct, level2.measured, level2.fast["eager"][0.0]) == (1, 1, True, 0.0)
    assert results[3].speedup_eager is None and level2.untimed["eager"] == 1
    assert (overall.correct, overall.fast["eager"][2.0]) == (3, 1 / 4)
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


def test_only_an_audit_that_found_the_time_slower_leaves_the_kernel_correct():
    recorded = Accepted(shapes=(shape(5, 30, 15),), environment=dict(H200))
    assert synthetic.audit(recorded, ratio=1.3).only_slower
    assert not synthetic.audit(recorded, ratio=1.02).only_slower  # passed
    cheat = Rejected(Status.CHEAT, "torch computed it", threat=16, environment=dict(H200))
    assert not synthetic.audit(recorded, again=cheat).only_slower
    wrong = Rejected(Status.INCORRECT, "mismatch", environment=dict(H200))
    assert not synthetic.audit(recorded, again=wrong).only_slower
