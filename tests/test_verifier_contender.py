"""verifier/contender.py: a candidate clearly slower than the best at a shape is timed no further,
and such a verdict is never scored, ranked or tuned towards."""

import pytest

from kernforge.tasks.spec import Shape
from kernforge.verifier import contender
from kernforge.verifier.verdict import NOT_TIMED, Accepted, Rejected, ShapeResult, Status


def _shape(time_us, T=4, hidden=False, timing="graph"):
    return ShapeResult({"T": T, "H": 64}, hidden, "bfloat16", timing, time_us=time_us, compile_us=100.0, eager_us=200.0)


def test_the_bar_is_the_best_verdicts_gpu_times_and_nothing_else():
    whole = Accepted(shapes=(_shape(50.0), _shape(20.0, T=2, hidden=True)))
    assert contender.bar_of(whole) == {contender.key({"T": 4, "H": 64}, False): 50.0,
                                       contender.key({"T": 2, "H": 64}, True): 20.0}
    assert contender.bar_of(None) is None
    assert contender.bar_of(Rejected(Status.INCORRECT, "max abs err 1.0")) is None
    assert contender.bar_of(Accepted(shapes=(_shape(9.0, timing="interpreter"),))) is None  # CPU wall clock
    partial = Accepted(shapes=(_shape(50.0), _shape(None, T=2, timing=NOT_TIMED)))
    assert contender.bar_of(partial) is None, "a verdict timed at some shapes sets no bar"


@pytest.mark.parametrize("time_us, stops", [(109.9, False), (100.0, False), (80.0, False), (110.1, True)])
def test_timing_stops_only_beyond_the_margin(time_us, stops):
    bar = {contender.key({"T": 4, "H": 64}, False): 100.0}
    why = contender.beaten(_shape(time_us), bar)
    assert (why is not None) == stops
    if stops:
        assert why.startswith(contender.NOT_A_CONTENDER) and "100.00 us" in why and f"{time_us:.2f} us" in why
    assert contender.beaten(_shape(500.0, T=8), bar) is None, "a shape the bar does not know is timed on"
    assert contender.beaten(_shape(500.0), None) is None


def test_the_largest_public_shape_goes_first():
    small, large, hidden = Shape((("T", 2),)), Shape((("T", 64),)), Shape((("T", 64),))
    turns = [(small, False), (hidden, True), (large, False)]
    assert contender.order(turns, large) == [(large, False), (small, False), (hidden, True)]
    assert contender.order(turns, Shape((("T", 7),))) == turns


def test_a_partly_timed_verdict_has_no_score_time_or_tuning_weight():
    from kernforge.archive.score import summarize
    from kernforge.loop.offline import _times
    from kernforge.loop.search import fitness_of, gpu_geomean_us

    partial = Accepted(shapes=(_shape(10.0), contender.untimed(Shape((("T", 2), ("H", 64))), False, "bfloat16")))
    # timed alone, 10 us at T=4 would be 10x over torch.compile: it must not rank as that
    assert summarize(partial.shapes)["score"] is None and summarize(partial.shapes)["speedup_eager"] is None
    assert gpu_geomean_us(partial) is None and fitness_of(partial) == (0, 0.0)
    assert _times(partial) == {}
    whole = Accepted(shapes=(_shape(10.0), _shape(5.0, T=2)))
    assert summarize(whole.shapes)["score"] == pytest.approx(14.142, rel=1e-3) and fitness_of(whole)[0] == 2
