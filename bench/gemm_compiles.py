"""How many times one verdict compiles the Inductor start's GEMM, per KernelBench GEMM problem.

Triton compiles a kernel afresh for each pattern of its integer arguments (a multiple of 16, equal
to 1, or neither) and each set of its constexprs; the start's GEMM takes 1-3 s per compile. This
replays the GEMM launcher (loop/inductor_gemm.py) on meta tensors at each problem's public and
hidden shapes (its operands as the start passes them: a Linear's weight transposed, its bias),
records every launch without running it, and counts the distinct compiles of ``_kf_gemm`` and
``_kf_gemm_any`` two ways:

* all specialised: every call through ``_kf_gemm``, as a start did before its dynamic path
  launched the general kernel (with today's ``TILE_K``, one value where K is not split: the code
  before that compiled one more for 3_Batched_matrix_multiplication);
* the start's paths: the timed (public) shape through ``_kf_gemm``, every hidden one through
  ``_kf_gemm_any`` (``general=True``).

A verdict also checks one shape drawn for it alone, not counted here. The split-K sum kernel
(``_kf_gemm_sum``, a short compile) is not counted either.

Usage: python bench/gemm_compiles.py [PROBLEM_FILE ...]   (default: the GEMMs of bench/kbrun.sh's set)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # the kernels are only recorded; the interpreter needs no GPU to build them
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the folder holding the kernforge checkout

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernforge.loop import inductor_gemm  # noqa: E402
from kernforge.tasks.loader import load_task  # noqa: E402

PROBLEMS = Path(__file__).resolve().parent / "kernelbench" / "problems"
DEFAULT = ["level1/1_Square_matrix_multiplication_.py", "level1/2_Standard_matrix_multiplication_.py",
           "level1/3_Batched_matrix_multiplication.py", "level1/4_Matrix_vector_multiplication_.py"] + [
    f"level2/{n}" for n in ("9_Matmul_Subtract_Multiply_ReLU.py", "12_Gemm_Multiply_LeakyReLU.py",
                            "14_Gemm_Divide_Sum_Scaling.py", "29_Matmul_Mish_Mish.py", "40_Matmul_Scaling_ResidualAdd.py",
                            "45_Gemm_Sigmoid_LogSumExp.py", "53_Gemm_Scaling_Hardtanh_GELU.py", "56_Matmul_Sigmoid_Sum.py",
                            "59_Matmul_Swish_Scaling.py", "63_Gemm_ReLU_Divide.py", "68_Matmul_Min_Subtract.py")]


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def calls(stem: str, sizes: dict) -> list[tuple]:
    """The GEMM calls (a, b, bias or None) one forward of problem ``stem`` makes at ``sizes``."""
    g = sizes.get
    if stem.startswith("1_"):
        return [(_meta(g("N"), g("N")), _meta(g("N"), g("N")), None)]
    if stem.startswith("2_"):
        return [(_meta(g("M"), g("K")), _meta(g("K"), g("N")), None)]
    if stem.startswith("3_"):
        return [(_meta(g("batch_size"), g("m"), g("k")), _meta(g("batch_size"), g("k"), g("n")), None)]
    if stem.startswith("4_"):
        return [(_meta(g("M"), g("K")), _meta(g("K"), 1), None)]
    batch, width = g("batch_size"), g("in_features") or g("input_size")
    out = g("out_features") or g("hidden_size")
    if stem.startswith("14_"):  # torch.matmul(x, weight.T), no bias
        return [(_meta(batch, width), _meta(out, width).t(), None)]
    linears = [(width, out)] + ([(out, g("output_size"))] if stem.startswith("45_") else [])
    return [(_meta(batch, i), _meta(o, i).t(), _meta(o)) for i, o in linears]


def _pattern(value: int) -> str:
    return "1" if value == 1 else "D" if value % 16 == 0 else "-"


def compiles(task, stem: str, paths: bool) -> int:
    """Distinct compiles of the GEMM over the task's public and hidden shapes; ``paths``: hidden
    shapes take the general kernel, as a start with a static path does."""
    seen: set = set()

    class Record:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **meta):
                ints = "".join(_pattern(a) for a in args if isinstance(a, int) and not isinstance(a, bool))
                constexprs = tuple(sorted((k, v) for k, v in meta.items() if k not in ("num_warps", "num_stages")))
                seen.add((self.name, constexprs, "any" if self.name == "_kf_gemm_any" else ints))
            return launch

    space = {"torch": torch, "triton": triton, "tl": tl}
    exec(compile(inductor_gemm.source("cuda"), "kf_gemm", "exec"), space)
    for name in ("_kf_gemm", "_kf_gemm_any", "_kf_gemm_sum"):
        space[name] = Record(name)
    gemm = space[inductor_gemm.LAUNCHER]
    shapes = [(s, False) for s in task.shapes("cuda", hidden=False)] + [(s, True) for s in task.shapes("cuda", hidden=True)]
    for shape, hidden in shapes:
        for a, b, bias in calls(stem, shape.as_dict()):
            out = torch.empty(a.shape[:-1] + (b.shape[-1],), device="meta")
            if bias is None:
                gemm(a, b, out, general=paths and hidden)
            else:
                gemm(a, b, out, bias, alpha=1, beta=1, general=paths and hidden)
    return len([k for k in seen if k[0] != "_kf_gemm_sum"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", help="KernelBench GEMM problem files (default: bench/kbrun.sh's GEMMs)")
    args = parser.parse_args()
    files = [Path(p) for p in args.problems] or [PROBLEMS / p for p in DEFAULT]
    print(f"{'problem':<36} {'shapes':>7} {'all specialised':>16} {'start paths':>12}")
    before = after = 0
    for path in files:
        task = load_task(str(path))
        stem = path.stem
        n_public, n_hidden = len(list(task.shapes("cuda", hidden=False))), len(list(task.shapes("cuda", hidden=True)))
        old, new = compiles(task, stem, paths=False), compiles(task, stem, paths=True)
        before, after = before + old, after + new
        print(f"{stem:<36} {f'{n_public}+{n_hidden}':>7} {old:>16} {new:>12}")
    print(f"{'all':<36} {'':>7} {before:>16} {after:>12}")


if __name__ == "__main__":
    main()
