"""bench/census_probe.py on the CPU (the task's reference, not its Triton seed): a row per task at
its smallest public shape, with each way a checked call is wrapped. Its times mean nothing here;
the H200 phase ``census`` runs the seeds."""

from __future__ import annotations

import math

from bench_helpers import bench_script


def test_a_row_times_each_wrapping_of_a_checked_call_at_the_smallest_shape():
    bench = bench_script("census_probe")
    row = bench.measure("rms_norm", "cpu", reps=3, reference=True)
    assert row["task"] == "rms_norm" and row["shape"] == "T=1 H=256"
    for mode in bench.MODES:
        assert math.isfinite(row[mode]) and row[mode] >= 0.0, (mode, row)
