"""The timed batches' pass/fail comparison in one pass over memory (a Triton kernel).

``compare.within_tolerance`` asks, for many calls' outputs at once, whether every element of each
passes the rule of ``compare`` (its module docstring). Written as PyTorch ops, that rule is some
twenty element-wise kernels, each reading and writing whole arrays: on the H200 it was half of a
seed's verdict (2.3 s of 4.7 s for rms_norm at T=16384 H=8192, every output of 225 timed calls).
Here the same rule reads the candidate's output, the reference and the low-precision reference
once each and writes one flag per block: the rms scale per call stays a PyTorch reduction.

The rule is the same expression, element for element: ``tests/test_verifier_compare_kernel.py``
holds the kernel against ``compare._errors`` on random values, on values at the edge of the
tolerance and on every non-finite combination. Where the kernel does not apply (no GPU, an
output that is not an 8-, 16-, 32- or 64-bit float, no Triton) the PyTorch ops do the work.
"""

from __future__ import annotations

import torch

try:  # the reference worker runs without Triton on a machine that has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with every CUDA build of torch
    triton = None

#: elements per program: a block of one call's outputs
BLOCK = 2048
#: 8-bit floats: an fp8 task's outputs, and its reference at that precision (read through float32)
EXP_BITS = {torch.float8_e4m3fn: 4, torch.float8_e5m2: 5}
FP8 = tuple(EXP_BITS)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64, *FP8)

if triton is not None:

    @triton.jit
    def _fp8(byte, EXP_BITS: tl.constexpr):
        """The float32 value of an 8-bit float's byte: e4m3fn (``EXP_BITS`` 4: bias 7, no
        infinity, S.1111.111 is NaN) or e5m2 (5: bias 15, IEEE-like infinities and NaNs)."""
        b = byte.to(tl.int32) & 0xFF
        man_bits: tl.constexpr = 7 - EXP_BITS
        bias: tl.constexpr = (1 << (EXP_BITS - 1)) - 1
        top: tl.constexpr = (1 << EXP_BITS) - 1
        e = (b >> man_bits) & top
        m = (b & ((1 << man_bits) - 1)).to(tl.float32) / (1 << man_bits)
        normal = tl.where(e == 0, m, 1.0 + m)
        value = normal * tl.math.exp2((tl.maximum(e, 1) - bias).to(tl.float32))
        if EXP_BITS == 4:
            value = tl.where((e == top) & ((b & 7) == 7), float("nan"), value)
        else:
            value = tl.where(e == top, tl.where((b & 3) == 0, float("inf"), float("nan")), value)
        return tl.where((b & 0x80) != 0, -value, value)

    @triton.jit
    def _value(ptr, at, inside, EXP_BITS: tl.constexpr, WIDE: tl.constexpr):
        """Elements ``at`` in the work dtype (float64 if ``WIDE``, else float32); an 8-bit float
        (``EXP_BITS`` 4 or 5) comes as its bytes and is decoded by ``_fp8``."""
        x = tl.load(ptr + at, mask=inside, other=0)
        if EXP_BITS != 0:
            x = _fp8(x, EXP_BITS)
        # one return, its branch chosen at compile time: Triton's code generator (not its
        # interpreter) refuses a function whose returns differ in type, even behind a constexpr
        if WIDE:
            x = x.to(tl.float64)
        else:
            x = x.to(tl.float32)
        return x

    # sizes and strides are not specialised on (Triton would compile again for every width or
    # row stride that is, or is not, a multiple of 16: on the H200 a task's first verdict spent
    # 16 s compiling this kernel), only the dtypes are: a handful of compiles per process, kept
    # in the reference workers' trusted cache (WorkerSpec.trusted_cache)
    @triton.jit(do_not_specialize=["width", "c_row", "h_row", "lo_row", "blocks"])
    def _bad_blocks(c_ptr, h_ptr, lo_ptr, scale_ptr, bad_ptr, gross_ptr, abs_ptr, rel_ptr, width, c_row, h_row, lo_row,
                    blocks, rtol, atol, tiny, margin, HAS_LO: tl.constexpr, WIDE: tl.constexpr, C_FP8: tl.constexpr,
                    H_FP8: tl.constexpr, LO_FP8: tl.constexpr, BLOCK: tl.constexpr):
        """Per block of call ``row``: how many elements fail the rule, how many fail it grossly
        (beyond ``margin`` times their allowance, or a non-finite mismatch), the largest |c - h|
        and the largest |c - h| / max(|h|, rms) among the finite pairs (``compare``'s figures)."""
        block = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
        cols = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        # the arithmetic of compare._work_dtype: float32 for 16-bit outputs, else float64
        c = _value(c_ptr, row * c_row + cols, inside, C_FP8, WIDE)
        h = _value(h_ptr, row * h_row + cols, inside, H_FP8, WIDE)
        scale = tl.load(scale_ptr + row).to(tl.float64 if WIDE else tl.float32)
        c_nan = c != c
        h_nan = h != h
        c_finite = (~c_nan) & (tl.abs(c) != float("inf"))
        h_finite = (~h_nan) & (tl.abs(h) != float("inf"))
        # non-finite values must agree exactly: NaN with NaN, +Inf with +Inf
        same_nonfinite = (~c_finite & ~h_finite) & ((c_nan & h_nan) | (c == h))
        nonfinite_bad = (~c_finite | ~h_finite) & ~same_nonfinite
        both = c_finite & h_finite
        hf = tl.where(h_finite, h, 0.0)
        allowed = rtol * tl.abs(hf) + atol * scale
        if HAS_LO:
            lo = _value(lo_ptr, row * lo_row + cols, inside, LO_FP8, WIDE)
            lo_finite = (lo == lo) & (tl.abs(lo) != float("inf"))
            allowed = allowed + 2 * tl.where(lo_finite & h_finite, tl.abs(lo - hf), 0.0)
        allowed = tl.maximum(allowed, tiny)
        err = tl.where(both, tl.abs(c - hf), 0.0)
        bad = ((both & (err > allowed)) | nonfinite_bad) & inside
        gross = ((both & (err > margin * allowed)) | nonfinite_bad) & inside
        rel = err / tl.maximum(tl.abs(hf), tl.maximum(scale, 1e-30))
        at = row * blocks + block
        tl.store(bad_ptr + at, tl.sum(bad.to(tl.int32), axis=0))
        tl.store(gross_ptr + at, tl.sum(gross.to(tl.int32), axis=0))
        tl.store(abs_ptr + at, tl.max(tl.where(inside, err, 0.0), axis=0))
        tl.store(rel_ptr + at, tl.max(tl.where(inside, rel, 0.0), axis=0))


