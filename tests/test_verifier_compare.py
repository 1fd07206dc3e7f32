"""The comparison works a block of rows at a time (a KernelBench output of several GB leaves no
room for float64 copies of it): with tiny blocks, every figure is the one the whole tensor gives."""

from __future__ import annotations

import pytest
import torch

from kernforge.verifier import compare
from kernforge.verifier.compare import Tolerance


@pytest.fixture
def tiny_blocks(monkeypatch):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 7)


def _pair(shape=(9, 5, 3)):
    g = torch.Generator().manual_seed(0)
    high = torch.randn(shape, generator=g)
    return high.clone(), high


def test_a_wrong_element_is_found_in_a_late_block(tiny_blocks):
    cand, high = _pair()
    cand[8, 4, 2] += 1.0
    mism = compare.compare(cand, high, Tolerance(rtol=1e-3, atol=1e-3))
    assert not mism.ok and mism.bad == 1
    assert mism.worst_index == (8, 4, 2)
    assert mism.max_abs_err == pytest.approx(1.0, rel=1e-6)


def test_the_scale_is_the_whole_reference(tiny_blocks):
    """atol scales with the rms of the whole reference: a block of small values gets no stricter."""
    cand, high = _pair((8, 4))
    high[:4] *= 1e-6
    cand = high.clone()
    rms = float(high.double().pow(2).mean().sqrt())
    cand[1, 0] += 0.5 * 1e-2 * rms  # within atol * rms, far beyond rtol of that small element
    assert compare.compare(cand, high, Tolerance(rtol=1e-5, atol=1e-2)).ok
    cand[1, 0] += 1e-2 * rms
    assert not compare.compare(cand, high, Tolerance(rtol=1e-5, atol=1e-2)).ok


def test_within_tolerance_per_call_in_column_blocks(tiny_blocks):
    cand, high = _pair((4, 6, 5))
    cand[2, 5, 4] = float("nan")
    ok = compare.within_tolerance(cand, high, Tolerance(rtol=1e-3, atol=1e-3))
    assert ok.tolist() == [True, True, False, True]


def test_magnitude_skips_non_finite(tiny_blocks):
    _, high = _pair()
    whole = high.clone()
    high[3, 1, 1] = float("inf")
    largest, rms = compare.magnitude(high, torch.device("cpu"))
    finite = torch.where(torch.isfinite(high), high, torch.zeros_like(high)).double()
    assert largest == pytest.approx(float(finite.abs().max()))
    assert rms == pytest.approx(float(finite.pow(2).mean().sqrt()))
    assert largest <= float(whole.abs().max())


def test_max_abs_difference_and_nan(tiny_blocks):
    a, b = _pair()
    b = b.clone()
    b[7, 2, 0] += 0.25
    assert compare.max_abs_difference(a, b) == pytest.approx(0.25, rel=1e-6)
    b[0, 0, 0] = float("nan")
    assert compare.max_abs_difference(a, b) == float("inf")
    assert compare.max_abs_difference(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)) == float("inf")


def test_untouched_counts(tiny_blocks):
    cand, high = _pair()
    cand.view(-1).view(torch.uint8)[:8] = 0xFF  # two float32 elements of poison, never written
    cand[5, 0, 0] = 0.0
    never, zeros = compare.untouched_counts(cand, high)
    assert (never, zeros) == (2, 1)


def test_leading_is_a_view_of_the_first_block(tiny_blocks):
    _, high = _pair()
    first = compare.leading(high)
    assert first.shape[0] == 1 and first.data_ptr() == high.data_ptr()


def test_float8_outputs_of_a_batch_are_judged():
    """An fp8 quantisation task's reference output is float8 too: the batch rule must read it
    (PyTorch has no float8 nan_to_num; on the H200 an honest fp8 seed failed here as the
    reference's error)."""
    high = (torch.arange(3 * 64, dtype=torch.float32).reshape(3, 64) / 50 - 1.5).to(torch.float8_e4m3fn)
    cand = high.clone()
    cand[2, 5] = torch.tensor(40.0).to(torch.float8_e4m3fn)
    for fused in (False, None):
        ok = compare.within_tolerance(cand, high, Tolerance(rtol=0.0, atol=0.1), fused=fused)
        assert ok.tolist() == [True, True, False]


def test_a_huge_reference_does_not_overflow_the_scale_of_a_batch():
    """16-bit outputs are compared in float32, but the rms scale is summed in float64: squares of
    1e20 overflow float32, and an infinite scale would pass every finite output of a timed batch."""
    high = torch.full((2, 64), 1e20)
    cand = torch.zeros(2, 64, dtype=torch.bfloat16)
    cand[1] = high[1].bfloat16()
    assert compare.within_tolerance(cand, high, Tolerance(rtol=1e-2, atol=1e-2)).tolist() == [False, True]


def test_a_vanishing_number_of_marginal_elements_passes_and_is_said():
    """An honest float32 GEMM with K = 32768 on the H200 had 1 element of 3,178,496 just out of
    tolerance. At most one per million may be, each within 4x its allowance; more of them, one
    far out, or one in an output under a million elements fails."""
    tol = Tolerance(rtol=1e-3, atol=0.0)
    high = torch.ones(2_000_000, dtype=torch.float64)

    def changed(changes, n=2_000_000):
        cand = high[:n].clone()
        for at, by in changes:
            cand[at] *= 1 + by * tol.rtol
        return cand

    def judged(changes, n=2_000_000):
        return compare.compare(changed(changes, n), high[:n], tol)

    two = judged([(5, 2.0), (1_999_999, 3.5)])
    assert two.ok and two.marginal == 2 and two.bad == 0 and two.worst_excess == pytest.approx(3.5)
    assert "all but 2 of 2000000 elements within tolerance" in two.describe()
    calls = torch.stack([changed([(5, 2.0), (9, 3.5)]), changed([(5, 2.0), (6, 2.0), (7, 2.0)]), changed([(5, 4.5)])])
    assert compare.within_tolerance(calls, high.expand(3, -1), tol).tolist() == [True, False, False], "a timed batch alike"
    three = judged([(5, 2.0), (6, 2.0), (7, 2.0)])
    assert not three.ok and three.bad == 3 and three.marginal == 0
    far = judged([(5, 4.5)])
    assert not far.ok and far.worst_excess == pytest.approx(4.5)
    assert not judged([(5, 2.0)], n=999_999).ok, "under a million elements, none may be out"
