"""torch.compile's baselines compiled on the CPU cores while the GPU verifies.

A task's first verdict on a GPU measures its baselines, and torch.compile's is compiled afresh
per timed shape with static sizes: seconds of code generation per shape, about 10 s of a first
verdict of 35 s on the H200. At the start of a GPU run, ``CompileAhead`` hands every task's
public shapes to a few trusted processes (verifier/compile_ahead.py) that compile them exactly as
the reference worker will, into the trusted compiler cache the reference workers read
(WorkerSpec.trusted_cache): the reference worker's compile is then a cache hit. A compile's GPU
work (drawing the weights and inputs, the compiled graph's first run) is done while this holds
the GPU's gate shared for it (it may overlap checks, never a timed window); its code generation
holds nothing, so a timed phase waits at most for one step of GPU work. It is only ever a head
start: a compile that fails, times out or is not done yet is made by the reference worker as
before, and nothing a compile-ahead process says is evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from kernforge.sandbox.env import worker_env
from kernforge.sandbox.protocol import WorkerSpec
from kernforge.tasks.spec import Shape, Task
from kernforge.verifier.judge_errors import out_of_memory

#: a compile that takes longer than this is left to the reference worker (the process is stopped)
COMPILE_TIMEOUT_S = 300.0


def processes_for(cores: int | None) -> int:
    """How many compile processes: a quarter of the CPU cores (the judges' workers need the rest), 1 to 4."""
    return max(1, min(4, (cores or 1) // 4))


def requests(tasks: Sequence[Task], hidden: Sequence[Task] = ()) -> list[dict[str, Any]]:
    """One ``compile_baseline`` request per task and public shape (routine verdicts time those),
    task after task in the order given: the order the run's first verdicts take (``FairShare``).
    A task's first verdict measures the baselines of all its public shapes, so a task is ready
    once every shape of it is compiled; interleaved (each task's first shape, then each task's
    second...), no task but the last was ready before nearly everything was compiled, and the
    reference workers compiled the missing shapes again inside the first verdicts. Then the
    hidden shapes of each of ``hidden``, in its order, which only audits time (each audit
    compiled them itself: 3-5 s of its 28-33 s on the H200)."""
    def asks(task: Task, secret: bool) -> list[dict[str, Any]]:
        return [{"task_ref": task.ref, "shape": s.as_dict(), "dist": task.distributions[0], "seeds": [secrets.randbits(31)],
                 "init_seed": secrets.randbits(31)} for s in task.shapes("cuda", hidden=secret)]

    return [r for t in tasks for r in asks(t, False)] + [r for t in hidden for r in asks(t, True)]


class CompileAhead:
    """Compiles the public shapes' baselines of ``tasks`` ahead on ``device`` ("cuda:N"), then
    the hidden shapes' of ``hidden`` (where audits time them), the cache in ``cache``; ``hold``:
    an async context manager factory that holds the device's gate shared."""

    def __init__(self, tasks: Sequence[Task], device: str, cache: str, hold: Callable[[], Any],
                 note: Callable[[str], None] = lambda text: None, processes: int | None = None,
                 hidden: Sequence[Task] = ()) -> None:
        # the judge's own comparison kernels first (a first verdict's checks compile them), then the baselines
        self.queue = ([{"op": "judge_kernels", "task_ref": "the judge's comparison kernels", "shape": {}}] if tasks or hidden else []) \
            + requests(tasks, hidden)
        self.device, self.cache, self.hold, self.note = device, cache, hold, note
        self.processes = processes or processes_for(os.cpu_count())
        self.done = 0
        self.failed: list[str] = []
        self.seconds = 0.0
        #: seconds the GPU's gate was held shared for the compiles, in all and the longest hold with
        #: its request: a timed phase that wants the GPU alone waits for the holds under way
        self.held_s = 0.0
        self.longest: tuple[float, str] = (0.0, "")

    async def run(self) -> None:
        """Compile everything queued; returns when done (or cancelled: its processes are killed)."""
        home = tempfile.mkdtemp(prefix="kf-compile-ahead-")
        slot = self.device.split(":", 1)[1] if ":" in self.device else "0"
        env = worker_env(WorkerSpec(device=slot, isolation="none", trusted_cache=self.cache), home, os.environ)
        procs: list[asyncio.subprocess.Process] = []
        try:
            for _ in range(min(self.processes, len(self.queue))):
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "kernforge.verifier.compile_ahead", "cuda:0", env=env, cwd=home,
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL))
            await asyncio.gather(*(self._feed(p) for p in procs))
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                with contextlib.suppress(Exception):
                    await p.wait()
            shutil.rmtree(home, ignore_errors=True)
            self.note(self.summary())  # a run that ends first says so too

    def summary(self) -> str:
        """What was compiled, what was left to the judge, and how long the GPU was held for it."""
        held = (f"; the GPU held for them {self.held_s:.1f} s in all, at most {self.longest[0]:.1f} s at once "
                f"({self.longest[1]})" if self.longest[1] else "")
        return (f"torch.compile baselines compiled ahead: {self.done} shapes in {self.seconds:.0f} s of compiles"
                + (f", {len(self.failed)} left to the judge ({self.failed[0][:120]})" if self.failed else "")
                + (f", stopped before {len(self.queue)} more" if self.queue else "") + held)

    async def _feed(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        while self.queue:
            msg = self.queue.pop(0)
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            await proc.stdin.drain()
            label = f"{msg['task_ref']} {Shape.of(msg['shape'])}" if msg["shape"] else msg["task_ref"]
            got = await self._answer(proc, label)
            if got is None:  # the process died or hung: the rest of its share goes to the others
                self.failed.append(f"{msg['task_ref']}: no answer from the compile process")
                return
            self.seconds += float(got.get("seconds") or 0.0)
            if got.get("error"):
                self.failed.append(f"{msg['task_ref']} {msg['shape']}: {got['error']}")
            else:
                self.done += 1

    async def _answer(self, proc: asyncio.subprocess.Process, label: str) -> dict[str, Any] | None:
        """The process's answer to its request (``label``), the GPU's gate held shared for it whenever
        it asks (``{"gpu": true}`` until ``{"gpu": false}``: its GPU work, never its code generation);
        None where it died or went quiet for ``COMPILE_TIMEOUT_S``."""
        assert proc.stdin is not None and proc.stdout is not None
        since: float | None = None  # when the hold under way was taken

        def let_go() -> None:
            nonlocal since
            if since is not None:
                held, since = time.monotonic() - since, None
                self.held_s += held
                self.longest = max(self.longest, (held, label))

        async with contextlib.AsyncExitStack() as stack:
            try:
                while True:
                    try:
                        line = await asyncio.wait_for(proc.stdout.readline(), COMPILE_TIMEOUT_S)
                    except asyncio.TimeoutError:
                        return None
                    if not line:
                        return None
                    try:
                        got = json.loads(line)
                    except ValueError:
                        got = None
                    if not isinstance(got, dict):  # a library's own print to stdout: not the protocol's
                        continue
                    if got.get("gpu") is True:
                        await stack.enter_async_context(self.hold())
                        since = time.monotonic()
                        proc.stdin.write(b"go\n")
                        await proc.stdin.drain()
                    elif got.get("gpu") is False:
                        let_go()
                        await stack.aclose()
                    else:
                        return got
            finally:  # a hold the process never let go of ends here
                let_go()


class Background:
    """A run's compiles ahead, in the background: started once (``start``), stopped at the run's
    end (``stop``), or sooner to make room when the judge runs short of the GPU's memory
    (``make_room``). A verdict wins over a head start: each compile process holds up to
    verifier/compile_ahead.py's ``AHEAD_SHARE`` of the GPU's memory (a call's weights and inputs) for as long as its compile,
    over a minute for some of KernelBench's pooling problems, and on an H100 three KernelBench
    problems' reference workers ran out of memory beside them (two left unjudged after three tries,
    one audit lost)."""

    def __init__(self, note: Callable[[str], None] = lambda text: None) -> None:
        self._task: asyncio.Task | None = None
        self._note = note

    def start(self, ahead: CompileAhead) -> None:
        self._task = asyncio.create_task(ahead.run(), name="kernforge-compile-ahead")

    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Its processes killed (their memory freed once they have exited), whatever was compiled kept."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def make_room(self, error: BaseException) -> bool:
        """Stop the compiles ahead where ``error`` is the GPU's memory running out under the judge
        while they run: True when they were stopped (the judge's work may be tried again at once;
        the reference workers compile what was not compiled ahead, as before)."""
        if not self.running() or not out_of_memory(error):
            return False
        await self.stop()
        self._note("the GPU's memory ran short under the judge while torch.compile's baselines were compiled ahead: those "
                   "compiles are stopped to make room (the reference workers compile what is left, as without them)")
        return True
