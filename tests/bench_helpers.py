"""Helpers shared by the benchmark tests: GPU verdicts of KernelBench-named problems, made up."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from kernforge.archive import synthetic
from kernforge.archive.records import NewAttempt
from kernforge.verifier.verdict import ShapeResult

H200 = synthetic.H200
#: problem -> the file it came from (its folder is its level)
REFS = {"19_ReLU": "/kb/level1/19_ReLU.py", "23_Softmax": "/kb/level1/23_Softmax.py",
        "12_Gemm": "/kb/level2/12_Gemm.py", "2_Matmul": "/kb/level1/2_Matmul.py"}


def shape(time_us, eager_us, compile_us, hidden=False, timing="graph"):
    """One GPU-timed shape: the kernel's time and the two baselines' (microseconds)."""
    return ShapeResult(shape={"n": 8}, hidden=hidden, dtype="float32", timing=timing, time_us=time_us,
                       eager_us=eager_us, compile_us=compile_us, speedup_eager=eager_us / time_us,
                       speedup_compile=compile_us / time_us)


def add(archive, run, seq, task_id, verdict, code):
    """Record one attempt of model m1 on the H200; its id."""
    return archive.record_attempt(NewAttempt(run_id=run, seq=seq, task_id=task_id, code=code, verdict=verdict,
                                             environment=dict(H200), proposer="llm/fresh", model="m1"))


def bench_script(name: str) -> ModuleType:
    """bench/NAME.py, imported as a module (the benchmark scripts are no package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
