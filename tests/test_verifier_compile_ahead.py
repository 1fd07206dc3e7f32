"""torch.compile's baselines compiled ahead (verifier/compile_ahead.py, loop/compile_ahead.py): a
trusted process compiles exactly what the reference worker will, into the trusted compiler cache,
and the reference worker's own compile is then a cache hit. Here on the CPU (Inductor's C++ code);
on a GPU the same path writes Triton kernels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernforge.loop.compile_ahead import processes_for, requests
from kernforge.sandbox.env import worker_env
from kernforge.sandbox.protocol import WorkerSpec
from kernforge.tasks.loader import load_task

TASK = str(Path(__file__).parent / "tasks" / "tiny_norm")

HIT = """
import json, sys
from torch._dynamo.utils import counters
from kernforge.tasks.spec import Shape
from kernforge.verifier import refworker
refworker.warm_up()
msg = json.loads(sys.argv[1])
compiled = refworker._compiled(msg, refworker._model(msg["task_ref"], Shape.of(msg["shape"]), 7, "cpu"), "cpu")
print(json.dumps({"error": repr(compiled.error) if compiled.error else None, "hits": counters["inductor"]["fxgraph_cache_hit"]}))
"""


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="Inductor's CPU code needs a C++ compiler")
def test_a_compile_made_ahead_is_the_reference_workers_cache_hit(tmp_path):
    cache = tmp_path / "compiled"
    env = worker_env(WorkerSpec(isolation="none", trusted_cache=str(cache)), tmp_path, os.environ)
    msg = {"task_ref": TASK, "shape": {"T": 5, "H": 200}, "dist": "normal", "seeds": [3], "init_seed": 11}
    asks = json.dumps({"op": "judge_kernels"}) + "\n" + json.dumps(msg) + "\n"  # the judge's own kernels: GPU only
    ahead = subprocess.run([sys.executable, "-m", "kernforge.verifier.compile_ahead", "cpu"], input=asks,
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    said = [json.loads(line) for line in ahead.stdout.strip().splitlines()]
    assert len(said) == 2 and all(s["error"] is None for s in said), ahead.stderr[-2000:]
    assert any((cache / "inductor").rglob("*")), "the compile landed in the trusted cache"
    # the reference worker's compile of the same shape, in a process of its own, other weights
    again = subprocess.run([sys.executable, "-c", HIT, json.dumps({**msg, "seeds": [4]})], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    got = json.loads(again.stdout.strip().splitlines()[-1])
    assert got["error"] is None and got["hits"] >= 1, again.stderr[-2000:]


def test_a_tasks_shapes_are_compiled_together_in_the_order_of_first_verdicts():
    """Requests go task after task, in the order given (the first verdicts'): a first verdict
    needs every public shape of its task, so the first task is ready after its own compiles."""
    tasks = [load_task("softmax"), load_task("rms_norm")]
    got = requests(tasks)
    first = len(tasks[0].shapes("cuda", hidden=False))
    assert len(got) == first + len(tasks[1].shapes("cuda", hidden=False)) and first > 1
    assert [r["task_ref"] for r in got] == [tasks[0].ref] * first + [tasks[1].ref] * (len(got) - first)
    assert [r["shape"] for r in got[:first]] == [s.as_dict() for s in tasks[0].shapes("cuda", hidden=False)]
    assert {tuple(sorted(r)) for r in got} == {("dist", "init_seed", "seeds", "shape", "task_ref")}
    assert processes_for(16) == 4 and processes_for(2) == 1 and processes_for(None) == 1