if triton is not None:

    @triton.jit(do_not_specialize=["width", "h_row", "blocks"])
    def _square_blocks(h_ptr, out_ptr, width, h_row, blocks, H_FP8: tl.constexpr, BLOCK: tl.constexpr):
        """Per block of call ``row``: the sum of the squares of the reference's finite elements,
        in float64 (compare.py's rms scale, whose float64 temporaries cost several times this)."""
        block = tl.program_id(0)
        row = tl.program_id(1).to(tl.int64)
        cols = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        h = _value(h_ptr, row * h_row + cols, inside, H_FP8, True)
        finite = (h == h) & (tl.abs(h) != float("inf")) & inside
        h = tl.where(finite, h, 0.0)
        tl.store(out_ptr + row * blocks + block, tl.sum(h * h, axis=0))


def applies(candidates: torch.Tensor, highs: torch.Tensor, lows: torch.Tensor | None, *, interpret: bool = False) -> bool:
    """Whether the kernel can judge these: floats of 8, 16, 32 or 64 bits, on a GPU (or under the
    Triton interpreter, for the tests), every tensor on the same device, and the kernel for
    these dtypes passed its self-check on this device."""
    if triton is None or not (candidates.is_cuda or interpret):
        return False
    tensors = [candidates, highs] + ([lows] if lows is not None else [])
    if not all(t.dtype in FLOATS and t.device == candidates.device for t in tensors):
        return False
    return interpret or _self_checked(candidates.dtype, highs.dtype, lows.dtype if lows is not None else None,
                                      candidates.device)


#: (candidate, reference, low-precision reference dtypes, device) -> whether the kernel agreed with
#: the PyTorch ops there; a kernel that fails to build or disagrees is never used in that process
_CHECKED: dict[tuple, bool] = {}
#: why the kernel is not used for a key of _CHECKED (bench/compare_probe.py prints it)
NOT_USED: dict[tuple, str] = {}


