"""The reference of many calls of a timed batch at once, under ``torch.func.vmap`` (trusted side only).

A timed batch whose calls are laid out evenly holds each input of every call as one
``[calls, *shape]`` view (refworker.py's ``_Batch.stacked``). The reference then runs over a part
of the calls at a time, batched by vmap: a launch per op for the whole part, where the calls run
one at a time made a launch per op per call (silu_and_mul at T=64, 512 calls: 7,900 ops per
window on the H200, and a captured graph of them is ruled out above a GiB of outputs). Its
outputs come stacked, as the comparison reads them, and are let go part by part.

vmap runs the reference's own code, but a batched kernel may add up in another order than one
call's (a reduction over more rows, a matmul run as a bmm). So a batch's stacked reference stands
in for the eager one only where, on three of its calls (the first, the last and one at random),
both its answers (high and low, reference.py) lie within ``CLOSE`` of the task's tolerance for
the output's dtype of the eager answers, or one rounding step of that dtype (``_close``), element
by element, with non-finite values exactly where eager has them; an output that is not floating
point must match bit for bit. Else, or where vmap cannot run the reference at all (a ``.item()``,
a host branch, an op without a batching rule that raises), the batch's calls are run as before
(reference_graph.py, or eagerly).

A verdict times each shape by a long batch and a short one, on the same weights: the first of
them verified makes that check, and the other takes its decision (``reuse``), its part sized for
its own calls; every call of both is still verified against the stacked reference.

Where the reference computes in float32 whatever its inputs (the built-in ones do, as vLLM's
native paths do), its low answer is its high one rounded to the output's dtype, bit for bit: the
same work done twice. A batch whose stacked run shows that on every call of the parts its check
ran (``low_dtypes``) then runs the high answer alone in a verification, and the low one is that
answer rounded (``run(exact=False)``). No candidate can pass by it that the low run would have
failed: the low answer is a value of the output's dtype, and the rounded high one is the nearest
such value to the high answer, so the allowance a low answer adds (twice its distance from the
high one, compare.py) is never larger with it. A call outside that tighter allowance is not yet
a failure: the verification then runs the low answer itself and that decides
(refworker._verify_batch), so it cannot reject an honest kernel either.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from kernforge.tasks.spec import Tolerance

from . import compare, integrity, reference, reference_compiled

#: how far the stacked reference may lie from the eager one: this share of the tolerance
CLOSE = 1 / 16
#: what one part of the calls may take at its peak, reckoned from one call's inputs, outputs and
#: wider copies (a part's scratch is vmap's, as large as that of its calls run at once): at least
#: this much...
PART_BYTES = 512 << 20
#: ...and on a GPU up to this share of its free memory, at most ``PART_MOST_BYTES`` (at the large
#: shapes a call of a few hundred MB made parts of one call, run call by call: on the H100 that was
#: most of a warm verdict's verification, its calls' references launched one by one)
PART_FREE_SHARE = 1 / 8
PART_MOST_BYTES = 4 << 30

Outputs = tuple[list[torch.Tensor], list[torch.Tensor]]


@dataclass
class StackedReference:
    """The reference of a batch's calls, ``part`` calls per run; ``values`` is one call's
    arguments with None where its tensors go (at ``positions``, in the order of the stacked
    inputs), the same for every call."""

    model: Any
    hi_model: Any  # None: the reference does not run one step wider, and high is low
    values: list[Any]
    positions: list[int]
    mutated: list[int]
    part: int
    #: each output's dtype where the low answer is the high one rounded to it (module docstring);
    #: None: the low answer is run
    low_dtypes: list[torch.dtype] | None = None
    #: those derived answers come from the compiled graph (reference_compiled.py), which agreed
    #: with the eager ones on this batch's checked calls
    compiled: bool = False
    #: what one call takes in a part at its peak (``call_bytes``), and the device: the part of
    #: another batch that ``reuse`` gives this decision is sized from them
    per_call: int = 0
    device: Any = None

    def run(self, stacked: Sequence[torch.Tensor], start: int, count: int, *, exact: bool = True) -> Outputs:
        """(highs, lows) of calls ``start`` to ``start + count``: each output as [count, *shape].
        Not ``exact``: the lows are the highs rounded where ``low_dtypes`` says they are."""
        derive = not exact and self.low_dtypes is not None
        if derive and self.compiled and count >= 2:
            return reference_compiled.run(self.model, self.hi_model, self.values, self.positions, self.mutated,
                                          self.low_dtypes or [], [s[start: start + count] for s in stacked])
        one = _one_call(self.model, self.hi_model, self.values, self.positions, self.mutated, high_only=derive)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # vmap's "performance drop" notes for ops it loops over
            got = torch.func.vmap(one, randomness="error")(*[s[start: start + count] for s in stacked])
        if derive:
            high = list(got)
            return high, [h.to(d) for h, d in zip(high, self.low_dtypes or [])]
        high, low = got
        return list(high), list(low)

    def parts(self, calls: int) -> list[tuple[int, int]]:
        return [(start, min(self.part, calls - start)) for start in range(0, calls, self.part)]


def prepare(model: Any, stacked: Sequence[torch.Tensor], calls: Sequence[Sequence[Any]], mutated: Sequence[int],
            tolerance_of: Callable[[torch.Tensor], Tolerance]) -> StackedReference | None:
    """The stacked reference of a batch, or None where it must run call by call. ``stacked``:
    each tensor input of every call as one [calls, *shape] tensor; ``calls``: each call's
    arguments (views of the same bytes, and its plain values); ``tolerance_of``: the task's
    tolerance for an output of that dtype."""
    n = len(calls)
    plain = _plain_values(stacked, calls)
    if plain is None:
        return None
    positions, values = plain
    try:
        hi_model, _, low = reference.decide_wider(model, calls[0], mutated)
    except RuntimeError:
        return None
    device = low[0].device if low else torch.device("cpu")
    per_call = max(call_bytes(model, calls[0], low, hi_model is not None), 1)
    part = min(n, part_bytes(device) // per_call)
    if part < 2:
        return None  # calls this large gain nothing run together
    found = StackedReference(model, hi_model, values, positions, list(mutated), part, per_call=per_call, device=device)
    checked = sorted({0, n - 1, random.randrange(n)})
    rounds = hi_model is not None  # the low answer is the high one rounded, on every call run here
    dtypes: list[torch.dtype] = []
    # the checked calls' eager answers, kept for the compiled reference's check where it is asked for
    # (a large call's answers are GBs: never kept otherwise)
    compiling = reference_compiled.enabled()
    eager: dict[int, Outputs] = {}
    for start, count in found.parts(n):
        wanted = [k for k in checked if start <= k < start + count]
        if not wanted:
            continue
        try:
            highs, lows = found.run(stacked, start, count)
        except Exception:  # noqa: BLE001 - any failure of the reference's code under vmap: call by call
            return None
        rounds = rounds and rounded(highs, lows)
        dtypes = [lo.dtype for lo in lows]
        for k in wanted:
            eager_high, eager_low = reference.run_reference(model, calls[k], mutated)
            if compiling:
                eager[k] = (eager_high, eager_low)
            got_high, got_low = [h[k - start] for h in highs], [lo[k - start] for lo in lows]
            # the tolerance the comparison applies: that of the output's own dtype (the low's)
            tolerances = [tolerance_of(lo) for lo in eager_low]
            if not (_close(got_high, eager_high, tolerances) and _close(got_low, eager_low, tolerances)):
                return None
        del highs, lows
    found.low_dtypes = dtypes if rounds else None
    if found.low_dtypes is not None and compiling:
        found.compiled = _compiled_agrees(found, stacked, n, eager, tolerance_of)
    return found


def reuse(decided: StackedReference, stacked: Sequence[torch.Tensor], calls: Sequence[Sequence[Any]]) -> StackedReference | None:
    """``decided`` (``prepare``'s on another batch of the same verdict, task, shape, inputs'
    distribution and weights: its long or short batch at that shape) for this batch, its part
    sized for this batch's calls; None where this batch's calls do not match it, or where the
    decision stands on the compiled graph (reference_compiled.py: checked at the other batch's
    number of calls only), and ``prepare`` decides afresh. The other batch's checked calls were
    drawn from the same distribution for the same code and weights, and the check was most of a
    window's verification: 0.32 s of a 3.95 s verdict on an H100 (session 61), against 0.07 s for
    the stacked runs themselves; one check a shape made it 0.20 s (session 62)."""
    if decided.compiled or _plain_values(stacked, calls) != (decided.positions, decided.values):
        return None
    part = min(len(calls), part_bytes(decided.device) // decided.per_call) if decided.device is not None else 0
    return replace(decided, part=part) if part >= 2 else None


def _plain_values(stacked: Sequence[torch.Tensor], calls: Sequence[Sequence[Any]]) -> tuple[list[int], list[Any]] | None:
    """Where the tensor arguments are, and every argument's plain value (None for a tensor): the
    same on every call, one tensor stacked per position; None where there are fewer than two
    calls or they differ (a batch that runs call by call)."""
    if len(calls) < 2:
        return None
    positions = [i for i, x in enumerate(calls[0]) if isinstance(x, torch.Tensor)]
    values = [None if isinstance(x, torch.Tensor) else x for x in calls[0]]
    if len(positions) != len(stacked) or any([None if isinstance(x, torch.Tensor) else x for x in c] != values for c in calls):
        return None
    return positions, values


def _compiled_agrees(found: StackedReference, stacked: Sequence[torch.Tensor], calls: int, eager: dict[int, Outputs],
                     tolerance_of: Callable[[torch.Tensor], Tolerance]) -> bool:
    """Whether the compiled reference (reference_compiled.py) may stand in for the eager one on
    this batch: it runs, and at each checked call its answers (high, and low derived) lie within
    ``_close`` of the eager ones (``eager``: those calls' answers; at least one compared)."""
    seen = 0
    for start, count in found.parts(calls):
        wanted = [k for k in eager if start <= k < start + count]
        if not wanted or count < 2:
            continue
        try:
            highs, lows = reference_compiled.run(found.model, found.hi_model, found.values, found.positions, found.mutated,
                                                 found.low_dtypes or [], [s[start: start + count] for s in stacked])
        except Exception:  # noqa: BLE001 - any failure to compile or run: the eager reference, as before
            return False
        for k in wanted:
            eager_high, eager_low = eager[k]
            tolerances = [tolerance_of(lo) for lo in eager_low]
            if not (_close([h[k - start] for h in highs], eager_high, tolerances)
                    and _close([lo[k - start] for lo in lows], eager_low, tolerances)):
                return False
            seen += 1
        del highs, lows
    return seen > 0


def rounded(highs: Sequence[torch.Tensor], lows: Sequence[torch.Tensor]) -> bool:
    """Whether each low answer is its high one rounded to the low's dtype, bit for bit (the same
    tensor where the dtypes agree)."""
    return len(highs) == len(lows) and all(
        h.shape == lo.shape and integrity.bits_equal(h.to(lo.dtype), lo) for h, lo in zip(highs, lows))


def part_bytes(device: torch.device) -> int:
    """What one part may take on ``device``: ``PART_BYTES``, or on a GPU with room for more a
    share of its free memory (``PART_FREE_SHARE``, at most ``PART_MOST_BYTES``)."""
    if device.type != "cuda":
        return PART_BYTES
    return max(PART_BYTES, min(PART_MOST_BYTES, int(reference.room(device) * PART_FREE_SHARE)))


def call_bytes(model: Any, inputs: Sequence[Any], low: Sequence[Any], wide: bool) -> int:
    """What one call takes in a part at its peak: its inputs and a copy, its outputs twice, and
    (``wide``: the reference runs one step wider) the wider copies (reference.wider_bytes)."""
    size = 2 * reference.nbytes(inputs, False) + 2 * reference.nbytes(low, False)
    return size + (reference.wider_bytes(inputs, low, model) if wide else 0)


def _one_call(model: Any, hi_model: Any, values: list[Any], positions: list[int], mutated: list[int], *,
              high_only: bool = False) -> Callable[..., Any]:
    """One call's (high, low) from its tensors, as reference.run_reference computes them with its
    decision (``hi_model``) taken; ``high_only``: its high answer alone."""

    def one(*tensors: torch.Tensor) -> Any:
        args = list(values)
        for p, t in zip(positions, tensors):
            args[p] = t
        if high_only:
            return reference.run_wide(hi_model, args, mutated)
        return reference.run_decided(model, hi_model, args, mutated)

    return one


def _close(got: Sequence[Any], want: Sequence[Any], tolerances: Sequence[Tolerance]) -> bool:
    """Whether every output of ``got`` is within ``CLOSE`` of its tolerance (``tolerances``, one per
    output) of ``want``'s, or one rounding step of its dtype, non-finite values the same; bit for
    bit where there is no tolerance (not floating point).

    Another order of a sum moves a result near the midpoint of two steps of its dtype to the other
    step, as a reordered eager run (or an honest kernel) would: on the H100 a float8 output of
    rms_norm_fp8_quant did so at one call of 24. A value between two steps is never two steps from
    either rounding, so a candidate is never further from this reference than from eager's by
    more than that one step at such an element, which the tolerance of every dtype allows."""
    if len(got) != len(want) or len(tolerances) != len(want):
        return False
    for g, w, tol in zip(got, want, tolerances):
        if not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return False
        if not w.is_floating_point() or not w.numel():
            if not integrity.bits_equal(g.contiguous(), w.contiguous()):
                return False
            continue
        g64, w64 = g.detach().to(torch.float64), w.detach().to(torch.float64)
        finite = torch.where(torch.isfinite(w64), w64, 0.0)
        scale = torch.linalg.vector_norm(finite) / w64.numel() ** 0.5
        # the comparison's own rule (compare.errors), at CLOSE of the tolerance, plus one step
        err, allowed, nonfinite_bad, _, both = compare.errors(g64, w64, None, Tolerance(rtol=tol.rtol * CLOSE, atol=tol.atol * CLOSE), scale)
        if bool(nonfinite_bad.any()) or bool((both & (err > allowed + _step(finite, w.dtype))).any()):
            return False
    return True


def _step(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each of ``values`` (float64): one step of its binade (that of
    its smallest normal binade below it, where the subnormals are spaced alike)."""
    info = torch.finfo(dtype)
    binade = torch.floor(torch.log2(values.abs().clamp_min(info.tiny)))
    return torch.exp2(binade) * info.eps
