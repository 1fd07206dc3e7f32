"""The fused pass/fail kernel of the timed batches against the PyTorch rule it replaces.

Both must say the same of every call: run here under the Triton interpreter on the CPU, against
``compare.within_tolerance`` (which takes the PyTorch ops wherever the kernel does not apply).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from kernforge.tasks.spec import Tolerance
from kernforge.verifier import compare, compare_kernel

TOL = Tolerance(rtol=1e-2, atol=1e-2)


def kernel_says(cand, high, tol=TOL, low=None):
    n = cand.shape[0]
    work = compare._work_dtype(cand, high)
    h = high.reshape(n, -1).to(work)
    scale = (torch.where(torch.isfinite(h), h, torch.zeros_like(h)).pow(2).mean(dim=1, keepdim=True)).sqrt()
    assert compare_kernel.applies(cand, high, low, interpret=True)
    return compare_kernel.passing_calls(cand, high, scale, tol.rtol, tol.atol, low, work == torch.float64,
                                        compare.MARGINAL_FACTOR, compare.marginal_allowed(h.shape[1])).tolist()


def torch_says(cand, high, tol=TOL, low=None):
    return compare.within_tolerance(cand, high, tol, low).tolist()


@pytest.mark.parametrize("cand_dtype, high_dtype", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.float32),
    (torch.float32, torch.float64), (torch.float64, torch.float64),
    # an fp8 quantisation task's output, against its reference at fp8 and at float32
    (torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e4m3fn, torch.float32), (torch.float8_e5m2, torch.float32),
])
@pytest.mark.parametrize("with_low", [False, True], ids=["no_low", "low"])
@pytest.mark.parametrize("width", [1, 2047, 2049 + 77])
def test_random_outputs_judged_alike(cand_dtype, high_dtype, with_low, width):
    """Calls off by growing amounts: some pass, some fail, both implementations agree on each."""
    gen = torch.Generator().manual_seed(width)
    n = 8
    high = torch.randn(n, width, generator=gen, dtype=torch.float64)
    # through the candidate's dtype first: an fp8 output of the float32 reference is exact only so
    high = (high.to(cand_dtype) if cand_dtype.itemsize == 1 else high).to(high_dtype)
    noise = torch.randn(n, width, generator=gen, dtype=torch.float64)
    amounts = torch.tensor([0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0], dtype=torch.float64).reshape(n, 1)
    cand = (high.double() + amounts * noise).to(cand_dtype)
    low = (high.double() + 1e-3 * torch.randn(n, width, generator=gen, dtype=torch.float64)).to(cand_dtype) if with_low else None
    got, want = kernel_says(cand, high, low=low), torch_says(cand, high, low=low)
    assert got == want
    assert want[0] and not want[-1], "the case spans passing and failing calls"


def test_every_non_finite_combination_judged_alike():
    """NaN and Inf pass only where the reference has the same value at the same place."""
    values = [float("nan"), float("inf"), float("-inf"), 1.0, 0.0]
    pairs = list(itertools.product(values, values))
    width = 300
    cand = torch.randn(len(pairs), width, dtype=torch.float32)
    high = cand.clone()
    for k, (c, h) in enumerate(pairs):
        cand[k, 123], high[k, 123] = c, h
    got, want = kernel_says(cand, high), torch_says(cand, high)
    assert got == want
    expect = [c == h or (c != c and h != h) for c, h in pairs]
    assert want == expect


def test_the_low_reference_widens_the_allowance_alike():
    """An error within twice eager's own error passes, beyond it fails, in both."""
    width = 512
    high = torch.linspace(-3, 3, width, dtype=torch.float32).repeat(4, 1)
    low = high + 0.5  # eager's own error: 0.5 everywhere
    offsets = torch.tensor([0.9, 1.1, 2.0, 2.2]).reshape(4, 1)  # times eager's error
    cand = high + offsets * 0.5
    tol = Tolerance(rtol=0.0, atol=0.0)
    assert kernel_says(cand, high, tol, low) == torch_says(cand, high, tol, low) == [True, True, False, False]


def test_one_bad_element_in_the_last_partial_block_fails_its_call():
    width = compare_kernel.BLOCK + 5
    high = torch.randn(3, width)
    cand = high.clone()
    cand[1, width - 1] += 10.0
    assert kernel_says(cand, high) == torch_says(cand, high) == [True, False, True]


