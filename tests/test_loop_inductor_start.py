"""The Inductor start (loop/inductor_start.py): torch.compile's own Triton kernels as a candidate,
judged by the real judge on the CPU (Triton interpreter) on every public and hidden CPU shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernforge.loop.evaluate import open_judge
from kernforge.loop.inductor_start import NoStart, Start, derive
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeOptions
from kernforge.verifier.verdict import describe

COPIES = Path(__file__).resolve().parent / "kernelbench"


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"))
    with open_judge("cpu", pool_size=2, options=options) as j:
        yield j


# elementwise (one pointwise kernel), a row softmax (a looped reduction and a pointwise pass) and
# RMSNorm over dim 1 of a 4-d tensor (strided reduction, sizes as kernel arguments)
@pytest.mark.parametrize("stem", ["26_GELU_", "23_Softmax", "36_RMSNorm_"])
def test_inductor_start_accepted_on_cpu_shapes(judge, stem):
    task = load_task(COPIES / f"{stem}.py")
    start = derive(task, "cpu")
    assert isinstance(start, Start), start
    assert "@triton.jit" in start.source and start.kernels
    assert "def call(" in start.output_code  # the output code itself, for a prompt to show
    verdict = judge.verify(start.source, task)
    assert verdict.accepted, describe(verdict)


def test_matmul_reference_has_no_inductor_start_and_says_why():
    """Inductor hands a plain matmul to ATen (extern_kernels.mm): no Triton to start from."""
    result = derive(load_task(COPIES / "2_Standard_matrix_multiplication_.py"), "cpu")
    assert isinstance(result, NoStart)
    assert "extern_kernels.mm" in result.reason and "not all Triton" in result.reason


def test_reference_with_parameters_has_no_inductor_start_and_says_why():
    result = derive(load_task(COPIES / "12_Gemm_Multiply_LeakyReLU.py"), "cpu")
    assert isinstance(result, NoStart)
    assert "parameters or buffers" in result.reason


def test_run_without_key_on_unseeded_kernelbench_problem_makes_accepted_attempts(tmp_path):
    """`kernforge run` with no key on a KernelBench file with no seed: the Inductor start is judged
    first and accepted, and the offline tuner goes on from it."""
    import os
    import sqlite3
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("KERNFORGE_")}
    db = tmp_path / "run.db"
    done = subprocess.run([sys.executable, "-m", "kernforge.cli", "run", "--task", str(COPIES / "19_ReLU.py"),
                           "--max-attempts", "2", "--db", str(db)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT proposer, status FROM attempts ORDER BY id").fetchall()
    assert rows[0] == ("inductor", "accepted"), rows
    assert len(rows) == 2 and rows[1][0] == "offline", rows
