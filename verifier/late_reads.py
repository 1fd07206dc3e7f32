"""A checked call's outputs read again after a pause, the pause overlapped with later calls
(late writes, THREATS #5/#6; the rule is defences/late_writes.py).

The reference worker snapshots a call's outputs when its reply arrives and reads them again at
least ``PAUSE_S`` later: bytes that changed meanwhile were written by work the call left running.
Waiting the pause out inside every compare put 20 ms on the path of every checked call, about half
of a verdict's checks at small shapes, while the candidate's worker had long finished the next call.

On a GPU the second read of a call can wait: its outputs lie in the candidate's heap, and the
worker keeps its last ``KEPT_CALLS`` calls' outputs there while it runs the next (harness.py), all
but the last only where they take at most the verdict's ``defer_bytes``. The judge sends call n+2 only after the compare of call n, so call
n's memory cannot be handed to another call before that compare has ended: a call deferred at its
own compare is read again at a later compare once its pause is over, and at the latest at the
compare two calls on, where what is left of the pause is waited out. The judge ends every group of
checked calls with ``settle`` (every deferred call read again). So each output is still read at
least ``PAUSE_S`` after its snapshot, never sooner, and a write that landed in between is seen as
before; only the waiting overlaps the candidate's next calls.

Not deferred, read again within the compare as before: on the CPU (the worker copies its outputs
into slots the call after next reuses), a call that failed (its reasons are given whole, in the
order they always were), outputs that lie outside the heap and outside the call's own part of the
input region, and outputs written in place into an input where the input region has fewer than
``IN_PLACE_PARTS`` parts: the call after next's inputs are written there right after this compare.
With ``IN_PLACE_PARTS`` parts, the next call whose inputs go to a call's part is prepared only after
the compare two calls on, where that call has been read again (the same bound as the heap's).

Large outputs: the worker keeps the two earlier calls' outputs only where they take at most the
verdict's ``defer_bytes`` (``DEFER_BYTES``, or the largest call's outputs where the judge grew the
heap and the reference worker's room by two calls' outputs: ``Deferral``); a larger call is read
again within its compare, its pause waited out there. On an H100 those waits were 1.3 s of a
routine run's 2.2 s of compares (rms_norm and silu_and_mul at T=16384: 256 MiB a call), and an
in-place task's compare took 0.95 s a verdict against 0.27 for others (session 60).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: how long after the reply an output must still hold the same bytes
PAUSE_S = 0.02
#: a call's outputs up to this many bytes may be read again at a later compare (more where the
#: judge made room: ``Deferral``)
DEFER_BYTES = 64 << 20
#: earlier calls whose outputs a GPU worker keeps in place while it runs the next (harness._let_go):
#: the last one always (its compare runs beside the new call), the two before it where they take at
#: most the verdict's ``defer_bytes`` (a deferred call is read again at the latest at the compare two calls on)
KEPT_CALLS = 3


@dataclass
class _Deferred:
    key: str
    #: where the outputs lie, and the bytes they held when the reply arrived
    places: list[Any]
    snapshot: list[Any]
    taken: float
    #: compares since its own
    age: int = 0


class LateReads:
    """The calls whose second read is still due, oldest first."""

    def __init__(self, *, pause_s: float = PAUSE_S, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, sync: Callable[[], None] = lambda: None) -> None:
        self._due: list[_Deferred] = []
        self._pause_s, self._clock, self._sleep, self._sync = pause_s, clock, sleep, sync

    def __len__(self) -> int:
        return len(self._due)

    def defer(self, key: str, places: Sequence[Any], snapshot: Sequence[Any], taken: float) -> None:
        self._due.append(_Deferred(key, list(places), list(snapshot), taken))

    def at_compare(self) -> list[tuple[str, list[int]]]:
        """Called as a compare begins: every deferred call whose pause is over is read again, and
        every one two compares old whatever is left of its pause (its memory may be reused once
        this compare is over). Returns (key, outputs that changed) for each call read with a change."""
        for d in self._due:
            d.age += 1
        now = self._clock()
        ready = [d for d in self._due if d.age >= KEPT_CALLS - 1 or now - d.taken >= self._pause_s]
        return self._read(ready)

    def settle(self) -> list[tuple[str, list[int]]]:
        """Every deferred call read again, once its pause is over (the end of a group of checks,
        or a compare that reads its own call within it)."""
        return self._read(list(self._due))

    def clear(self) -> None:
        self._due.clear()

    def _read(self, ready: list[_Deferred]) -> list[tuple[str, list[int]]]:
        from . import integrity

        if not ready:
            return []
        wait = max(self._pause_s - (self._clock() - d.taken) for d in ready)
        if wait > 0:
            self._sleep(wait)
        self._sync()  # the candidate's writes in flight land before the bytes are read
        changed = []
        for d in ready:
            self._due.remove(d)
            late = [j for j, (place, snap) in enumerate(zip(d.places, d.snapshot)) if not integrity.bits_equal(place, snap)]
            if late:
                changed.append((d.key, late))
        return changed


@dataclass(frozen=True)
class Deferral:
    """What a verdict may defer: calls whose heap outputs take at most ``defer_bytes``, and
    in-place outputs where the checked calls' inputs rotate through ``input_parts`` parts of the
    input region. The judge decides it with the arena's layout; the reference worker and the
    candidate's worker follow it."""

    defer_bytes: int = DEFER_BYTES
    input_parts: int = 2


#: parts of the input region that let an in-place output's second read wait: call n's part is
#: written again by call n + parts, prepared after the compare of call n + parts - 2
IN_PLACE_PARTS = KEPT_CALLS + 1


def deferrable(on_gpu: bool, failed: bool, places: Sequence[tuple[int, int]], heap_start: int,
               own_part: tuple[int, int], deferral: Deferral = Deferral()) -> bool:
    """Whether a call's second read may wait for a later compare (module docstring).
    ``places``: each output's (offset, bytes) in the arena; the heap starts at ``heap_start``;
    ``own_part``: the call's part of the input region, [start, end)."""
    in_heap = [(offset, n) for offset, n in places if offset >= heap_start]
    in_place = [(offset, n) for offset, n in places if offset < heap_start]
    start, end = own_part
    in_own_part = all(start <= offset and offset + n <= end for offset, n in in_place)
    return (on_gpu and not failed and (not in_place or deferral.input_parts >= IN_PLACE_PARTS and in_own_part)
            and sum(n for _, n in in_heap) <= deferral.defer_bytes)
