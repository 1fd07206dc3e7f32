"""Element-by-element comparison of a candidate's output with the reference.

Every element is compared (THREATS #3). An element passes when

    |c - h| <= rtol*|h| + atol*rms(h) + 2*|l - h|

with ``h`` the high-precision reference (float32 or better, computed from the same inputs),
``l`` the reference computed in the task's dtype (what PyTorch eager returns: its own rounding
error, so an honest kernel may be twice as far off as eager itself), and ``rms(h)`` the
root-mean-square of the reference, which makes ``atol`` relative to the output's scale: a
softmax over 150k entries (values near 1e-5) cannot pass as zeros. NaN and Inf pass only where
the reference has the same value at the same place.

The report names the worst element's index, the values and the errors; the same text is shown
to people and quoted back to the model.

Arithmetic is float64, except for outputs of 16 bits or fewer against a float32 reference,
where float32 is exact enough (their tolerances are a thousand times its rounding) and four times
cheaper: timed batches compare every output of every call. ``within_tolerance`` compares many
calls' outputs at once, stacked, and says only which calls fail; ``compare`` then explains one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernforge.tasks.spec import Tolerance


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

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["worst_index"] = list(self.worst_index)
        return d

    def describe(self) -> str:
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


def compare(
    candidate: torch.Tensor,
    high: torch.Tensor,
    tolerance: Tolerance,
    low: torch.Tensor | None = None,
) -> Mismatch:
    """Compare ``candidate`` with the reference ``high`` (same shape), in float64."""
    if candidate.shape != high.shape:
        raise ValueError(f"shape {tuple(candidate.shape)} != reference shape {tuple(high.shape)}")
    numel = high.numel()
    if numel == 0:
        return Mismatch(ok=True, numel=0)
    work = _work_dtype(candidate, high)
    c = candidate.detach().to(work)
    h = high.detach().to(device=c.device, dtype=work)

    lo = low.detach().to(device=c.device, dtype=work) if low is not None else None
    err, allowed, nonfinite_bad, hf, both = _errors(c, h, lo, tolerance, scale_dims=None)
    c_finite = torch.isfinite(c)
    scale = float(hf.pow(2).mean().sqrt())
    finite_bad = both & (err > allowed)
    bad_mask = finite_bad | nonfinite_bad
    bad = int(bad_mask.sum())

    max_abs = float(err.max()) if bool(both.any()) else 0.0
    rel = err / hf.abs().clamp_min(max(scale, 1e-30))
    max_rel = float(rel.max()) if bool(both.any()) else 0.0

    constant = False
    if bad and numel > 1 and c_finite.all():
        constant = bool((c == c.reshape(-1)[0]).all()) and bool((hf != hf.reshape(-1)[0]).any())

    if not bad:
        return Mismatch(ok=True, numel=numel, max_abs_err=max_abs, max_rel_err=max_rel)
    # Worst element: non-finite mismatches first, else the largest error over allowance.
    ratio = torch.where(finite_bad, err / allowed, torch.zeros_like(err))
    ratio = torch.where(nonfinite_bad, torch.full_like(ratio, float("inf")), ratio)
    flat = int(torch.argmax(ratio.reshape(-1)))
    index = tuple(int(i) for i in _unravel(flat, tuple(high.shape)))
    return Mismatch(
        ok=False,
        numel=numel,
        bad=bad,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        worst_index=index,
        worst_value=float(c.reshape(-1)[flat]),
        worst_expected=float(h.reshape(-1)[flat]),
        nonfinite_mismatch=int(nonfinite_bad.sum()),
        constant=constant,
    )


def _work_dtype(candidate: torch.Tensor, high: torch.Tensor) -> torch.dtype:
    narrow = candidate.is_floating_point() and candidate.element_size() <= 2 and high.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return torch.float32 if narrow else torch.float64


def within_tolerance(candidates: torch.Tensor, highs: torch.Tensor, tolerance: Tolerance, lows: torch.Tensor | None = None) -> torch.Tensor:
    """Per call (the first dimension), whether every element passes: the rule of ``compare``
    (each call's own rms scale), for many calls at once. A bool tensor on the device."""
    work = _work_dtype(candidates, highs)
    n = candidates.shape[0]
    c = candidates.detach().to(work).reshape(n, -1)
    h = highs.detach().to(device=c.device, dtype=work).reshape(n, -1)
    lo = lows.detach().to(device=c.device, dtype=work).reshape(n, -1) if lows is not None else None
    err, allowed, nonfinite_bad, _, both = _errors(c, h, lo, tolerance, scale_dims=1)
    return ~((both & (err > allowed)) | nonfinite_bad).any(dim=1)


def _errors(c: torch.Tensor, h: torch.Tensor, lo: torch.Tensor | None, tolerance: Tolerance,
            scale_dims: int | None) -> tuple[torch.Tensor, ...]:
    """The rule of the module docstring: (|c - h|, what each element is allowed, non-finite
    mismatches, h with non-finite values zeroed, where both are finite). The rms scale is taken
    over everything, or per row (``scale_dims=1``: one call per row)."""
    c_finite, h_finite = torch.isfinite(c), torch.isfinite(h)
    # Non-finite values must agree exactly: NaN with NaN, +Inf with +Inf.
    same_nonfinite = (~c_finite & ~h_finite) & ((torch.isnan(c) & torch.isnan(h)) | (c == h))
    nonfinite_bad = (~c_finite | ~h_finite) & ~same_nonfinite
    both = c_finite & h_finite
    hf = torch.where(h_finite, h, torch.zeros_like(h))
    squares = hf.pow(2)
    scale = (squares.mean() if scale_dims is None else squares.mean(dim=scale_dims, keepdim=True)).sqrt()
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
