"""An honest kernel judged on a GPU while every CPU core is busy (GPU only).

On an H100 the judge called the built-in fp8_quant_per_group seed a cheat ("the timer was
fooled") in a run's first verdict, while torch.compile's compile-ahead processes filled the
cores: the worker's own clock and the trusted host clock around each 512-call batch differed by
the two processes' wake-ups, more than half of a 1.5 ms batch. verifier/host_load.py now tells
the clock rule when the host was busy. Here the cores are kept busy on purpose, and the seed,
whose public shape T=1 is the one the H100 accused, must be accepted. This module does not pin
the host quiet (conftest.quiet_host): the readings are the real ones.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any, Iterator

import pytest

from kernforge.loop.evaluate import open_judge
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeOptions
from kernforge.verifier.verdict import describe

pytestmark = pytest.mark.gpu


def _burn(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


@pytest.fixture
def busy_host() -> Iterator[int]:
    """Twice as many processes burning CPU as the host has cores, for the test's length."""
    ctx = mp.get_context("fork")  # they only spin Python: no CUDA in them
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(2 * (os.cpu_count() or 1))]
    for p in burners:
        p.start()
    try:
        yield len(burners)
    finally:
        stop.set()
        for p in burners:
            p.join(10)
            if p.is_alive():
                p.kill()


def test_an_honest_seed_judged_on_a_busy_host_is_accepted(busy_host, tmp_path):
    from kernforge.verifier import host_load

    assert not host_load.quiet({"runnable_max": float(host_load.runnable() or 0), "stall_max": 0.0}), \
        "the burners keep more tasks runnable than there are cores"
    task = load_task("fp8_quant_per_group")
    options = JudgeOptions(cache_dir=tmp_path / "cache", baselines=False, batches=3)
    with open_judge("cuda:0", pool_size=1, options=options) as judge:
        verdict = judge.verify(task.seed_source, task)
    assert verdict.accepted, describe(verdict)
