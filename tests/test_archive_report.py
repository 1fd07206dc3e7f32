"""archive/report.py: the verdict ``eval`` prints and the measurements ``archive show`` prints are
readable at 80 and 120 columns: shapes and times whole, in one unit each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernforge.archive.report import measurements_table, verdict_view
from kernforge.verifier.verdict import BOUNDED, Accepted, ShapeResult
from test_archive_tables import assert_fits, render

SHAPES = tuple(
    ShapeResult({"T": t, "H": 7168, "GROUP_SIZE": 128}, hidden, "bfloat16", "graph", time_us=us, spread_pct=0.8,
                eager_us=us * 3.1, compile_us=us * 1.4, speedup_eager=3.1, speedup_compile=1.4, gbps=3871.2,
                tflops=0.31, pct_bandwidth=91.2, floor_us=us * 0.9, max_abs_err=3.9e-3, max_rel_err=7.8e-3)
    for t, hidden, us in ((1, False, 7133.87), (16384, True, 153_070.4), (64, False, 2.21))
)
# the small shape's time of record as the guard's bound (a launch-bound size): marked, and said why
SHAPES = SHAPES[:2] + (replace(SHAPES[2], method=BOUNDED),)
VERDICT = Accepted(shapes=SHAPES, environment={"gpu": "NVIDIA H200", "torch": "2.13.0", "triton": "3.5.0"})


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("build", [lambda: verdict_view(VERDICT, "fp8_quant_per_group"),
                                   lambda: measurements_table(SHAPES)], ids=["eval", "show"])
def test_measurements_are_readable(build, width):
    text = render(build(), width)
    assert_fits(text, width)
    for shape in ("T=1 H=7168 GROUP_SIZE=128", "T=16384 H=7168 GROUP_SIZE=128 (hidden)"):
        assert shape in text  # whole, on one line
    for time in ("7.13 ms", "153 ms", "<= 2.21 us"):
        assert time in text
    assert "a bound, not a measurement" in " ".join(text.split())
    assert "7133." not in text and "e+0" not in text
