"""The worker's own clock against the trusted one (THREATS #8).

The time of record never comes from the candidate's process. The worker still reports how long
its own clock says each request took; an honest harness's figure is the trusted figure less the
message latency. One far below the trusted clock means code in that process rewrote the timer,
its locals or the reply: positive evidence of an attempt, rejected as a cheat. The bounds are
deliberately loose (half, and an absolute margin), and at least two samples must agree: on the
H200 an honest KernelBench start (one public shape, so one repeat call) was accused on a single
sample, 55 ms reported against 202 ms by the judge's clock, while the machine's cores were busy
with the next tasks' torch.compile captures and the run's audits. A rewritten timer lies on every
call, so a second sample costs a real lie nothing; an honest stall is not repeated call after
call. The time of record never rests on this figure either way.

A sample's margin is the wake-ups the trusted side can rule out (``host_load``): a tight one
where the host had a core free for every runnable task and the trusted side never stalled, else
``LOADED_MARGIN_S``, more than any wake-up seen. On an H100 an honest seed's 512-call batch was
called a cheat on three samples alike (1.8 ms reported against 4.9 ms, 1.1 against 2.4) while
torch.compile's workers filled every core: the wake-ups were a steady few milliseconds, and a
batch that short cannot tell them from a lie. A lie the rule lets pass gains nothing (the time
of record is the trusted one); an honest kernel called a cheat is the worst verdict there is.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from ..checks import Check
from ..verdict import BOUNDED, Rejected, Status
from . import Defence, register

#: the worker's figure may be this fraction of the trusted one before it counts as a lie...
RATIO = 0.5
DEFENCE = register(Defence(
    Check.TRUSTED_CLOCK, (8,),
    facts="the judge's and the reference worker's clocks around each request, against the figure the worker reports",
    trusted=True,
    rationale="Times of record come from trusted clocks and call counts; a worker reporting far less time than "
              "the trusted clock measured has had its timer, its locals or its reply rewritten.",
    remedy="Leave the timer and the harness alone; make the kernel faster instead."))


#: ...in at least this many samples, every one of them
MIN_SAMPLES = 2
#: how much less than the trusted host clock over a batch (go sent to done received) an honest
#: worker may report on a quiet host: two wake-ups of processes with a core free (a 512-call
#: batch of a tiny kernel lasts about 2 ms, so the margin must stay well under that for the
#: rule to see a lie)
BATCH_MARGIN_S = 3e-4
#: the margin of a sample taken while the host was busy (host_load.quiet says not): wake-ups
#: then take what the scheduler gives (150 ms has been seen), so only a lie larger than that
#: is one; a shorter sample cannot tell and does not count
LOADED_MARGIN_S = 0.5

#: one sample: the worker's seconds, the trusted seconds, whether the host was quiet meanwhile
Sample = tuple[float, float, bool]


def lied(samples: Sequence[Sample], margin_s: float, ctx: str) -> Rejected | None:
    """``samples``: requests timed both ways (``Sample``); ``margin_s``: how much less than the
    trusted time an honest worker may report on a quiet host (latency), ``LOADED_MARGIN_S`` on
    a busy one. Only samples long enough to tell a lie from their margin count (twice it or more)."""
    telling = [(c, t, margin_s if q else LOADED_MARGIN_S, q) for c, t, q in samples]
    telling = [s for s in telling if s[1] >= 2 * s[2]]
    if len(telling) < MIN_SAMPLES:
        return None
    if all(t > 0 and c < RATIO * t and t - c > m for c, t, m, _ in telling):
        claimed, trusted, _, _ = telling[0]
        host = "a quiet host" if all(s[3] for s in telling) else "a host busy at times, each short by more than any wake-up"
        return DEFENCE.reject(Status.CHEAT, f"the candidate's process reported {claimed * 1e3:.3f} ms where the trusted clock measured "
                              f"{trusted * 1e3:.3f} ms ({ctx}; {len(telling)} of {len(telling)} samples alike, on {host}): "
                              "the timer was fooled", threat=8,
                              evidence={"samples_ms": [[c * 1e3, t * 1e3] for c, t, _, _ in telling[:10]],
                                        "quiet": [q for _, _, _, q in telling[:10]]})
    return None


#: how much longer than its floor the trusted write may take and still be taken off whole: less
#: than one time slice of the GPU's scheduler (about 2 ms on the H200), so a write that another
#: process's kernels interrupted is never taken off whole
WRITE_SLACK_MS = 0.5
WRITE_SLACK_SHARE = 0.25


def write_allowance(write_ms: float, floor_ms: float) -> float:
    """How much of a batch window is the trusted write's, to take off.

    The write's own events measure it exactly, unless another process's kernels ran in the
    middle of it (one GPU time-slices between processes): then its span holds their work too,
    and taking it all off would hand that work to the candidate for free. A preempted write is
    longer than its floor by at least a time slice; one within the slack was not preempted and
    is taken off whole, any other only by its floor (what no write can beat)."""
    if write_ms <= floor_ms + min(WRITE_SLACK_SHARE * floor_ms, WRITE_SLACK_MS):
        return write_ms
    return floor_ms


#: calibration rounds per verdict, and the fewest whose cost is taken off
CALIBRATION_ROUNDS = 7
CALIBRATION_MIN = 3


def fixed_cost(windows_ms: Sequence[float], writes_ms: Sequence[float]) -> float:
    """The batch clock's own cost (ms) to take off every batch window of one verdict.

    Each calibration round is a batch window over one tiny kernel, run by the harness before
    the candidate's module existed: the go, the worker's wake-up, its launch and sync, its
    done, the GPU's switches between the two processes, the probe. Anything can slow a round,
    nothing can make it cheaper than the protocol itself, so the least round (less its own
    write) is the cost from below: taken off, it never hands a candidate time it did not
    save. A candidate's batch pays every one of these steps (skipping one is cheat #8, which
    the probe sees). Fewer than ``CALIBRATION_MIN`` rounds: nothing is taken off."""
    costs = [max(w - x, 0.0) for w, x in zip(windows_ms, writes_ms)]
    if len(costs) < CALIBRATION_MIN:
        return 0.0
    return min(costs)


# ---- the time of record: two batch sizes --------------------------------------------------------
#: a shape is timed by a long batch and a short one of this share of its calls (at least one)...
SHORT_SHARE = 8
#: ...when the long one has at least this many calls (fewer: by the long batch alone)
DIFFERENCE_MIN_CALLS = 4
#: the difference may put the time of record at most this far below the long batch's own
#: figure (its window less the calibrated cost, over its calls)
DIFFERENCE_GUARD = 0.10


def short_calls(calls: int) -> int:
    """Calls in the short batch of a shape whose long batch has ``calls``; 0 times it by the
    long batch alone."""
    return max(1, calls // SHORT_SHARE) if calls >= DIFFERENCE_MIN_CALLS else 0


@dataclass(frozen=True)
class PerCall:
    """The time of record of one shape (us per call) and how it was reached."""

    us: float
    #: the long batches' own figure: window less write and calibrated cost, over the calls
    plain_us: float
    #: the cost of one more call: the long and the short batch's windows apart, over their calls apart
    slope_us: float | None
    #: what both batch sizes pay once (ms): the part of it the calibration did not see
    fixed_ms: float | None
    spread_pct: float | None
    #: "difference", "difference, bounded" (the guard set it) or "single" (one batch size)
    method: str


def per_call(long_ms: Sequence[float], short_ms: Sequence[float], calls: int, short: int, cost_ms: float) -> PerCall:
    """The time of record from trusted batch windows (each less its trusted write, ms).

    A window is W(n) = a + b*n for a batch of n calls: b is one call's device time, a what a
    batch pays once (the go, the switch of the GPU to the candidate's process and back, the
    launch, the done, the probe). The calibration measures part of ``a`` before the candidate's
    module exists; the rest depends on the batch (its graph, its memory) and is taken off by
    difference: b = (W(calls) - W(short)) / (calls - short), exact whatever ``a`` is (the
    median over the pairs of windows run side by side).

    The short window is the candidate's to inflate (its code knows which batch it is in): a
    candidate that pads it lowers b. So b may lower the time of record at most
    ``DIFFERENCE_GUARD`` below the long batch's own figure, which no padding can lower; for an
    honest kernel b sits a few per cent below that figure (``a`` less the calibration, over a
    window of 2.5 ms or more) and the guard does not bind. Where that rest of ``a`` outgrew a
    tenth of the window it would, and the record would sit above b (conservative, never below):
    an honest seed's shape then says "difference, bounded" (bench/verify.py's ``shapes_method``).
    """
    long_w = statistics.median(long_ms)
    plain = max(long_w - cost_ms, 0.0) * 1e3 / calls
    if not short or not short_ms:
        spread = _spread([max(w - cost_ms, 0.0) * 1e3 / calls for w in long_ms])
        return PerCall(plain, plain, None, None, spread, "single")
    short_w = statistics.median(short_ms)
    # each long window against the short one beside it: one interrupted window moves one pair
    pairs = [(a - b) * 1e3 / (calls - short) for a, b in zip(long_ms, short_ms)]
    slope = statistics.median(pairs)
    floor = plain * (1.0 - DIFFERENCE_GUARD)
    fixed = short_w - slope * short / 1e3 - cost_ms
    if slope >= floor:
        return PerCall(slope, plain, slope, fixed, _spread(pairs), "difference")
    return PerCall(floor, plain, slope, fixed, _spread(pairs), BOUNDED)


def _spread(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return 100.0 * (max(values) - min(values)) / mid if mid > 0 else None
