"""Was a wrong output computed in lower precision? THREATS #15, named on evidence only.

Errors everywhere at about tf32's (2^-11) or bf16's (2^-8) unit roundoff look like lowered
precision (``suspect``), but honest float32 errors can be as large: a float32 sum of a million
positive terms, one after another, drifts by about 2^-12.3 relative (KernelBench level 1 problem
4, an IEEE-float32 Triton GEMM on the H200; 2^-12.7 for numpy's sequential sum), while tf32
operands would move that dot product by about 2^-11/sqrt(K). The size of the errors is only a
reason to look. ``diagnose`` names a
precision when the reference, run again in that precision on the same inputs, lands where the
candidate did:

* operands rounded to tf32 (10 mantissa bits) or bf16 (7), to nearest (cuBLAS, CUTLASS, a cast)
  or truncated (the low bits a tensor core ignores when not asked to round), then the reference
  run as for ``high``: what a kernel computes from lowered operands with a wide accumulator.
  Every floating tensor rounded, each one alone (a kernel may lower only its activations), the
  inputs only, the weights only;
* the whole model in bfloat16;
* on a GPU, the float32 model with TF32 allowed in cuBLAS and cuDNN (the process's flags back
  afterwards).

A match is a median error against the lowered run below MATCH_RATIO times the candidate's median
error against the exact reference, and against the exact reference scaled by the candidate's
typical relative error. Errors that have nothing to do with the lowered run's roundings add to
its own (in quadrature, element by element), so they leave the ratio at about 1 or above; a
kernel that really lowered precision reproduces the same roundings and differs from the lowered
run only by its accumulation order, a ratio far below 1 (1e-5 to 1e-3 in
tests/test_verifier_precision.py, 0 for the Triton interpreter's own casts). The scaled reference guards a
coincidence: a long float32 sum errs mostly by one relative bias, and a truncation's bias (about
2^-11 ln 2 per tf32 operand) can be the same size; a lowered run must explain the errors element
by element, which a common bias cannot (the median |e - t| is least at t = median e).

Costs: only for the first failing output of a verdict (which already ends it), only when the
errors look like a lower precision at all: up to 30 runs of the reference (stopping at the first
match), one at a time, each on fresh copies of the inputs and of the weights it rounds, widened
like ``high``'s, and a widened copy of the model made once. A call whose floating inputs and
weights pass MAX_BYTES, or that has not ROOM_FACTOR times them free on the GPU, is not run again
and no precision is named.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from kernforge.tasks.runtime import collect_outputs

from . import compare, reference

#: the look of lowered precision: a median relative error from tf32's 2^-14 floor up to 2^-4, far
#: beyond any rounding (a plain wrong answer, not a precision choice). The median, not the worst:
#: an output near zero (a dot product that cancels) has a large relative error at any precision
SUSPECT_MEDIAN = 2**-14
SUSPECT_MEDIAN_MAX = 2**-4
#: a lowered run explains the output when it is this much closer to it than the exact reference
MATCH_RATIO = 0.25
#: floating inputs and weights of a call beyond which the reference is not run again (memory:
#: each run holds a rounded, widened copy of them; KernelBench's matrix-vector input is 8 GiB)
MAX_BYTES = 2 << 30
#: elements of an output (its leading rows) the medians are taken over
SAMPLE = 1 << 22
#: device memory a lowered run may need, in multiples of the call's floating inputs and weights: a
#: widened (float64) copy of them all, a float32 copy and a rounding temporary of the largest
ROOM_FACTOR = 4
#: tensors rounded one at a time up to this many floating tensors; beyond, only in groups
MAX_SINGLES = 4
#: explicit mantissa bits of each lower precision, over float32's 23
MANTISSA = {"tf32": 10, "bf16": 7}


@dataclass(frozen=True)
class Lowering:
    """One lower-precision run of the reference: the precision, how, and what it rounds."""

    precision: str
    how: str  # "nearest", "truncated", "model" (the whole model in bf16), "cublas" (TF32 allowed)
    rounded: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.how == "model":
            return "the whole model in bfloat16"
        if self.how == "cublas":
            return "TF32 allowed in cuBLAS and cuDNN"
        what = ", ".join(self.rounded)
        return f"{what} rounded to {self.precision}, {'to nearest' if self.how == 'nearest' else 'truncated'}"


def suspect(cand: torch.Tensor, high: torch.Tensor) -> tuple[str, float] | None:
    """(the precision the errors are the size of, their median relative error), or None when
    they do not look like a lower precision: a median relative error of 2^-14 to 2^-4. Over the
    leading rows (a sample; no copy of a multi-GB output)."""
    if not cand.is_floating_point() or cand.dtype not in (torch.float32, torch.float64):
        return None  # float16 and bf16 outputs have tolerances at their own rounding already
    c, h = _sample(cand), _sample(high).to(cand.device)
    finite = torch.isfinite(c) & torch.isfinite(h)
    if finite.sum() < 16:
        return None
    rel = (c - h).abs()[finite] / _denominator(h, finite)[finite]
    median = float(rel.median())
    if not SUSPECT_MEDIAN <= median <= SUSPECT_MEDIAN_MAX:
        return None
    return ("bf16" if median >= 2**-11 else "tf32"), median


def diagnose(cand: torch.Tensor, high: torch.Tensor, output: int, model: Any, inputs: Sequence[Any],
             mutated: Sequence[int], *, wide: bool) -> dict[str, Any]:
    """Details for a failing output ``output`` of a call of ``inputs``: ``lowered_precision`` and
    ``lowered_evidence`` where a lower-precision run of ``model`` explains ``cand``, else a
    ``precision_note`` where its errors only look like one; empty where they do not. ``wide``:
    ``high`` came from the model one step wider (reference.run_reference), so the lowered runs do
    too. ``model`` and ``inputs`` are left as they were."""
    seen = suspect(cand, high)
    if seen is None:
        return {}
    guess, median = seen
    looks = f"errors everywhere at about 2^{math.log2(median):.1f} relative (median)"
    size = sum(t.numel() * t.element_size() for _, t in _floating(model, inputs))
    if size > MAX_BYTES:
        return {"precision_note": f"{looks}; the reference was not run again in lower precision ({size / 2**30:.1f} "
                                  f"GiB of inputs and weights, over {MAX_BYTES / 2**30:.0f} GiB), so none is named"}
    if _on_cuda(inputs) and torch.cuda.mem_get_info(cand.device)[0] < ROOM_FACTOR * size + reference.ROOM_RESERVE:
        return {"precision_note": f"{looks}; too little free device memory to run the reference again in lower "
                                  "precision, so none is named"}
    c, h = _sample(cand), _sample(high).to(cand.device)
    drift = _drift(c, h)
    exact, drifted = _median_error(c, h, h), _median_error(c, h * (1 + drift), h)
    bar = min(exact, drifted)
    best: tuple[float, float, Lowering] | None = None
    for lowering, run in _lowerings(model, inputs, mutated, wide, first=guess):
        try:
            outs = run()
        except (RuntimeError, TypeError):  # out of memory, or an op with no kernel for the dtype
            continue
        if output >= len(outs) or outs[output].shape != cand.shape:
            continue
        error = _median_error(c, _sample(outs[output]).to(c.device), h)
        del outs
        ratio = error / bar if bar > 0 else math.inf
        if best is None or ratio < best[0]:
            best = (ratio, error, lowering)
        if ratio < MATCH_RATIO:
            return {"lowered_precision": lowering.precision,
                    "lowered_evidence": {"lowering": lowering.describe(), "ratio": ratio, "median_rel_err": median}}
    if drifted <= MATCH_RATIO * exact:  # the errors are one bias, whatever a lowered run comes near
        return {"precision_note": f"{looks}, mostly one common relative bias of {drift:+.2g} (as a long float32 sum "
                                  "drifts), not explained by a lower-precision run of the reference"}
    closest = ""
    if best is not None:
        closest = f" (the closest, {best[2].describe()}, is {best[1] / exact:.2g}x as far from the output as the exact reference)"
    return {"precision_note": f"{looks}, not explained by a lower-precision run of the reference{closest}"}


# ---- the lower-precision runs -------------------------------------------------------------------
def _lowerings(model: Any, inputs: Sequence[Any], mutated: Sequence[int], wide: bool,
               first: str) -> Iterator[tuple[Lowering, Callable[[], list[torch.Tensor]]]]:
    """Every lowered run worth trying, the suspected precision first, each as a thunk (nothing
    is run or copied before it is asked for)."""
    named = _floating(model, inputs)
    groups = _groups([name for name, _ in named])
    runner = _Runner(model, inputs, mutated, wide, dict(named))
    for precision in sorted(MANTISSA, key=lambda p: p != first):
        if precision == "tf32" and _on_cuda(inputs):
            yield Lowering("tf32", "cublas"), runner.tf32_allowed
        for i, group in enumerate(groups):
            for how in ("nearest", "truncated"):
                yield Lowering(precision, how, group), _bind(runner.rounded, group, MANTISSA[precision], how == "nearest")
            if precision == "bf16" and i == 0:
                yield Lowering("bf16", "model"), runner.bf16_model


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _floating(model: Any, inputs: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
    """The float32 tensors a lowered kernel could round, by name: the inputs ("input 0") and the
    model's parameters and buffers (by their names in the model)."""
    named = [(f"input {i}", x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.dtype == torch.float32]
    if isinstance(model, torch.nn.Module):
        state = [*model.named_parameters(), *model.named_buffers()]
        named += [(name, t) for name, t in state if t.dtype == torch.float32]
    return named


def _groups(names: list[str]) -> list[tuple[str, ...]]:
    """What is rounded together: everything; each tensor alone (when there are few); the inputs
    only; the weights only. No group twice."""
    if not names:
        return []
    ins = tuple(n for n in names if n.startswith("input "))
    weights = tuple(n for n in names if not n.startswith("input "))
    candidates = [tuple(names)]
    if 1 < len(names) <= MAX_SINGLES:
        candidates += [(n,) for n in names]
    candidates += [ins, weights]
    groups: list[tuple[str, ...]] = []
    for g in candidates:
        if g and set(g) not in [set(k) for k in groups]:
            groups.append(g)
    return groups


@dataclass
class _Runner:
    """Runs the reference one lowered way at a time, on copies: the model's own parameters and
    the call's inputs are never written."""

    model: Any
    inputs: Sequence[Any]
    mutated: Sequence[int]
    wide: bool
    tensors: dict[str, torch.Tensor]
    _wide_model: Any = None

    def _work_model(self) -> Any:
        """The model lowered runs call: its one-step-wider copy where ``high`` came from one, else
        a plain copy (functional_call swaps weights in for the call, on this copy only)."""
        if self._wide_model is None:
            wider = reference.upcast_model(self.model) if self.wide else None
            if wider is None:
                self.wide = False
                wider = copy.deepcopy(self.model) if isinstance(self.model, torch.nn.Module) else self.model
            self._wide_model = wider
        return self._wide_model

    @torch.no_grad()
    def rounded(self, group: tuple[str, ...], bits: int, nearest: bool) -> list[torch.Tensor]:
        model = self._work_model()

        def lowered(x: Any, name: str) -> Any:
            """A fresh copy of ``x``, rounded when in ``group``, widened like ``high``'s inputs
            (one tensor at a time: a call's float32 copies are never all held at once)."""
            if not isinstance(x, torch.Tensor):
                return x
            x = x.clone()
            if name in group:
                round_mantissa_(x, bits, nearest)
            return reference.upcast(x) if self.wide else x

        ins = [lowered(x, f"input {i}") for i, x in enumerate(self.inputs)]
        weights = {n: lowered(t, n) for n, t in self.tensors.items() if n in group and not n.startswith("input ")}
        if weights:
            out = torch.func.functional_call(model, weights, tuple(ins))
        else:
            out = model(*ins)
        return collect_outputs(out, ins, self.mutated)

    @torch.no_grad()
    def bf16_model(self) -> list[torch.Tensor]:
        model = copy.deepcopy(self.model).to(torch.bfloat16) if isinstance(self.model, torch.nn.Module) else self.model
        ins = [x if not isinstance(x, torch.Tensor) else
               x.to(torch.bfloat16) if x.dtype in (torch.float32, torch.float64) else x.clone() for x in self.inputs]
        return collect_outputs(model(*ins), ins, self.mutated)

    @torch.no_grad()
    def tf32_allowed(self) -> list[torch.Tensor]:
        with tf32_allowed():
            return reference.run_low(self.model, self.inputs, self.mutated)


def round_mantissa_(x: torch.Tensor, bits: int, nearest: bool) -> torch.Tensor:
    """Keep a float32 ``x`` to ``bits`` explicit mantissa bits, in place, on its bit pattern: to
    nearest (ties to even) or truncated. Infinities stay infinite (the carry of a rounding stops
    at the exponent), the largest finite values may round up to them as they should, and NaNs
    stay NaN (a payload of all ones would carry into the sign: they are put back). Other dtypes
    are left alone."""
    if x.dtype != torch.float32:
        return x
    drop = 23 - bits
    i = x.view(torch.int32)
    if nearest:  # half an ulp less one, plus the kept last bit: a tie goes to the even neighbour
        nan = torch.isnan(x)
        odd = (i >> drop).bitwise_and_(1)
        i.add_(odd).add_((1 << (drop - 1)) - 1)
        del odd
    i.bitwise_and_(-(1 << drop))
    if nearest:
        x.masked_fill_(nan, float("nan"))
    return x


@contextlib.contextmanager
def tf32_allowed() -> Iterator[None]:
    """TF32 on in cuBLAS and cuDNN inside the block; the process's settings back after it, however
    it ends (the reference worker keeps TF32 off: reference.strict_precision)."""
    matmul, cudnn, precision = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                                torch.get_float32_matmul_precision())
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def _on_cuda(inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


# ---- statistics -----------------------------------------------------------------------------------
def _sample(t: torch.Tensor) -> torch.Tensor:
    """The leading rows of ``t``, flattened, at most SAMPLE elements, in float64."""
    return compare.leading(t).reshape(-1)[:SAMPLE].double()


def _denominator(h: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """|h| plus a thousandth of its rms: relative errors, without dividing by values near zero."""
    scale = h[finite].pow(2).mean().sqrt().clamp_min(1e-30)
    return h.abs() + 1e-3 * scale


def _median_error(c: torch.Tensor, ref: torch.Tensor, h: torch.Tensor) -> float:
    """The median over elements finite in all three of |c - ref|, relative to the exact ``h``."""
    finite = torch.isfinite(c) & torch.isfinite(ref) & torch.isfinite(h)
    if not bool(finite.any()):
        return math.inf
    return float(((c - ref).abs() / _denominator(h, finite))[finite].median())


def _drift(c: torch.Tensor, h: torch.Tensor) -> float:
    """The candidate's typical relative error (the median of (c - h) / h), over the elements not
    near zero: the one common bias a scaled reference can explain."""
    finite = torch.isfinite(c) & torch.isfinite(h)
    if not bool(finite.any()):
        return 0.0
    away = finite & (h.abs() > 1e-3 * h[finite].pow(2).mean().sqrt())
    return float(((c - h)[away] / h[away]).median()) if bool(away.any()) else 0.0
