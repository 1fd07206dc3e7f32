"""The devices a run verifies on: ``lanes`` judges each, each verifying in a thread of its own.

The GPUs named by ``--gpu``, else every visible GPU, else the CPU (the Triton interpreter). A
lane verifies one candidate at a time; its judge keeps ``pool_size`` sandbox workers warm (on a
GPU: one being judged, one compiling the next candidate's kernels ahead, two warming), so a
fresh worker per candidate costs no start-up time once the pool is full. The lanes of one GPU share its gate (verifier/gate.py): their
verdicts overlap while workers start, import, compile and are checked, and each timed phase has
the GPU alone. ``slots`` lists the device of every lane; a verification names its slot. All
devices must be the same GPU model and software stack: kernels are compared, and verdicts
reused, only within one environment.

``busy_s`` is the time each device spent with at least one of its lanes inside ``judge.verify``,
audits of would-be bests included (an audit is a second ``verify`` on the same device): what
"busy" means on the display and in bench/loop.py (a wait for a warm worker happens inside
``verify`` and counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from kernforge.archive.content import environment_key
from kernforge.tasks.spec import Task
from kernforge.verifier import audit as auditing
from kernforge.verifier.audit import Audit
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import Judge, JudgeOptions, TaskTooLarge
from kernforge.verifier.verdict import Status, Verdict

from .errors import LoopError
from .evaluate import open_judge
from .fairness import verdict_limit_s
from .kernels_ahead import KernelsAhead

#: warm sandbox workers per GPU lane (ready or starting, besides the one judged)
GPU_POOL = 6


#: what a verdict given its kernels compiled ahead may be because of them (a file Triton could not
#: load, or that crashed the worker): such a verdict is made again without them (``Devices.verify``).
#: Not a timeout: a loaded kernel is no slower to load than to compile, and a slow candidate's
#: timeout would cost its whole time box twice
AHEAD_SUSPECT = frozenset({Status.CRASHED, Status.RUNTIME_ERROR, Status.COMPILE_ERROR})
#: accepted sources whose kernels compiled ahead are kept for their audits (``audit``); the
#: oldest is let go first (at most 8 MiB each: triton_ahead.MAX_BYTES)
KEEP_COMPILED = 16


class Devices:
    def __init__(self, names: Sequence[str], *, sandbox: str = "process", pool_size: int | None = None,
                 options: JudgeOptions | None = None, tasks: Sequence[Task] = (), lanes: int = 1) -> None:
        self.names = list(names)
        self.slots = [name for name in self.names for _ in range(lanes)]
        self.gates = {name: DeviceGate(lanes) for name in self.names}
        self.tasks = list(tasks)
        self.sandbox = sandbox
        self.pool_size = pool_size
        self.options = options or JudgeOptions()
        self.judges: list[Judge] = []
        self.env: dict[str, Any] = {}
        self.env_key = ""
        self.busy_s = {d: 0.0 for d in self.names}
        self.verified = {d: 0 for d in self.names}
        self.audited = {d: 0 for d in self.names}
        self._cms: list[Any] = []
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"kernforge-verify-{d}-{k}") for k, d in enumerate(self.slots)]
        #: per device: lanes inside a verification now, and since when the first of them was
        self._active = {d: 0 for d in self.names}
        self._since = {d: 0.0 for d in self.names}
        #: one entry per verification and audit, in the order they ended: where a run's device time
        #: went (bench/loop.py keeps it; diagnostics, never evidence)
        self.log: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._ahead_turn = -1
        #: why nothing is compiled ahead any more in this run (``verify``), else None
        self.ahead_off: str | None = None
        #: the kernels compiled ahead of accepted verdicts, by source, for their audits
        self._compiled: dict[str, dict[str, str]] = {}

    @property
    def on_cpu(self) -> bool:
        return self.names == ["cpu"]

    @contextlib.asynccontextmanager
    async def gpu_child(self, start: Callable[[], Awaitable[Any]]) -> AsyncIterator[Any]:
        """A child process of the run that does GPU work outside any judge (the Inductor capture of
        a start), made by ``start`` (it returns the process) with every device's gate held shared,
        so that nobody times while it starts, and enlisted with every gate until the block ends: a
        judge about to time stops it (and its tree) instead of waiting for it to end (a capture
        compiles for seconds, minutes at KernelBench's sizes). It may overlap checks, never a timed
        phase. Every device's gate, as the child picks its GPU itself."""
        tokens: list[tuple[Any, int]] = []
        async with contextlib.AsyncExitStack() as stack:
            for name in self.names:
                await stack.enter_async_context(self.gates[name].shared_async())
            child = await start()
            tokens = [(self.gates[name], self.gates[name].enlist_process(child.pid)) for name in self.names]
        try:
            yield child
        finally:
            for gate, token in tokens:
                gate.delist(token)

    async def open(self) -> None:
        """Start every device's judge at once (workers, the reference); check they agree."""

        def open_one(device: str) -> tuple[Any, Judge]:
            # on a GPU: besides the worker judged, one compiling the next candidate ahead and the
            # rest warming (a verdict and a compile ahead take one each every few seconds, and a
            # worker's start is seconds: with one warming, an H100 run's compile ahead found no
            # worker to spare for 7 of 31 verdicts, which then paid their launchers' and public
            # shapes' compiles again, 0.6 s of a 3.4 s rms_norm verdict; with a pool of four, for
            # 5 of 23 verdicts of 3.7 s, whose first calls took 0.7-2.0 s against 0.1-0.3 s)
            pool = self.pool_size or (1 if device == "cpu" else GPU_POOL)
            # a GPU verdict is time-boxed per task (fairness.py); the interpreter keeps its own timeouts
            box = None if device == "cpu" else {t.name: verdict_limit_s(t) for t in self.tasks}
            cm = open_judge(device, sandbox=self.sandbox, pool_size=pool, options=self.options, tasks=self.tasks,
                            time_box=box, gate=self.gates[device])
            return cm, cm.__enter__()

        opened = await asyncio.gather(*(asyncio.to_thread(open_one, d) for d in self.slots), return_exceptions=True)
        self._cms = [o[0] for o in opened if not isinstance(o, BaseException)]
        errors = [o for o in opened if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        self.judges = [o[1] for o in opened]
        envs = await asyncio.gather(*(asyncio.to_thread(j.environment) for j in self.judges))
        keys = {environment_key(e) for e in envs}
        if len(keys) > 1:
            names = sorted({str(e.get("gpu")) for e in envs})
            raise LoopError(f"the GPUs differ ({', '.join(names)}): kernels are compared within one GPU model and "
                            "software stack; choose GPUs of one model with --gpu")
        self.env = dict(envs[0])
        self.env_key = keys.pop()

    def known_baselines(self) -> dict[str, Any]:
        """Every baseline the judges have measured or been given, by the judge's key."""
        known: dict[str, Any] = {}
        for cache in self._baseline_caches():
            known.update(cache.entries())
        return known

    def learn_baselines(self, entries: Mapping[str, Any]) -> None:
        """Give the judges baselines measured earlier (the archive's): they are not measured again."""
        for cache in self._baseline_caches():
            have = cache.entries()
            cache.put_many({k: v for k, v in entries.items() if k not in have})

    def _baseline_caches(self) -> list[Any]:
        """The judges' baseline caches, each file once (judges on one machine share theirs); a
        judge without one (a stand-in of the tests) has none to share."""
        caches = [c for c in (getattr(j, "baseline_cache", None) for j in self.judges) if c is not None]
        return list({str(c.path): c for c in caches}.values())

    async def too_large(self, task: Task) -> str | None:
        """Why no candidate of ``task`` can be judged on these GPUs (verifier/fits.py), or None."""
        try:
            await asyncio.to_thread(self.judges[0].check_fits, task)
        except TaskTooLarge as err:
            return str(err)
        return None

    async def ceilings(self) -> dict[str, Any]:
        """Measured bandwidth and FLOP ceilings of the first device (for prompts)."""
        return await asyncio.to_thread(self.judges[0].ceilings)

    def kernels_ahead(self, code: str, task: Task) -> KernelsAhead | None:
        """Start compiling ``code``'s Triton kernels at ``task``'s public shapes on a worker of
        the next lane's pool (verifier/triton_ahead.py), while the lanes judge other candidates;
        None where nothing is compiled ahead (the CPU, a container sandbox whose workers the gate
        cannot stop, a CUDA C++ source)."""
        if self.on_cpu or self.sandbox != "process" or not self.judges or self.ahead_off:
            return None
        self._ahead_turn = (self._ahead_turn + 1) % len(self.judges)
        ahead = self.judges[self._ahead_turn].kernels_ahead(code, task)
        return KernelsAhead(ahead, asyncio.create_task(asyncio.to_thread(ahead.run))) if ahead is not None else None

    async def verify(self, index: int, code: str, task: Task, bar: Mapping[str, float] | None = None,
                     ahead: KernelsAhead | None = None) -> tuple[Verdict, float]:
        """Judge ``code`` in slot ``index`` (in its own thread); the verdict and seconds spent.
        ``bar``: the task's best time per shape on this device (verifier/contender.py). ``ahead``:
        its kernels compiled ahead (``kernels_ahead``), waited for as the verdict's first step."""
        device = self.slots[index]
        started = self._enter(device)
        try:
            # the files of this very source only: another's would be its kernels, not these
            compiled = await ahead.files() if ahead is not None and ahead.ahead.source == code else None
            waited = time.monotonic() - started
            verdict = await self._given(index, functools.partial(self.judges[index].verify, code, task, bar), compiled,
                                        lambda made: made)
        finally:
            self._leave(device)
        if compiled and verdict.accepted and not self.ahead_off:  # its audit's workers get them too
            self._compiled.pop(code, None)
            self._compiled[code] = compiled
            while len(self._compiled) > KEEP_COMPILED:
                self._compiled.pop(next(iter(self._compiled)))
        self.verified[device] += 1
        self._note("verdict", index, task, started, verdict, {"ahead.wait": waited} if ahead is not None else None)
        if ahead is not None:  # what came of it, for bench/loop.py
            self.log[-1]["ahead"] = {"shapes": ahead.ahead.shapes, "decoys": ahead.ahead.decoys, "files": len(compiled or {}),
                                     "outcome": ahead.outcome}
            if ahead.ahead.pool is not None:  # it found no worker to spare: the pool as it was then
                self.log[-1]["ahead"]["pool"] = ahead.ahead.pool
        return verdict, time.monotonic() - started

    async def audit(self, index: int, code: str, task: Task, verdict: Verdict) -> tuple[Audit, float]:
        """Audit a would-be best in slot ``index``, a lane of the device that measured it (in its
        thread, like ``verify``: a fresh worker, fresh inputs); the audit and the seconds spent."""
        device = self.slots[index]
        started = self._enter(device)
        # the kernels its verdict was given, compiled ahead at the public shapes: the second
        # verdict's and the profiled worker's first calls there load them (the profiled worker
        # compiles with the GPU held for its record)
        compiled = self._compiled.pop(code, None)
        try:
            result = await self._given(index, functools.partial(auditing.audit, self.judges[index], code, task, verdict),
                                       compiled, lambda made: made.verdict)
        finally:
            self._leave(device)
        self.audited[device] += 1
        self._note("audit", index, task, started, result.verdict, (result.details.get("ncu") or {}).get("seconds"))
        self.log[-1]["ahead"] = {"files": len(compiled or {})}
        return result, time.monotonic() - started

    async def _given(self, index: int, run: Callable[..., Any], compiled: dict[str, str] | None,
                     verdict_of: Callable[[Any], Verdict | None]) -> Any:
        """``run`` (a verdict or an audit, on lane ``index``'s thread) given ``compiled``, the
        kernels compiled ahead. Where its verdict failed as a bad cache could make it fail
        (``AHEAD_SUSPECT``), never the candidate's verdict on the strength of a speed-up of ours:
        made again without them, and that one stands; where the two differ, nothing more is
        compiled ahead in this run (the first H100 run of this crashed every verdict: the files
        were written over the worker's loaded modules)."""
        loop = asyncio.get_running_loop()
        made = await loop.run_in_executor(self._threads[index], functools.partial(run, **({"compiled": compiled} if compiled else {})))
        given = verdict_of(made)
        if not compiled or given is None or given.status not in AHEAD_SUSPECT:
            return made
        again = await loop.run_in_executor(self._threads[index], run)
        without = verdict_of(again)
        if without is not None and without.status is not given.status:
            self.ahead_off = (f"a verdict given its kernels compiled ahead was {given.status.value} "
                              f"({given.reason[:200]}), and {without.status.value} without them")
            self._compiled.clear()
        return again

    def _note(self, kind: str, index: int, task: Task, started: float, verdict: Verdict | None,
              more_steps: Mapping[str, float] | None = None) -> None:
        """Log one verification: its lane, task, start and length, and the judge's steps (a verdict's,
        or an audit's second verdict's, with its Nsight Compute run's stages)."""
        entry: dict[str, Any] = {"kind": kind, "slot": index, "task": task.name,
                                 "start_s": round(started - self._t0, 2),
                                 "seconds": round(time.monotonic() - started, 2)}
        if verdict is not None:
            entry["status"] = verdict.status.value
            steps = verdict.environment.get("phase_seconds")
            if isinstance(steps, Mapping):
                entry["steps"] = dict(steps)
            calls = verdict.environment.get("checked_calls")
            if isinstance(calls, int):
                entry["checked_calls"] = calls
        if more_steps:
            entry["steps"] = dict(entry.get("steps", {}), **more_steps)
        self.log.append(entry)

    def _enter(self, device: str) -> float:
        """A lane of ``device`` starts work (on the event loop's thread, like ``_leave``)."""
        now = time.monotonic()
        if self._active[device] == 0:
            self._since[device] = now
        self._active[device] += 1
        return now

    def _leave(self, device: str) -> None:
        """A lane of ``device`` is done; the device's busy time grows while any lane works."""
        self._active[device] -= 1
        if self._active[device] == 0:
            self.busy_s[device] += time.monotonic() - self._since[device]

    async def close(self) -> None:
        """Close every judge (its workers are killed: a verification left running ends with them)."""
        await asyncio.gather(*(asyncio.to_thread(cm.__exit__, None, None, None) for cm in self._cms),
                             return_exceptions=True)
        self._cms = []
        for thread in self._threads:
            thread.shutdown(wait=False, cancel_futures=True)
