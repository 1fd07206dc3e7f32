"""KernelBench candidates (bench/kernelbench/candidates/) through the real judge on the CPU.

Each problem in bench/kernelbench/problems/ has a verbatim copy in tests/kernelbench/ with a side
file of small CPU shapes (``NAME.meta.py``): the originals' sizes are for an H200. The judge runs
a handful of the quickest candidates under the Triton interpreter, on every public and hidden CPU
shape; ``python bench/kernelbench.py --cpu`` judges all of them the same way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernforge.tasks.loader import load_task
from kernforge.verifier.verdict import describe

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "bench" / "kernelbench" / "problems"
CANDIDATES = ROOT / "bench" / "kernelbench" / "candidates"
COPIES = Path(__file__).resolve().parent / "kernelbench"

ORIGINALS = sorted(PROBLEMS.glob("level*/*.py"))
#: the problems with a hand-written candidate (the others are for the offline benchmark run, which
#: starts from TorchInductor's kernels: bench/kernelbench/README.md)
WITH_CANDIDATES = [p for p in ORIGINALS if (CANDIDATES / p.name).is_file()]

#: quick under the interpreter, and between them an elementwise op, a row softmax with a
#: multi-block row, two dim-reductions (one over every reduce_dim), a fused GEMM epilogue and a
#: GEMM whose bias shape the file computes from out_features (``bias_shape = (out_features,)``)
JUDGED = ["19_ReLU", "23_Softmax", "36_RMSNorm_", "47_Sum_reduction_over_a_dimension", "63_Gemm_ReLU_Divide",
          "76_Gemm_Add_ReLU"]


@pytest.fixture(scope="module")
def judge(cpu_judge):
    return cpu_judge  # conftest's, shared with the other modules that only ask for verdicts


@pytest.mark.parametrize("stem", JUDGED)
def test_candidate_accepted_on_cpu_shapes(judge, stem):
    task = load_task(COPIES / f"{stem}.py")
    verdict = judge.verify((CANDIDATES / f"{stem}.py").read_text(), task)
    assert verdict.accepted, describe(verdict)


def test_hidden_shapes_reach_past_one_block(judge):
    """The side files matter: a softmax that reads only the first BLOCK of each row passes the
    public shape and is rejected on the hidden one whose rows take two blocks."""
    honest = (CANDIDATES / "23_Softmax.py").read_text()
    one_block = honest.replace("for start in range(0, R, BLOCK):", "for start in range(0, BLOCK, BLOCK):")
    assert one_block != honest
    verdict = judge.verify(one_block, load_task(COPIES / "23_Softmax.py"))
    assert verdict.status.value == "incorrect", describe(verdict)
    assert "hidden shape batch_size=3 dim=5000" in verdict.reason, verdict.reason


@pytest.mark.parametrize("original", WITH_CANDIDATES, ids=[f"{p.parent.name}/{p.stem}" for p in WITH_CANDIDATES])
def test_a_problem_with_a_candidate_has_a_verbatim_cpu_copy(original):
    copy = COPIES / original.name
    assert copy.read_bytes() == original.read_bytes(), f"{copy} differs from {original}: copies stay verbatim"
    task = load_task(copy)
    assert task.cpu_public_shapes and task.cpu_hidden_shapes
    assert task.cpu_public_shapes != task.public_shapes, "the CPU copy must not run the H200 sizes"


def test_every_cpu_copy_is_a_verbatim_problem():
    """The small-shape copies the CPU tests judge are the problems' own files, candidate or not."""
    by_name = {p.name: p for p in ORIGINALS}
    copies = [c for c in sorted(COPIES.glob("*.py")) if not c.name.endswith(".meta.py")]
    assert len(copies) >= len(WITH_CANDIDATES) == 32
    for copy in copies:
        assert copy.name in by_name, f"{copy.name} is no problem of {PROBLEMS}"
        assert copy.read_bytes() == by_name[copy.name].read_bytes(), f"{copy} differs from its problem"


def test_candidates_are_three_layer_and_triton():
    """Kernel, launcher, ModelNew: every candidate has its own @triton.jit kernel and a
    ModelNew, and no candidate is left without a problem."""
    stems = {p.stem for p in ORIGINALS}
    for candidate in sorted(CANDIDATES.glob("*.py")):
        source = candidate.read_text()
        assert candidate.stem in stems, f"{candidate.name} has no problem in {PROBLEMS}"
        assert "@triton.jit" in source and re.search(r"^class ModelNew\(nn\.Module\):", source, re.M), candidate.name
