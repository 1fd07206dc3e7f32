"""bench/refworker_steps.py on the CPU: a timed batch's fresh inputs cost the draws and their
copies alone (no view made per call), drawn for all calls at once where the task's draw allows;
and comparing its calls' outputs costs ops that do not grow with the number of calls (each
call's views are made once, not per window; batched, the reference too runs once per part)."""

from __future__ import annotations

from bench_helpers import bench_script


def _bench():
    return bench_script("refworker_steps")


def test_a_windows_draw_and_comparison_make_no_view_per_call():
    bench = _bench()
    small, large = (bench.measure("rms_norm", "T=2,H=256", calls, 2, "cpu", batched=False) for calls in (8, 32))
    for row in (small, large):
        assert row["draw"] == "per call"
        assert row["fill_ops"] == row["fill_writes"], f"views made per call: {row['top_fill']}"
    # rms_norm draws x and a weight per call (randn, randn, mul, add) and copies both
    assert large["fill_writes"] - small["fill_writes"] == (32 - 8) * 6
    assert large["verify_ops"] == small["verify_ops"], (small["top_verify"], large["top_verify"])


def test_a_batched_draw_costs_the_same_ops_for_any_number_of_calls():
    bench = _bench()
    small, large = (bench.measure("rms_norm", "T=2,H=256", calls, 2, "cpu") for calls in (8, 32))
    assert small["draw"] == large["draw"] == "batched"
    assert large["fill_ops"] == small["fill_ops"], (small["top_fill"], large["top_fill"])
    # the per-call draw's six writes per call are now four draws and one copy per input
    assert large["fill_writes"] <= 8, large["top_fill"]


def test_a_stacked_reference_costs_the_same_ops_for_any_number_of_calls():
    """Batched, the comparison runs the reference itself, over every call at once: its ops (the
    reference's and the comparison's) do not grow with the calls, where the reference run call
    by call made a dozen ops per call."""
    bench = _bench()
    small, large = (bench.measure("rms_norm", "T=2,H=256", calls, 2, "cpu") for calls in (8, 32))
    assert large["verify_ops"] == small["verify_ops"], (small["top_verify"], large["top_verify"])
    assert dict(large["top_verify"]).get("aten.pow", 0) <= 3, "the reference ran per call"


def test_a_windows_bytes_are_counted_against_what_its_calls_move():
    """The bytes a window's draw and verification read and write, as a multiple of what its calls
    move by the task's roofline: the same multiple for 8 calls and 32 (they grow with the calls),
    and more than the calls' own (the draw writes every input, the comparison reads every output
    and its reference)."""
    bench = _bench()
    small, large = (bench.measure("rms_norm", "T=2,H=256", calls, 2, "cpu") for calls in (8, 32))
    for key in ("fill_x", "verify_x"):
        assert small[key] > 1 and large[key] > 1, (small[key], large[key])
        assert abs(large[key] - small[key]) < 0.25 * small[key], (key, small[key], large[key])