def _self_checked(c_dtype: torch.dtype, h_dtype: torch.dtype, lo_dtype: torch.dtype | None, device: torch.device) -> bool:
    """Before the kernel judges anything on a device, it judges a case whose answer the PyTorch
    ops give (random calls off by growing amounts, every non-finite pair, a bad element in the
    last partial block) and must agree on every call: a compiler that builds it differently
    here than the tests' interpreter did costs speed, never a verdict."""
    key = (c_dtype, h_dtype, lo_dtype, str(device))
    if key not in _CHECKED:
        from kernforge.tasks.spec import Tolerance

        from .compare import within_tolerance

        gen = torch.Generator(device="cpu").manual_seed(0)
        width = BLOCK + 77
        values = (float("nan"), float("inf"), float("-inf"), 1.0)
        pairs = [(a, b) for a in values for b in values]
        n = len(pairs) + 8
        high = torch.randn(n, width, generator=gen, dtype=torch.float64)
        amounts = torch.cat([torch.zeros(len(pairs)), torch.tensor([0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 1.0])])
        cand = high + amounts.double().reshape(n, 1) * torch.randn(n, width, generator=gen, dtype=torch.float64)
        for k, (a, b) in enumerate(pairs):
            cand[k, width - 1], high[k, width - 1] = a, b
        cand[len(pairs), width - 1] += 50.0
        low = high + 1e-3 * torch.randn(n, width, generator=gen, dtype=torch.float64)
        tolerance = Tolerance(rtol=1e-2, atol=1e-2)
        c, h = cand.to(device=device, dtype=c_dtype), high.to(device=device, dtype=h_dtype)
        lo = low.to(device=device, dtype=lo_dtype) if lo_dtype is not None else None
        want = within_tolerance(c, h, tolerance, lo, fused=False).tolist()
        try:
            got = within_tolerance(c, h, tolerance, lo, fused=True).tolist()
        except Exception as err:  # noqa: BLE001 - any failure to build or run it: the PyTorch ops, and why
            NOT_USED[key] = f"{type(err).__name__}: {str(err)[:300]}"
            got = None
        _CHECKED[key] = got == want
        if got is not None and got != want:
            NOT_USED[key] = f"disagreed with the PyTorch ops on its self-check: {got} against {want}"
    return _CHECKED[key]


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """One row per call, unit stride along it; an 8-bit float as its bytes (``_fp8`` decodes it)."""
    t = t.detach().reshape(n, -1)
    t = t if t.stride(-1) == 1 else t.contiguous()
    return t.view(torch.uint8) if t.dtype in FP8 else t


def square_sums(highs: torch.Tensor) -> torch.Tensor:
    """Per call (the first dimension): the float64 sum of the squares of the reference's finite
    elements, in one read of it; shape (n,)."""
    n = highs.shape[0]
    bits = EXP_BITS.get(highs.dtype, 0)
    h = _rows(highs, n)
    width = h.shape[1]
    blocks = max(1, triton.cdiv(width, BLOCK))
    out = torch.zeros((n, blocks), dtype=torch.float64, device=h.device)
    _square_blocks[(blocks, n)](h, out, width, h.stride(0), blocks, H_FP8=bits, BLOCK=BLOCK)
    return out.sum(dim=1)


def errors(candidates: torch.Tensor, highs: torch.Tensor, scale: torch.Tensor, rtol: float, atol: float,
           lows: torch.Tensor | None, wide: bool, margin: float) -> tuple[torch.Tensor, ...]:
    """Per call (the first dimension, ``n``): how many elements fail, how many fail beyond
    ``margin`` times their allowance (non-finite mismatches among them), the largest absolute and
    relative errors (as ``compare`` measures them). ``scale``: each call's rms of the reference,
    shape (n, 1); ``wide``: float64 arithmetic, else float32. Tensors on the device."""
    n = candidates.shape[0]
    bits = [EXP_BITS.get(t.dtype, 0) for t in (candidates, highs, lows if lows is not None else candidates)]
    c, h = _rows(candidates, n), _rows(highs, n)
    lo = _rows(lows, n) if lows is not None else c
    width = c.shape[1]
    blocks = max(1, triton.cdiv(width, BLOCK))
    work = torch.float64 if wide else torch.float32
    bad = torch.zeros((n, blocks), dtype=torch.int32, device=c.device)
    gross = torch.zeros((n, blocks), dtype=torch.int32, device=c.device)
    abs_err = torch.zeros((n, blocks), dtype=work, device=c.device)
    rel_err = torch.zeros((n, blocks), dtype=work, device=c.device)
    scale = scale.detach().reshape(n).to(work).contiguous()
    _bad_blocks[(blocks, n)](c, h, lo, scale, bad, gross, abs_err, rel_err, width, c.stride(0), h.stride(0), lo.stride(0),
                             blocks, float(rtol), float(atol), float(torch.finfo(torch.float32).tiny), float(margin),
                             HAS_LO=lows is not None, WIDE=wide, C_FP8=bits[0], H_FP8=bits[1], LO_FP8=bits[2],
                             BLOCK=BLOCK)
    return bad.sum(dim=1, dtype=torch.int64), gross.sum(dim=1, dtype=torch.int64), abs_err.amax(dim=1), rel_err.amax(dim=1)


def passing_calls(candidates: torch.Tensor, highs: torch.Tensor, scale: torch.Tensor, rtol: float, atol: float,
                  lows: torch.Tensor | None, wide: bool, margin: float, marginal: int) -> torch.Tensor:
    """Per call, whether it passes: no element beyond ``margin`` times its allowance and at most
    ``marginal`` out of it (``errors``' arguments; compare.py's rule)."""
    bad, gross = errors(candidates, highs, scale, rtol, atol, lows, wide, margin)[:2]
    return (gross == 0) & (bad <= marginal)
