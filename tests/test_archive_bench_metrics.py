"""archive/bench_metrics.py: KernelBench's metrics, against values worked out by hand."""

from __future__ import annotations

import pytest

from kernforge.archive.bench_metrics import ProblemResult, by_level, metrics


def problem(name, correct=True, eager=None, compile=None, gpu="NVIDIA H200", level="level1", attempts=3):
    return ProblemResult(name=name, level=level, attempts=attempts, correct=correct, gpu=gpu,
                         speedup_eager=eager, speedup_compile=compile)


#: four problems on a GPU: A fast, B faster than eager only, C with no torch.compile time, D wrong
GPU_RUN = [
    problem("A", eager=3.0, compile=1.2),
    problem("B", eager=1.2, compile=0.5),
    problem("C", eager=0.8, compile=None),
    problem("D", correct=False),
]


def test_fast_p_counts_correct_and_faster_over_all_problems():
    m = metrics(GPU_RUN)
    assert (m.problems, m.attempted, m.correct, m.correctness, m.measured) == (4, 4, 3, 0.75, True)
    # eager speedups of the correct problems: 3.0, 1.2, 0.8; the denominator is all four problems
    assert m.fast["eager"] == {0.0: 3 / 4, 1.0: 2 / 4, 1.5: 1 / 4, 2.0: 1 / 4}
    # compile: 1.2 and 0.5 (C has no torch.compile time: untimed, counted as not faster)
    assert m.fast["compile"] == {0.0: 2 / 4, 1.0: 1 / 4, 1.5: 0.0, 2.0: 0.0}
    assert m.untimed == {"eager": 0, "compile": 1}
    assert m.faster_than_compile == 1 / 4


def test_geometric_means_are_over_the_correct_timed_problems():
    m = metrics(GPU_RUN)
    assert m.geomean["eager"] == pytest.approx((3.0 * 1.2 * 0.8) ** (1 / 3))  # 1.4228
    assert m.geomean["compile"] == pytest.approx((1.2 * 0.5) ** 0.5)  # 0.7746: slower than torch.compile


def test_a_speedup_equal_to_p_is_not_faster_than_p():
    m = metrics([problem("A", eager=1.0, compile=2.0), problem("B", eager=1.5, compile=1.5)])
    assert m.fast["eager"] == {0.0: 1.0, 1.0: 0.5, 1.5: 0.0, 2.0: 0.0}
    assert m.fast["compile"] == {0.0: 1.0, 1.0: 1.0, 1.5: 0.5, 2.0: 0.0}


def test_interpreter_results_measure_correctness_only():
    cpu = [problem("A", gpu="cpu"), problem("B", correct=False, gpu="cpu"), problem("C", correct=False, gpu=None,
                                                                                    attempts=0)]
    m = metrics(cpu)
    assert (m.problems, m.attempted, m.correct, m.correctness, m.measured) == (3, 2, 1, 1 / 3, False)
    assert m.fast is None and m.fast_p("eager", 1.0) is None and m.faster_than_compile is None
    assert m.geomean == {"eager": None, "compile": None}
    data = m.to_dict()
    assert data["fast_p"] is None and data["geomean_speedup"] == {"eager": None, "compile": None}


def test_no_correct_problem_on_a_gpu_is_zero_not_unmeasured():
    m = metrics([problem("A", correct=False), problem("B", correct=False)])
    assert m.measured and m.correctness == 0.0
    assert m.fast["compile"] == {0.0: 0.0, 1.0: 0.0, 1.5: 0.0, 2.0: 0.0} and m.geomean["compile"] is None


def test_by_level_in_natural_order_then_all():
    results = [problem("x", level="level10", eager=2.5, compile=2.5), problem("y", level="level2", correct=False),
               problem("z", level="level2", eager=1.1, compile=0.9)]
    groups = by_level(results)
    assert [g.group for g in groups] == ["level2", "level10", "all"]
    level2, level10, overall = groups
    assert (level2.problems, level2.correct, level2.fast["compile"][1.0], level2.fast["eager"][1.0]) == (2, 1, 0.0, 0.5)
    assert (level10.problems, level10.fast["compile"][2.0]) == (1, 1.0)
    assert overall.fast["compile"][1.0] == pytest.approx(1 / 3)
    assert overall.geomean["eager"] == pytest.approx((2.5 * 1.1) ** 0.5)


def test_a_level_with_nothing_judged_on_a_gpu_run_is_measured_and_not_fast():
    results = [problem("x", level="level1", eager=2.0, compile=1.1), problem("y", level="level2", correct=False,
                                                                            gpu=None, attempts=0)]
    level1, level2, overall = by_level(results)
    assert level2.measured and level2.fast["compile"] == {0.0: 0.0, 1.0: 0.0, 1.5: 0.0, 2.0: 0.0}
    assert not metrics(results[1:]).measured  # alone, nothing says it was a GPU run


def test_json_names_thresholds_as_kernelbench_does():
    data = metrics(GPU_RUN).to_dict()
    assert list(data["fast_p"]["compile"]) == ["0", "1", "1.5", "2"]
    assert data["faster_than_compile"] == 0.25 and data["correctness"] == 0.75
    assert ProblemResult.from_dict(GPU_RUN[0].to_dict()) == GPU_RUN[0]
