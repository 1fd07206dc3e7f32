"""Who may use a GPU when several judges share it (``kernforge run --lanes N``).

Two verdicts on one GPU can overlap where neither can disturb what the other measures: while one
candidate's worker starts, imports and compiles its kernels, or is checked, another can be
checked too. Checks compare values, which no neighbour can change. What is timed must have the
GPU to itself: the batch clock's calibration, the timed batches, the baselines (timed before the
candidate's worker starts), the ceilings, an Nsight Compute profile. One GPU runs one process's kernels at a time, so a
neighbour's kernels inside a timed window would be counted in it.

So a timed phase holds the gate *exclusively*, and everything else that puts work on the GPU is
either short and trusted, or stopped while it holds it:

- the trusted work of a verdict (each request to its reference worker, the start of its
  candidate's worker) holds the gate *shared* for that request alone: a timed phase waits for
  the requests in flight, and requests wait while one times;
- a candidate's worker is *enlisted* with the gate for its whole session (``enlisted``): the
  judge that takes the gate exclusively stops every other judge's enlisted worker first
  (``Session.pause``, SIGSTOP to the job's processes) and lets them go on when it gives the gate
  back. What a stopped worker queued on the GPU before still runs: the reference worker waits
  for the GPU to be quiet before it times (refworker._quiet_gpu). The time a worker spends
  stopped is not its own: it counts against neither its deadline nor a request's timeout
  (``Session.stopped_seconds``), nor the judge's wall clock around a call (clock.lied).

Before, a verdict held the gate shared from its start to its end, and a timed phase waited until
every other lane had reached a timed phase of its own or ended: the lanes moved in lockstep. On
the H200 (session 37), four lanes made 23 verdicts in 290 s where one lane made 15, each verdict
waiting at the gate for 6-88 s. With this gate four lanes waited 5-33 s, but made 16 verdicts and
3 audits in 272 s: what they now ran side by side, they ran slower. One GPU runs one process's
kernels at a time and switches between processes by time slices, and a verdict's trusted steps
are thousands of small kernels (drawing every call's inputs, comparing every output): a
verdict's input draws took 10-23 s where one lane's take 1.4 s. More lanes pay on one GPU only
where a lane's work is mostly on the CPU (compiles); the default stays one lane. An MPS daemon
for the trusted processes does not change that (H100, session 59, bench/timeslice_probe.py): a
step of small kernels beside another process's 1 GiB streams took 8.3 times its time alone
without MPS and 22.4 times with it, its kernels queued behind the large ones instead of sliced.
Nor does letting one lane's reference request run at a time (H100, session 60, the 14 built-in
tasks resumed on one archive for 150 s each, one lease): two lanes made 19 verdicts of 8.9 s
each, one lane 24 of 4.0 s; each lane's requests then waited on the other's instead of sliced.

A judge waiting to time goes before any judge waiting to hold the gate shared (writer
preference): timing is never starved by a stream of requests. A verdict that needs more of the
GPU's memory than a lane's share holds the gate exclusively from start to end (``Judge.verify``),
every other lane's worker stopped meanwhile. The time a judge waits for the gate is not its
candidate's: its worker is stopped meanwhile (``exclusive``'s ``own``), and a stopped job's
deadline moves back by the seconds it was stopped (``Session.stopped_seconds``).

With one lane (the default) the gate is never contended and stops nothing.

A candidate pool refills itself in the background while judges time, and a worker's warm-up is
GPU work too (harness.warm_up: a CUDA context, Triton's first kernel compiled and launched). On an
H100 (session 62, bench/start_noise_probe.py) a window of 512 small kernels took 1.07 us a call at
the median alone and beside workers warming up, but its worst of some 1,350 windows took 2.85 us
alone, 5.82 us beside the starts and 1.32 us with the starters stopped for each window: a start
now and then lands in a window, and a shape timed by two pairs of windows reads up to twice its
time when one of them is hit (a baseline so hit would inflate a speedup). So each worker is
enlisted as the pool starts it and until it is warm (``warming``), stopped by every judge that
times, its own too, by a quick stop of its tree (procs.stop_trusted_tree: trusted code, no walk
of /proc). A pool's thread never waits for the gate: a worker that starts while the gate is held
alone is stopped at once. A judge that holds the gate alone and waits for a worker (a verdict on
the whole GPU) lets the warming ones go while it waits (``enlisted``). The audit's worker under
Nsight Compute is never enlisted this way: stopped and let go around the windows, a tree of
ncu's hung in its warm-up (loop/evaluate.py ``open_judge``); its record waits for it before it
takes the gate (judge.py ``_await_warm``).

GPU work of the run outside any judge is enlisted, or holds the gate shared, from the event
loop. The Inductor capture of a start (loop/inductor_start.py), a child process that allocates
and fills the task's inputs on the GPU and compiles for seconds to minutes, is started with the
gate held shared and enlisted until it ends (loop/devices.py ``Devices.gpu_child``): before, it
held the gate shared from start to end, and every timed phase of every verdict waited for it. A
compile ahead's steps of GPU work (loop/compile_ahead.py) hold it shared (``shared_async``) and
are never stopped: a step is where Inductor autotunes its kernels, and a stop in the middle of
a benchmark could make it choose a slower one, a slower torch.compile baseline for the whole
night (a first verdict with one lane waited 18.6 s at the gate for them on the H200, session 37). Unheld, that work landed inside other verdicts' timed
windows on the H200 (an honest start's audit read 29% slower than its verdict and was demoted),
and inside a baseline's it would have inflated a speedup.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Protocol, TypeVar

from kernforge.sandbox import procs
from kernforge.sandbox.session import pause_all

from .judge_errors import GpuBusy

S = TypeVar("S", bound="Stoppable")


class Stoppable(Protocol):
    """What the gate stops while another judge times: a candidate's session (sandbox Session)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class _Process:
    """A trusted process of the run and its tree, stopped while another judge times (procs.freeze)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._stopped: set[int] = set()

    def pause(self) -> None:
        self._stopped |= procs.freeze(self.pid)

    def resume(self) -> None:
        procs.thaw(self._stopped)
        self._stopped = set()


class DeviceGate:
    """A readers-writer lock over one GPU, with writer preference, that stops every other judge's
    enlisted worker while it is held exclusively; ``lanes``: how many judges share it."""

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
        #: candidates' workers, each with the thread of the judge it belongs to (None: a trusted
        #: process of the run's, stopped by every judge that times)
        self._enlisted: dict[int, tuple[int | None, Stoppable]] = {}
        #: what the exclusive hold in progress stopped (``warming`` adds to it), and whether that
        #: hold is letting them go (nothing more is stopped then)
        self._paused: list[Stoppable] = []
        self._releasing = False
        #: the enlisted workers that are warming up (``warming``), and whether the judge holding
        #: the gate alone waits for a worker now (``enlisted``): none is stopped meanwhile
        self._warming: set[int] = set()
        self._awaiting = False
        #: the thread whose run of windows keeps others' jobs stopped (``others_stopped``), and those jobs
        self._keeper: int | None = None
        self._kept: dict[int, Stoppable] = {}

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
    def enlisted(self, start: Callable[[], S]) -> Iterator[S]:
        """A candidate's worker, started by ``start`` with the gate held shared (nobody times while
        it starts) and enlisted before anybody can: from then until the block ends, every other
        judge that holds the gate exclusively stops it first. A worker that cannot be stopped (a
        container whose processes the parent cannot see: ``Session.stoppable``) is never
        enlisted: its verdict holds the gate shared to the end instead, and another lane's timing
        waits for it."""
        enlisted = False
        with contextlib.ExitStack() as held:
            held.enter_context(self.shared())
            with self._start_awaited() if self._writer == threading.get_ident() else contextlib.nullcontext():
                worker = start()
            if getattr(worker, "stoppable", lambda: True)():
                with self._cond:
                    self._enlisted[id(worker)] = (threading.get_ident(), worker)
                enlisted = True
                held.close()
            try:
                yield worker
            finally:
                if enlisted:
                    with self._cond:
                        self._enlisted.pop(id(worker), None)

    @contextlib.contextmanager
    def exclusive(self, own: Stoppable | None = None) -> Iterator[None]:
        """Hold the gate alone, every other judge's enlisted worker stopped; a shared hold of this
        thread is let go meanwhile and taken back after. ``own``: this judge's worker, stopped
        while the judge waits for the gate (it gets the time back: Session.stopped_seconds), so
        that a wait for other lanes' requests is neither its time nor free time for it. GpuBusy
        where another worker could not be stopped."""
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
        if not free and own is not None:
            try:
                own.pause()
            except procs.NotStopped:  # what did stop is resumed below; the rest ran on while it waited
                pass
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
            others = [worker for token, (owner, worker) in self._enlisted.items() if owner != me and token not in self._kept]
            self._paused = list(others)
        try:
            if not free and own is not None:
                own.resume()
            try:
                pause_all(others)  # found and stopped together: one pass over /proc per round for all
            except procs.NotStopped as error:
                raise GpuBusy(f"another lane's worker could not be stopped for a timed phase: {error}") from None
            yield
        finally:
            with self._cond:  # what ``warming`` stopped meanwhile is among them; from now on it stops nothing
                self._releasing = True
                stopped, self._paused = self._paused, []
            self._resume(stopped)
            with self._cond:
                self._writer, self._depth, self._releasing = None, 0, False
                self._cond.notify_all()
                # the verdict's shared hold back; a judge waiting to time goes first
                while mine and (self._writer is not None or self._waiting_writers):
                    self._cond.wait()
                self._shared += mine

    @contextlib.contextmanager
    def others_stopped(self) -> Iterator[None]:
        """A run of timed windows close together (a shape's: its long and short batches, twice,
        with the draws and verifications between them): the jobs others enlisted (a compile
        ahead's worker, a trusted process of the run's) are stopped once for the whole run, not
        once per window. Each such stop is two walks of /proc or more; stopped before every
        window, with hundreds of processes on the host, the judge's waits at the gate came to
        0.24 s of each verdict on an H100 (session 62). Warming workers are still stopped window
        by window (``warming``: a quick stop, and their starts go on between windows: a pool
        that runs dry costs a verdict its compile ahead). Only with one lane: with more, another
        lane's verdict would wait through this one's verifications. A no-op nested, inside an
        exclusive hold of this thread (a verdict on the whole GPU: that hold stopped them all, and
        lets them go), or where a job would not stop (each window then stops it, and says so)."""
        me = threading.get_ident()
        if self.lanes > 1 or self._keeper is not None or self._writer == me:
            yield
            return
        with self._cond:
            kept = {token: w for token, (owner, w) in self._enlisted.items() if owner != me and token not in self._warming}
            try:
                pause_all(list(kept.values()))
            except procs.NotStopped:
                kept_ok = False
            else:
                kept_ok = True
            if kept_ok:
                self._keeper, self._kept = me, kept
        if not kept_ok:
            self._resume(list(kept.values()))
            yield
            return
        try:
            yield
        finally:
            with self._cond:
                kept, self._kept, self._keeper = self._kept, {}, None
            self._resume(list(kept.values()))

    @staticmethod
    def _resume(workers: list[Stoppable]) -> None:
        for worker in workers:
            try:
                worker.resume()
            except Exception:  # a worker closed meanwhile: nothing of it runs to resume
                pass

    def enlist_process(self, pid: int) -> int:
        """Enlist a trusted process of the run's, ``pid`` and its tree: every judge that times stops
        it until it is delisted. The caller holds the gate shared (nobody times as it is enlisted).
        A token for ``delist``."""
        process = _Process(pid)
        with self._cond:
            self._enlisted[id(process)] = (None, process)
        return id(process)

    def warming(self, worker: Any) -> Callable[[], None]:
        """Enlist a sandbox worker (spawn.Worker, or any Stoppable) as it starts, until it is warm
        (call what this returns then, or once it is gone): its trusted warm-up creates a CUDA
        context and compiles and launches a kernel (harness.warm_up), and a pool refills itself
        in the background while judges time. Every judge that times stops it meanwhile, its own
        judge too. Never waits for the gate (a pool's thread calls it, and a judge holding the
        gate may be waiting for that pool's next worker): where the gate is held exclusively now,
        the worker is stopped at once and let go with the others that hold stopped."""
        token = id(worker)
        with self._cond:
            self._enlisted[token] = (None, worker)
            self._warming.add(token)
            if self._writer is not None and not self._releasing and not self._awaiting:
                self._stop_now([worker])

        def warm() -> None:
            with self._cond:
                self._warming.discard(token)
            self.delist(token)
        return warm

    def _stop_now(self, workers: list[Stoppable]) -> None:
        """Stop ``workers`` for the exclusive hold in progress (the caller holds ``_cond``)."""
        try:
            pause_all(workers)
        except procs.NotStopped:  # what did stop is resumed with the rest
            pass
        self._paused.extend(workers)

    @contextlib.contextmanager
    def _start_awaited(self) -> Iterator[None]:
        """The judge holding the gate alone waits for a worker (a verdict that holds the whole
        GPU): the warming workers its hold stopped go on meanwhile, and
        none is stopped (the one it waits for is among them), then they are stopped again."""
        with self._cond:
            self._awaiting = True
            going = [w for w in self._paused if id(w) in self._warming]
            self._paused = [w for w in self._paused if id(w) not in self._warming]
        for worker in going:
            worker.resume()
        try:
            yield
        finally:
            with self._cond:
                self._awaiting = False
                if not self._releasing:
                    self._stop_now([w for token, (_, w) in self._enlisted.items() if token in self._warming])

    def delist(self, token: int) -> None:
        """Stop stopping what ``enlist_process`` enlisted."""
        with self._cond:
            self._enlisted.pop(token, None)

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
