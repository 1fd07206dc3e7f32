"""Element-by-element comparison of a candidate's output with the reference.

Every element is compared (THREATS #3). An element passes when

    |c - h| <= rtol*|h| + atol*rms(h) + 2*|l - h|

with ``h`` the high-precision reference (float32 or better, computed from the same inputs),
``l`` the reference computed in the task's dtype (what PyTorch eager returns: its own rounding
error, so an honest kernel may be twice as far off as eager itself), and ``rms(h)`` the
root-mean-square of the reference, which makes ``atol`` relative to the output's scale: a
softmax over 150k entries (values near 1e-5) cannot pass as zeros. NaN and Inf pass only where
the reference has the same value at the same place.

An output of millions of elements may have a vanishing number just out: at most one per
``MARGINAL_PER`` elements (so none below that many), each within ``MARGINAL_FACTOR`` times its
allowance. The bound holds an element's error where rounding puts it; across millions of
independent roundings its extreme sits a little further out. On the H200 an honest float32 GEMM
with K = 32768 had one element of 3,178,496 just beyond it and was rejected. What this lets pass
is worth nothing to a cheat: work skipped or approximated shows at far more elements or by far
more (THREATS #3, #15), and a non-finite mismatch is never marginal.

The report names the worst element's index, the values and the errors; the same text is shown
to people and quoted back to the model.

Arithmetic is float64, except for outputs of 16 bits or fewer against a float32 reference,
where float32 is exact enough (their tolerances are a thousand times its rounding) and four times
cheaper: timed batches compare every output of every call. ``within_tolerance`` compares many
calls' outputs at once, stacked, and says only which calls fail (on a GPU in one pass over memory:
compare_kernel.py); ``compare`` then explains one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernforge.tasks.spec import Tolerance

from . import compare_kernel


#: at most one element per this many may be out of tolerance, each only marginally (above)
MARGINAL_PER = 1_000_000
#: ...within this many times its allowance
MARGINAL_FACTOR = 4.0


def marginal_allowed(numel: int) -> int:
    """How many of ``numel`` elements may be marginally out of tolerance."""
    return numel // MARGINAL_PER


def passes(bad: int, gross: int, numel: int) -> bool:
    """The rule over one output's counts: ``bad`` elements out of tolerance, ``gross`` of them
    beyond ``MARGINAL_FACTOR`` times their allowance or non-finite mismatches."""
    return gross == 0 and bad <= marginal_allowed(numel)


@dataclass(frozen=True)
class Mismatch:
    """Where and by how much one output differs; ``ok`` when every element passes."""

    ok: bool
    numel: int
    bad: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    #: index of the worst element (by error over allowance), as a tuple of ints
    worst_index: tuple[int, ...] = ()
    worst_value: float | None = None
    worst_expected: float | None = None
    nonfinite_mismatch: int = 0
    #: the candidate's output is one value everywhere while the reference varies (THREATS #2)
    constant: bool = False
    #: the worst element's error over what it is allowed (inf for a non-finite mismatch): just
    #: above 1 is a numerical difference, orders of magnitude above it a wrong computation
    worst_excess: float = 0.0
    #: elements out of tolerance that still pass: few enough, each marginally (module docstring)
    marginal: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["worst_index"] = list(self.worst_index)
        return d

    def describe(self) -> str:
        if self.ok and self.marginal:
            return (f"all but {self.marginal} of {self.numel} elements within tolerance, those within "
                    f"{self.worst_excess:.2f}x their allowance (at most one per {MARGINAL_PER:,} may be, within "
                    f"{MARGINAL_FACTOR:g}x; max abs err {self.max_abs_err:.3g})")
        if self.ok:
            return f"all {self.numel} elements within tolerance (max abs err {self.max_abs_err:.3g})"
        parts = [f"{self.bad} of {self.numel} elements out of tolerance"]
        if self.worst_index:
            parts.append(
                f"worst at index {list(self.worst_index)}: got {self.worst_value:.6g}, "
                f"expected {self.worst_expected:.6g}"
            )
        parts.append(f"max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}")
        if self.nonfinite_mismatch:
            parts.append(f"{self.nonfinite_mismatch} NaN/Inf where the reference has none (or differs)")
        if self.constant:
            parts.append("the output is one constant value while the reference varies")
        return "; ".join(parts)


#: elements compared at once: the float64 temporaries of a multi-GB output (KernelBench's
#: default sizes) would otherwise need several times its size in device memory
CHUNK_ELEMENTS = 1 << 25


def compare(
    candidate: torch.Tensor,
    high: torch.Tensor,
    tolerance: Tolerance,
    low: torch.Tensor | None = None,
) -> Mismatch:
    """Compare ``candidate`` with the reference ``high`` (same shape), in float64, a block of
    leading rows at a time (the rms scale first, over everything)."""
    if candidate.shape != high.shape:
        raise ValueError(f"shape {tuple(candidate.shape)} != reference shape {tuple(high.shape)}")
    numel = high.numel()
    if numel == 0:
        return Mismatch(ok=True, numel=0)
    work = _work_dtype(candidate, high)
    device = candidate.device
    blocks = _blocks(high)

    def part(t: torch.Tensor, sl: slice) -> torch.Tensor:
        return _rows(t, sl).to(device=device, dtype=work)

    fused = compare_kernel.applies(candidate, high, low)
    if fused:  # the scale's float64 squares in one read of the reference
        squares = compare_kernel.square_sums(high.reshape(1, -1))[0]
    else:
        squares = torch.zeros((), dtype=torch.float64, device=device)
        for sl in blocks:
            h = part(high, sl)
            squares += torch.where(torch.isfinite(h), h, torch.zeros_like(h)).double().pow(2).sum()
    scale = float((squares / numel).sqrt())
    scale_t = torch.tensor(scale, dtype=work, device=device)
    if fused:  # on a GPU the figures of a pass come in one pass;
        bad_n, _, abs_n, rel_n = compare_kernel.errors(  # anything out is explained below, at leisure
            candidate.reshape(1, -1), high.reshape(1, -1), scale_t.reshape(1, 1), tolerance.rtol, tolerance.atol,
            low.reshape(1, -1) if low is not None else None, work == torch.float64, MARGINAL_FACTOR)
        if int(bad_n[0]) == 0:
            return Mismatch(ok=True, numel=numel, max_abs_err=float(abs_n[0]), max_rel_err=float(rel_n[0]))
    bad = nonfinite = gross = 0
    max_abs = max_rel = 0.0
    worst: tuple[float, int] = (-1.0, 0)
    row = max(1, numel // max(high.shape[0], 1)) if high.dim() else 1
    for sl in blocks:
        c, h = part(candidate, sl), part(high, sl)
        lo = part(low, sl) if low is not None else None
        err, allowed, nonfinite_bad, hf, both = errors(c, h, lo, tolerance, scale_t)
        finite_bad = both & (err > allowed)
        bad_mask = finite_bad | nonfinite_bad
        bad += int(bad_mask.sum())
        nonfinite += int(nonfinite_bad.sum())
        gross += int((both & (err > MARGINAL_FACTOR * allowed)).sum())
        max_abs = max(max_abs, float(err.max()))
        max_rel = max(max_rel, float((err / hf.abs().clamp_min(max(scale, 1e-30))).max()))
        if bool(bad_mask.any()):  # the worst element: non-finite mismatches first, else error over allowance
            ratio = torch.where(finite_bad, err / allowed, torch.zeros_like(err))
            ratio = torch.where(nonfinite_bad, torch.full_like(ratio, float("inf")), ratio).reshape(-1)
            at = int(torch.argmax(ratio))
            if float(ratio[at]) > worst[0]:
                worst = (float(ratio[at]), (sl.start or 0) * row + at)
    if not bad:
        return Mismatch(ok=True, numel=numel, max_abs_err=max_abs, max_rel_err=max_rel)
    flat = worst[1]
    index = tuple(int(i) for i in _unravel(flat, tuple(high.shape)))
    ok = passes(bad, gross + nonfinite, numel)
    return Mismatch(
        ok=ok,
        numel=numel,
        bad=0 if ok else bad,
        marginal=bad if ok else 0,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        worst_index=index,
        worst_value=float(candidate.detach()[index] if index else candidate.detach()),
        worst_expected=float(high.detach()[index] if index else high.detach()),
        nonfinite_mismatch=nonfinite,
        constant=not ok and numel > 1 and _constant(candidate, high, blocks, part),
        worst_excess=min(worst[0], 1e30),  # a non-finite mismatch: finite in JSON
    )


def _constant(candidate: torch.Tensor, high: torch.Tensor, blocks: list[slice], part: Any) -> bool:
    """A failing output that is one finite value everywhere while the reference varies (THREATS
    #2): read again only for outputs that failed."""
    first_c, first_h = part(_first(candidate), slice(None)), part(_first(high), slice(None))
    first_h = torch.where(torch.isfinite(first_h), first_h, torch.zeros_like(first_h))
    h_varies = False
    for sl in blocks:
        c, h = part(candidate, sl), part(high, sl)
        if not bool(torch.isfinite(c).all()) or not bool((c == first_c).all()):
            return False
        h_varies = h_varies or bool((torch.where(torch.isfinite(h), h, torch.zeros_like(h)) != first_h).any())
    return h_varies


def magnitude(high: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """The largest finite |value| of ``high`` and the rms of its finite values (non-finite ones
    counted as zero), a block of rows at a time on ``device``."""
    numel = high.numel()
    if numel == 0 or not high.is_floating_point():
        return 0.0, 0.0
    largest, squares = 0.0, torch.zeros((), dtype=torch.float64, device=device)
    for sl in _blocks(high):
        h = _rows(high, sl).to(device=device, dtype=torch.float64)
        h = torch.where(torch.isfinite(h), h, torch.zeros_like(h))
        largest = max(largest, float(h.abs().max()))
        squares += h.pow(2).sum()
    return largest, float((squares / numel).sqrt())


def max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| (same shape), in float64 a block of rows at a time; inf where a NaN
    (or an infinity against another value) makes the difference undefined."""
    if a.numel() == 0 or not a.is_floating_point():
        return float("inf")
    worst = 0.0
    for sl in _blocks(a):
        x = _rows(a, sl).double()
        y = _rows(b, sl).to(device=x.device, dtype=torch.float64)
        d = float((x - y).abs().max())
        if d != d:
            return float("inf")
        worst = max(worst, d)
    return worst


def untouched_counts(candidate: torch.Tensor, high: torch.Tensor) -> tuple[int, int]:
    """(elements whose every byte is 0xFF, the poison of memory never written; floating zeros
    where the reference is not zero), a block of rows at a time."""
    never = zeros = 0
    if candidate.numel() == 0:
        return 0, 0
    for sl in _blocks(candidate):
        c = candidate.detach()[sl] if candidate.dim() else candidate.detach().reshape(1)
        raw = c.contiguous().view(torch.uint8).reshape(c.numel(), -1)
        never += int((raw == 0xFF).all(dim=1).sum())
        if c.is_floating_point():
            h = (high.detach()[sl] if high.dim() else high.detach().reshape(1)).to(c.device)
            zeros += int(((c == 0) & (h != 0)).sum())
    return never, zeros


def leading(t: torch.Tensor) -> torch.Tensor:
    """The first block of rows of ``t`` (about CHUNK_ELEMENTS elements): a sample for statistics
    that need no more, without a copy of a multi-GB tensor."""
    return _rows(t, _blocks(t)[0])


def _rows(t: torch.Tensor, sl: slice) -> torch.Tensor:
    """Rows ``sl`` of ``t`` (a view; a scalar is its own only block)."""
    return t.detach()[sl] if t.dim() else t.detach()


def _blocks(t: torch.Tensor) -> list[slice]:
    """Slices of the leading dimension of about CHUNK_ELEMENTS each (one slice for a scalar)."""
    if t.dim() == 0 or t.shape[0] == 0:
        return [slice(None)]
    rows = max(1, CHUNK_ELEMENTS // max(t.numel() // t.shape[0], 1))
    return [slice(i, i + rows) for i in range(0, t.shape[0], rows)]


def _first(t: torch.Tensor) -> torch.Tensor:
    """The first element (row-major), without copying the tensor."""
    return t.detach()[(0,) * t.dim()] if t.dim() else t.detach()


def _work_dtype(candidate: torch.Tensor, high: torch.Tensor) -> torch.dtype:
    narrow = candidate.is_floating_point() and candidate.element_size() <= 2 and high.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return torch.float32 if narrow else torch.float64


def within_tolerance(candidates: torch.Tensor, highs: torch.Tensor, tolerance: Tolerance, lows: torch.Tensor | None = None,
                     *, fused: bool | None = None) -> torch.Tensor:
    """Per call (the first dimension), whether it passes: the rule of ``compare`` (each call's
    own rms scale, its marginal elements), for many calls at once, a block of columns at a time.
    A bool tensor on the device. ``fused``: compare_kernel.py's one pass (True) or the PyTorch ops
    (False); None: the kernel wherever it applies."""
    work = _work_dtype(candidates, highs)
    n = candidates.shape[0]
    c_all, h_all = candidates.detach().reshape(n, -1), highs.detach().reshape(n, -1)
    lo_all = lows.detach().reshape(n, -1) if lows is not None else None
    width = c_all.shape[1]
    step = max(1, CHUNK_ELEMENTS // max(n, 1))
    blocks = [slice(i, i + step) for i in range(0, width, step)] or [slice(None)]
    device = c_all.device

    def part(t: torch.Tensor, sl: slice) -> torch.Tensor:
        return t[:, sl].to(device=device, dtype=work)

    fused = compare_kernel.applies(candidates, highs, lows) if fused is None else fused  # the same rule in one pass
    # the sum of squares in float64 whatever the work dtype: in float32 a reference of 1e20 would
    # overflow it to inf, and an infinite scale would let every finite output pass
    if fused:
        squares = compare_kernel.square_sums(highs).reshape(n, 1)
    else:
        squares = torch.zeros((n, 1), dtype=torch.float64, device=device)
        for sl in blocks:
            # float64 first: nan_to_num has no float8 kernel, and a float8 reference is a real case
            h = torch.nan_to_num(h_all[:, sl].to(device=device, dtype=torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
            squares += torch.linalg.vector_norm(h, dim=1, keepdim=True, dtype=torch.float64).pow(2)
    scale = (squares / max(width, 1)).sqrt().to(work)
    if fused:
        return compare_kernel.passing_calls(candidates, highs, scale, tolerance.rtol, tolerance.atol, lows,
                                            work == torch.float64, MARGINAL_FACTOR, marginal_allowed(width))
    bad = torch.zeros(n, dtype=torch.int64, device=device)
    gross = torch.zeros(n, dtype=torch.bool, device=device)
    for sl in blocks:
        lo = part(lo_all, sl) if lo_all is not None else None
        err, allowed, nonfinite_bad, _, both = errors(part(c_all, sl), part(h_all, sl), lo, tolerance, scale)
        bad += ((both & (err > allowed)) | nonfinite_bad).sum(dim=1)
        gross |= ((both & (err > MARGINAL_FACTOR * allowed)) | nonfinite_bad).any(dim=1)
    return ~gross & (bad <= marginal_allowed(width))


def errors(c: torch.Tensor, h: torch.Tensor, lo: torch.Tensor | None, tolerance: Tolerance,
            scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rule of the module docstring: (|c - h|, what each element is allowed, non-finite
    mismatches, h with non-finite values zeroed, where both are finite). ``scale``: the rms of
    the whole reference, or one per row (one call per row), broadcast against ``h``."""
    c_finite, h_finite = torch.isfinite(c), torch.isfinite(h)
    # Non-finite values must agree exactly: NaN with NaN, +Inf with +Inf.
    same_nonfinite = (~c_finite & ~h_finite) & ((torch.isnan(c) & torch.isnan(h)) | (c == h))
    nonfinite_bad = (~c_finite | ~h_finite) & ~same_nonfinite
    both = c_finite & h_finite
    hf = torch.where(h_finite, h, torch.zeros_like(h))
    allowed = tolerance.rtol * hf.abs() + tolerance.atol * scale
    if lo is not None:
        allowed = allowed + 2 * torch.where(torch.isfinite(lo) & h_finite, (lo - hf).abs(), torch.zeros_like(hf))
    # Never allow less than the smallest normal float32 step: exact zeros must not demand exactness.
    allowed = allowed.clamp_min(torch.finfo(torch.float32).tiny)
    err = torch.where(both, (c - hf).abs(), torch.zeros_like(hf))
    return err, allowed, nonfinite_bad, hf, both


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size if size else 0)
        flat //= size if size else 1
    return list(reversed(index))
