"""The devices a run verifies on: one judge each, each verifying in a thread of its own.

The GPUs named by ``--gpu``, else every visible GPU, else the CPU (the Triton interpreter). A
device verifies one candidate at a time; its judge keeps ``pool_size`` sandbox workers warm
(on a GPU: one being judged, one warming behind it), so a fresh worker per candidate costs no
start-up time once the pool is full. All devices must be the same GPU model and software stack:
kernels are compared, and verdicts reused, only within one environment.

``busy_s`` is the time each device spent inside ``judge.verify``, audits of would-be bests
included (an audit is a second ``verify`` on the same device): what "busy" means on the display and
in bench/loop.py (a wait for a warm worker happens inside ``verify`` and counts).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from kernforge.archive.content import environment_key
from kernforge.tasks.spec import Task
from kernforge.verifier import audit as auditing
from kernforge.verifier.audit import Audit
from kernforge.verifier.judge import Judge, JudgeOptions, TaskTooLarge
from kernforge.verifier.verdict import Verdict

from .errors import LoopError
from .evaluate import open_judge
from .fairness import verdict_limit_s


class Devices:
    def __init__(self, names: Sequence[str], *, sandbox: str = "process", pool_size: int | None = None,
                 options: JudgeOptions | None = None, tasks: Sequence[Task] = ()) -> None:
        self.names = list(names)
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
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"kernforge-verify-{d}") for d in self.names]

    @property
    def on_cpu(self) -> bool:
        return self.names == ["cpu"]

    async def open(self) -> None:
        """Start every device's judge at once (workers, the reference); check they agree."""

        def open_one(device: str) -> tuple[Any, Judge]:
            pool = self.pool_size or (1 if device == "cpu" else 2)
            # a GPU verdict is time-boxed per task (fairness.py); the interpreter keeps its own timeouts
            box = None if device == "cpu" else {t.name: verdict_limit_s(t) for t in self.tasks}
            cm = open_judge(device, sandbox=self.sandbox, pool_size=pool, options=self.options, tasks=self.tasks,
                            time_box=box)
            return cm, cm.__enter__()

        opened = await asyncio.gather(*(asyncio.to_thread(open_one, d) for d in self.names), return_exceptions=True)
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

    async def verify(self, index: int, code: str, task: Task) -> tuple[Verdict, float]:
        """Judge ``code`` on device ``index`` (in its own thread); the verdict and seconds spent."""
        started = time.monotonic()
        verdict = await asyncio.get_running_loop().run_in_executor(self._threads[index], self.judges[index].verify, code, task)
        spent = time.monotonic() - started
        self.busy_s[self.names[index]] += spent
        self.verified[self.names[index]] += 1
        return verdict, spent

    async def audit(self, index: int, code: str, task: Task, verdict: Verdict) -> tuple[Audit, float]:
        """Audit a would-be best on device ``index``, the device that measured it (in its thread, like
        ``verify``: a fresh worker, fresh inputs); the audit and the seconds spent, counted as busy."""
        started = time.monotonic()
        result = await asyncio.get_running_loop().run_in_executor(
            self._threads[index], auditing.audit, self.judges[index], code, task, verdict)
        spent = time.monotonic() - started
        self.busy_s[self.names[index]] += spent
        self.audited[self.names[index]] += 1
        return result, spent

    async def close(self) -> None:
        """Close every judge (its workers are killed: a verification left running ends with them)."""
        await asyncio.gather(*(asyncio.to_thread(cm.__exit__, None, None, None) for cm in self._cms),
                             return_exceptions=True)
        self._cms = []
        for thread in self._threads:
            thread.shutdown(wait=False, cancel_futures=True)