def test_outputs_with_strides_of_their_own_judged_alike():
    """A transposed output (what a candidate may return) is read in its logical order."""
    high = torch.randn(4, 40, 30)
    cand = high.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    cand[2, 7, 3] += 5.0
    assert kernel_says(cand, high) == torch_says(cand, high) == [True, True, False, True]


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_other_outputs_stay_with_the_pytorch_ops(dtype):
    x = torch.zeros(2, 8, dtype=dtype)
    assert not compare_kernel.applies(x, x.float(), None, interpret=True)
    assert not compare_kernel.applies(torch.zeros(2, 8), torch.zeros(2, 8), None), "no GPU here: PyTorch"


@pytest.mark.parametrize("cand_dtype, high_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float64)])
@pytest.mark.parametrize("amount", [1e-4, 3e-2, 1.0], ids=["passes", "some_fail", "all_fail"])
def test_a_calls_figures_are_compares(cand_dtype, high_dtype, amount):
    """The count of failing elements and the largest errors the kernel reports for one output
    are those ``compare`` reports (what an accepted verdict records)."""
    gen = torch.Generator().manual_seed(7)
    high = torch.randn(37, 129, generator=gen, dtype=torch.float64).to(high_dtype)
    cand = (high.double() + amount * torch.randn(37, 129, generator=gen, dtype=torch.float64)).to(cand_dtype)
    low = high.to(cand_dtype)
    want = compare.compare(cand, high, TOL, low)
    work = compare._work_dtype(cand, high)
    h = high.to(torch.float64)
    scale = h.pow(2).mean().sqrt().to(work).reshape(1, 1)
    bad, _, max_abs, max_rel = compare_kernel.errors(cand.reshape(1, -1), high.reshape(1, -1), scale, TOL.rtol, TOL.atol,
                                                     low.reshape(1, -1), work == torch.float64, compare.MARGINAL_FACTOR)
    assert int(bad[0]) == want.bad
    assert float(max_abs[0]) == pytest.approx(want.max_abs_err, rel=1e-6)
    assert float(max_rel[0]) == pytest.approx(want.max_rel_err, rel=1e-6)


def test_the_kernel_judges_only_after_agreeing_with_pytorch_on_its_device(monkeypatch):
    """Its self-check passes where the kernel is right; a kernel built wrong on some device (here:
    one that passes everything) is never used there, and the reason is kept."""
    monkeypatch.setattr(compare_kernel, "_CHECKED", {})
    monkeypatch.setattr(compare_kernel, "NOT_USED", {})
    cpu = torch.device("cpu")
    assert compare_kernel._self_checked(torch.bfloat16, torch.float32, torch.bfloat16, cpu)
    monkeypatch.setattr(compare_kernel, "passing_calls", lambda c, *a: torch.ones(c.shape[0], dtype=torch.bool))
    assert not compare_kernel._self_checked(torch.float32, torch.float64, None, cpu)
    assert "disagreed" in compare_kernel.NOT_USED[(torch.float32, torch.float64, None, "cpu")]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_fp8_byte_is_read_as_pytorch_reads_it(dtype):
    """The kernel decodes 8-bit floats from their bytes: each of the 256 values, one call each,
    against its own float32 value (passes: NaN with NaN, Inf with Inf) and against a value moved
    off it (fails, but where both are NaN); the PyTorch rule says the same of every call."""
    cand = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(256, 1)
    exact = cand.float()
    assert kernel_says(cand, exact) == torch_says(cand, exact) == [True] * 256
    moved = exact * 1.5 + 1.0
    assert kernel_says(cand, moved) == torch_says(cand, moved)
    assert sum(kernel_says(cand, moved)) == int((exact.isnan() | (moved == exact)).sum())  # NaN, and -2 (a fixed point)


def test_a_vanishing_number_of_marginal_elements_judged_alike(monkeypatch):
    """At most one element per MARGINAL_PER out, each within MARGINAL_FACTOR times its allowance:
    the kernel and the PyTorch ops count them alike (one per 1000 elements here, so that the
    interpreter's calls stay small)."""
    monkeypatch.setattr(compare, "MARGINAL_PER", 1000)
    width = 2000  # two may be out
    high = torch.randn(5, width, dtype=torch.float64).abs() + 1.0
    cand = high.clone()
    tol = Tolerance(rtol=1e-3, atol=0.0)
    cand[1, 10] *= 1.002  # 2x its allowance: marginal
    cand[2, [10, 900]] *= 1.003  # two at 3x: as many as may be
    cand[3, [10, 900, 1500]] *= 1.002  # three: one too many
    cand[4, 10] *= 1.005  # one at 5x: beyond the factor
    assert kernel_says(cand, high, tol) == torch_says(cand, high, tol) == [True, True, True, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_rms_scales_squares_are_the_float64_sum_of_the_finite_elements(dtype):
    """The per-call sum of squares behind each call's rms scale, in one read of the reference:
    non-finite elements count as zero, every block (the last partial one too) is summed, and a
    reference with strides of its own is read in its logical order."""
    gen = torch.Generator().manual_seed(3)
    width = compare_kernel.BLOCK + 77
    high = (3 * torch.randn(4, width, generator=gen, dtype=torch.float64)).to(dtype)
    if dtype.itemsize > 1:
        high[1, 5], high[2, width - 1], high[3, 0] = float("nan"), float("inf"), float("-inf")
    wide = high.to(torch.float64)
    want = torch.where(torch.isfinite(wide), wide, torch.zeros_like(wide)).pow(2).sum(dim=1)
    got = compare_kernel.square_sums(high)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    strided = high.reshape(4, 1, width).transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.allclose(compare_kernel.square_sums(strided), want, rtol=1e-12, atol=0)



#: run without the interpreter (the suite's conftest turns it on): compiles the kernels for each
#: dtype triple (argv[1], JSON: candidate, reference, low reference or null) for sm_90, to the binary
HOPPER_BUILD = """
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernforge.verifier import compare, compare_kernel

pointer = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64",
           torch.float8_e4m3fn: "*u8", torch.float8_e5m2: "*u8"}
hopper = GPUTarget("cuda", 90, 32)


def build(cand, high, low):
    bits = {"C_FP8": compare_kernel.EXP_BITS.get(cand, 0), "H_FP8": compare_kernel.EXP_BITS.get(high, 0),
            "LO_FP8": compare_kernel.EXP_BITS.get(low or cand, 0)}
    squares = {"h_ptr": pointer[high], "out_ptr": "*fp64", "width": "i32", "h_row": "i32", "blocks": "i32",
               "H_FP8": "constexpr", "BLOCK": "constexpr"}
    built = [triton.compile(ASTSource(compare_kernel._square_blocks, squares,
                                      constexprs={"H_FP8": bits["H_FP8"], "BLOCK": compare_kernel.BLOCK}), target=hopper)]
    wide = compare._work_dtype(torch.empty(0, dtype=cand), torch.empty(0, dtype=high)) == torch.float64
    work = "*fp64" if wide else "*fp32"
    constants = {"HAS_LO": low is not None, "WIDE": wide, **bits, "BLOCK": compare_kernel.BLOCK}
    signature = {"c_ptr": pointer[cand], "h_ptr": pointer[high], "lo_ptr": pointer[low or cand], "scale_ptr": work,
                 "bad_ptr": "*i32", "gross_ptr": "*i32", "abs_ptr": work, "rel_ptr": work,
                 **{name: "i32" for name in ("width", "c_row", "h_row", "lo_row", "blocks")},
                 **{name: "fp32" for name in ("rtol", "atol", "tiny", "margin")}, **{name: "constexpr" for name in constants}}
    built.append(triton.compile(ASTSource(compare_kernel._bad_blocks, signature, constexprs=constants), target=hopper))
    return [len(b.asm["cubin"]) for b in built]


sizes = []
for names in json.loads(sys.argv[1]):
    cand, high, low = (getattr(torch, n) if n else None for n in names)
    sizes += build(cand, high, low)
print(json.dumps(sizes))
"""


def test_the_kernels_compile_for_a_hopper_gpu_not_only_in_the_interpreter():
    """Compiled here for an H100/H200 (sm_90) all the way to its binary, with no GPU: Triton's
    code generator refuses what its interpreter runs (returns of two types behind a constexpr
    did: on the H200 every dtype's self-check then failed to build, and every timed batch was
    compared with the PyTorch ops, several times slower, with no test failing)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    triples = [("bfloat16", "float32", "bfloat16"), ("float32", "float64", "float32"),
               ("float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float32", None)]
    done = subprocess.run([sys.executable, "-c", HOPPER_BUILD, json.dumps(triples)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(sizes) == 2 * len(triples) and all(size > 0 for size in sizes)
