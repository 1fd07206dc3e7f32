"""Lowered precision (THREATS #15) is named on evidence: the reference run again in the lower
precision lands where the candidate did. Errors of the same size from an honest float32 kernel
(a long sequential sum's drift) are never called a cheat."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from kernforge.verifier import precision as P
from kernforge.verifier import reference as R


class Affine(nn.Module):
    """x @ weight.T + shift: an input, a parameter and a buffer, each of which a kernel may round."""

    def __init__(self, n: int, k: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, k))
        self.register_buffer("shift", torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.shift


class MatVec(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def _rounded(t: torch.Tensor, precision: str, nearest: bool) -> torch.Tensor:
    return P.round_mantissa_(t.detach().clone(), P.MANTISSA[precision], nearest)


def _diagnose(cand, model, inputs):
    high, low = R.run_reference(model, inputs, [])
    return P.diagnose(cand, high[0], 0, model, inputs, [], wide=high[0].dtype != low[0].dtype)


# ---- rounding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7, 13), (64, 33)], ids=str)
@pytest.mark.parametrize("transposed", [False, True])
def test_rounding_to_nearest_is_a_bf16_cast_and_truncation_drops_bits(shape, transposed):
    x = torch.randn(shape) * 1e3
    if transposed and x.dim() == 2:
        x = x.t()  # a strided tensor rounds as well as a contiguous one
    assert torch.equal(P.round_mantissa_(x.clone(), 7, True), x.to(torch.bfloat16).float())
    for bits in (7, 10):
        cut = P.round_mantissa_(x.clone(), bits, False)
        assert bool((cut.abs() <= x.abs()).all()) and bool(((x - cut).abs() < x.abs() * 2.0**-bits).all())
        near = P.round_mantissa_(x.clone(), bits, True)
        assert bool(((x - near).abs() <= x.abs() * 2.0 ** -(bits + 1) * (1 + 1e-6)).all())
        assert torch.equal(P.round_mantissa_(near.clone(), bits, True), near), "rounding twice changes nothing"


def test_special_values_survive_rounding():
    odd_nans = torch.tensor([0x7FFFFFFF, -1], dtype=torch.int32).view(torch.float32)  # payloads of all ones
    x = torch.cat([torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0]), odd_nans])
    for bits in (7, 10):
        for nearest in (True, False):
            got = P.round_mantissa_(x.clone(), bits, nearest)
            assert got[:2].tolist() == [float("inf"), -float("inf")]
            assert bool(torch.isnan(got[[2, 5, 6]]).all()) and got[3:5].tolist() == [0.0, 0.0]
    assert P.round_mantissa_(torch.tensor([3.4028235e38]), 10, True).item() == float("inf"), "past tf32's largest"


# ---- what is named ------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
@pytest.mark.parametrize("nearest", [True, False], ids=["nearest", "truncated"])
@pytest.mark.parametrize("rounds", ["everything", "input", "weight"])
def test_a_kernel_on_lowered_operands_is_named(precision, nearest, rounds):
    """Operands rounded, products summed in float32 in an order of its own: the lowered run of
    the reference (in float64) explains it, whichever operands it lowered."""
    model = Affine(48, 96)
    x = torch.randn(40, 96)
    xr = _rounded(x, precision, nearest) if rounds in ("everything", "input") else x
    wr = _rounded(model.weight, precision, nearest) if rounds in ("everything", "weight") else model.weight.detach()
    shift = _rounded(model.shift, precision, nearest) if rounds == "everything" else model.shift
    cand = (xr.flip(1) @ wr.flip(1).T) + shift  # another summation order than the reference's
    got = _diagnose(cand, model, [x])
    assert got.get("lowered_precision") == precision, got
    assert got["lowered_evidence"]["ratio"] < P.MATCH_RATIO


def test_a_kernel_in_bfloat16_throughout_is_named():
    model = MatVec()
    a, b = torch.randn(64, 32), torch.randn(32, 8)
    cand = (a.to(torch.bfloat16) @ b.to(torch.bfloat16)).float()
    got = _diagnose(cand, model, [a, b])
    assert got.get("lowered_precision") == "bf16", got


def test_a_long_float32_sum_is_not_called_lower_precision():
    """KernelBench's matrix-vector product, shrunk in M: a float32 sum of 2^21 positive terms,
    one after another, drifts by about 2^-10.8 relative. Its error is within a quarter of that of
    tf32 operands truncated (the bias is about the same size); element by element it is not
    theirs, and the exact reference scaled by one common factor explains it far better."""
    g = torch.Generator().manual_seed(1)
    k = 1 << 21
    a, b = torch.rand(16, k, generator=g), torch.rand(k, 1, generator=g)
    cand = torch.from_numpy(np.cumsum((a * b[:, 0]).numpy(), axis=1, dtype=np.float32)[:, -1:].copy())
    exact = a.double() @ b.double()
    assert P.suspect(cand, exact) is not None, "the errors look like tf32's"
    c, h = cand.double().reshape(-1), exact.reshape(-1)
    cut = (_rounded(a, "tf32", False).double() @ _rounded(b, "tf32", False).double()).reshape(-1)
    assert P._median_error(c, cut, h) < P.MATCH_RATIO * P._median_error(c, h, h), "closer to truncated tf32 than to exact"
    got = _diagnose(cand, MatVec(), [a, b])
    assert "lowered_precision" not in got, got
    assert "not explained by a lower-precision run" in got["precision_note"] and "common relative bias" in got["precision_note"]


def test_a_common_bias_the_size_of_a_truncation_is_not_named():
    """The output is the exact answer scaled by tf32-truncation's own mean error: as close to the
    truncated run as an output can be without its roundings, and still no evidence."""
    model = MatVec()
    a, b = torch.rand(64, 4096), torch.rand(4096, 1)
    exact = a.double() @ b.double()
    cut = _rounded(a, "tf32", False).double() @ _rounded(b, "tf32", False).double()
    bias = float(((cut - exact) / exact).median())
    cand = (exact * (1 + bias) * (1 + 1e-7 * torch.randn(64, 1, dtype=torch.float64))).float()
    got = _diagnose(cand, model, [a, b])
    assert "lowered_precision" not in got, got


def test_errors_of_another_size_are_not_examined():
    """A plain wrong answer (errors far beyond any rounding) or a float32 kernel's rounding: no
    lowered run, no note."""
    class Refuses(nn.Module):
        calls = 0

        def forward(self, a, b):
            Refuses.calls += 1
            return a @ b

    a, b = torch.randn(32, 16), torch.randn(16, 4)
    model = Refuses()
    high, _ = R.run_reference(model, [a, b], [])
    before = Refuses.calls
    for cand in (high[0].float() * 2, high[0].float()):
        assert P.diagnose(cand, high[0], 0, model, [a, b], [], wide=True) == {}
    assert Refuses.calls == before


def test_inputs_over_the_bound_are_not_run_again(monkeypatch):
    monkeypatch.setattr(P, "MAX_BYTES", 1 << 10)
    model = MatVec()
    a, b = torch.randn(64, 32), torch.randn(32, 8)
    got = _diagnose((a.to(torch.bfloat16) @ b.to(torch.bfloat16)).float(), model, [a, b])
    assert "lowered_precision" not in got and "not run again" in got["precision_note"], got


def test_the_model_and_the_inputs_are_left_as_they_were():
    model = Affine(24, 40)
    x = torch.randn(16, 40)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x0 = x.clone()
    cand = (x @ model.weight.T + model.shift).detach() * (1 + 2e-3 * torch.randn(16, 24))  # no lowered run explains it
    got = _diagnose(cand, model, [x])
    assert "lowered_precision" not in got, got
    assert torch.equal(x, x0)
    for k, v in model.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, state[k]), k


def test_tf32_flags_come_back_however_the_block_ends():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    with pytest.raises(RuntimeError):
        with P.tf32_allowed():
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            raise RuntimeError("a reference that fails in TF32")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()) == before


def test_groups_cover_everything_each_one_and_inputs_or_weights():
    assert P._groups(["input 0", "input 1"]) == [("input 0", "input 1"), ("input 0",), ("input 1",)]
    assert P._groups(["input 0", "weight", "shift"]) == [
        ("input 0", "weight", "shift"), ("input 0",), ("weight",), ("shift",), ("weight", "shift")]
    many = [f"input {i}" for i in range(3)] + [f"w{i}" for i in range(3)]
    assert P._groups(many) == [tuple(many), tuple(many[:3]), tuple(many[3:])]
