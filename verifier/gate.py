"""Who may use a GPU when several judges share it (``kernforge run --lanes N``).

Two verdicts on one GPU can overlap where neither can disturb what the other measures: while one
candidate's worker starts, imports and compiles its kernels, or is checked, another can be
checked too. Checks compare values, which no neighbour can change. What is timed must have the
GPU to itself: the batch clock's calibration, the timed batches, the baselines (timed before the
candidate's worker starts), the ceilings, an Nsight Compute profile. One GPU runs one process's kernels at a time, so a
neighbour's kernels inside a timed window would be counted in it.

So each judge holds its GPU's gate *shared* for a whole verdict and *exclusively* for each timed
phase: taking it exclusively from inside a verdict first lets the shared hold go, waits until no
other judge holds the gate at all, and takes the shared hold back afterwards. A judge waiting to
time goes before any judge waiting to start a verdict (writer preference): timing is never
starved by a stream of checks. A verdict that needs more of the GPU's memory than a lane's share
holds the gate exclusively from start to end (``Judge.verify``). The time a verdict waits for the
gate is not its candidate's: the worker's wall deadline moves back by it (``Session.extend``).

With one lane (the default) the gate is never contended and changes nothing.

GPU work of the run outside any judge holds the gate shared too (``shared_async``, from the event
loop): the Inductor capture of a start (loop/inductor_start.py) allocates and fills the task's
inputs on the GPU in a child process. Unheld, that work landed inside other verdicts' timed
windows on the H200 (an honest start's audit read 29% slower than its verdict and was demoted),
and inside a baseline's it would have inflated a speedup.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import AsyncIterator, Callable, Iterator


class DeviceGate:
    """A readers-writer lock over one GPU, with writer preference; ``lanes``: how many judges share it."""

    def __init__(self, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"a GPU needs at least one lane, not {lanes}")
        self.lanes = lanes
        self._cond = threading.Condition()
        self._shared = 0
        self._writer: int | None = None  # the thread holding the gate exclusively
        self._depth = 0  # its nested exclusive holds
        self._waiting_writers = 0
        self._local = threading.local()

    def _held_shared(self) -> int:
        return getattr(self._local, "shared", 0)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate alongside other shared holders (inside an exclusive hold of this thread: a no-op)."""
        if self._writer == threading.get_ident():
            yield
            return
        with self._cond:
            if not self._held_shared():  # a nested hold of this thread never waits (a writer waits on it)
                while self._writer is not None or self._waiting_writers:
                    self._cond.wait()
            self._shared += 1
        self._local.shared = self._held_shared() + 1
        try:
            yield
        finally:
            self._local.shared -= 1
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, pause: Callable[[], None] | None = None, resume: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the gate alone; a shared hold of this thread is let go meanwhile and taken back after.

        ``pause`` and ``resume`` bracket every wait of this thread at the gate, going in and coming
        out: ``pause`` runs while it still holds what it held (so no other judge can be timing
        yet), ``resume`` once it holds the gate again. A judge stops its candidate's worker there
        (judge._gpu_alone): another judge may time while it waits. Where the gate is free, or
        nobody waits to time when it is given back, nothing waits and neither is called."""
        me = threading.get_ident()
        if self._writer == me:  # nested
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        mine = self._held_shared()
        with self._cond:
            free = self._writer is None and self._shared == mine and not self._waiting_writers
            if free:
                self._shared -= mine
                self._writer, self._depth = me, 1
        if not free:
            if pause is not None:
                pause()
            with self._cond:
                self._shared -= mine
                self._waiting_writers += 1
                self._cond.notify_all()
                try:
                    while self._writer is not None or self._shared:
                        self._cond.wait()
                finally:
                    self._waiting_writers -= 1
                self._writer, self._depth = me, 1
            if resume is not None:
                resume()
        try:
            yield
        finally:
            with self._cond:
                # the verdict goes on holding the gate shared; a judge waiting to time goes first
                queue = bool(mine and self._waiting_writers)
                if not queue:
                    self._writer, self._depth = None, 0
                    self._shared += mine
                    self._cond.notify_all()
            if queue:
                if pause is not None:
                    pause()
                with self._cond:
                    self._writer, self._depth = None, 0
                    self._cond.notify_all()
                    while self._writer is not None or self._waiting_writers:
                        self._cond.wait()
                    self._shared += mine
                if resume is not None:
                    resume()

    @contextlib.asynccontextmanager
    async def shared_async(self) -> AsyncIterator[None]:
        """``shared`` for a coroutine: the hold lives on a thread of its own (holds are per thread),
        taken and given back without blocking the event loop."""
        entered, leave = threading.Event(), threading.Event()

        def hold() -> None:
            with self.shared():
                entered.set()
                leave.wait()

        holder = threading.Thread(target=hold, name="kernforge-gate-shared", daemon=True)
        holder.start()
        try:
            await asyncio.to_thread(entered.wait)
            yield
        finally:
            leave.set()
            await asyncio.to_thread(holder.join)
