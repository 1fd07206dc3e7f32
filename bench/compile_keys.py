"""How many Triton compiles a task's seed needs in one verdict's checks, at the public shapes and
at the hidden ones (issue #17): on an H100 the candidate's compiles at each new shape's first
checked call were 0.9 s of a 4.3 s warm verdict (``worker.check:first_calls``). Compiled ahead,
before the verdict, only the public shapes' kernels may be: compiling at a hidden shape would
show the candidate's code that shape before its checks. This counts what that would save.

No GPU and no data: each shape's inputs are meta tensors, and every Triton launch is recorded
instead of compiled, by a key that stands in for Triton's own: the kernel, its constexprs and
the launch's options by value, each tensor argument by its dtype, each integer as 1, a multiple
of 16 or neither. Pointer alignment is left out (the arena aligns every input).

    python bench/compile_keys.py                      # every built-in task
    python bench/compile_keys.py --tasks rms_norm softmax
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from triton.runtime.jit import JITFunction

from kernforge.tasks import draws, runtime
from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape, Task

BUILTIN = Path(__file__).resolve().parent.parent / "tasks" / "builtin"


def _part(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, bool) or not isinstance(value, int):
        return repr(value)
    return "1" if value == 1 else "16n" if value % 16 == 0 else "int"


@contextlib.contextmanager
def _recorded(keys: set[tuple[str, ...]]) -> Iterator[None]:
    """Every Triton launch inside the block adds its key to ``keys`` and runs nothing."""
    run = JITFunction.run

    def record(self: JITFunction, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> None:
        # a constexpr (and a launch option: num_warps, ...) by its value; any other argument by _part
        fixed = {self.arg_names[i] for i, p in enumerate(self.params) if p.is_constexpr}
        named = dict(zip(self.arg_names, args)) | kwargs
        keys.add((self.fn.__name__, *(f"{k}={v!r}" if k in fixed or k not in self.arg_names else f"{k}:{_part(v)}"
                                      for k, v in named.items())))

    JITFunction.run = record
    try:
        yield
    finally:
        JITFunction.run = run


def _seed_class(task: Task) -> Any:
    """The seed's ModelNew, imported from a file (Triton reads its kernels' source there), its
    kernels Triton's compiled ones even where the interpreter is on (the CPU tests)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(task.seed_source or "")
    spec = importlib.util.spec_from_file_location(f"compile_keys_{task.name}", f.name)
    module = importlib.util.module_from_spec(spec)
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        spec.loader.exec_module(module)
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    return module.ModelNew


def keys_at(task: Task, model_class: Any, shape: Shape) -> set[tuple[str, ...]]:
    """The launch keys of one call of the seed at ``shape`` (GPU dtypes, meta tensors)."""
    keys: set[tuple[str, ...]] = set()
    inputs = runtime.meta_inputs(task, shape)
    with torch.device("meta"), torch.no_grad():
        model = runtime.build_model(model_class, runtime.make_init_inputs(task, shape), 0, "meta")
        with _recorded(keys):
            model(*inputs)
    return keys


def count(name: str) -> dict[str, Any]:
    """A task's distinct launch keys at its public shapes, at its hidden ones, and those only hidden."""
    task = load_task(name)
    model_class = _seed_class(task)
    found = {hidden: set().union(*(keys_at(task, model_class, s) for s in task.shapes("cuda", hidden=hidden)))
             for hidden in (False, True)}
    public, hidden = found[False], found[True]
    only_hidden = hidden - public
    return {"task": task.name, "public": len(public), "hidden": len(hidden), "only_hidden": len(only_hidden),
            "ahead_share": len(public) / max(len(public | hidden), 1)}


def left_to_compile(name: str, decoys: list[int], verdicts: int, seed: int = 0) -> dict[int, float]:
    """Per number of decoy shapes compiled ahead beside the public ones (drawn from the task's
    space, tasks/draws.py, independently of the verdict's): the mean number of launch keys a
    verdict's hidden shapes (the fixed ones and one drawn) still compile, over ``verdicts`` draws."""
    task = load_task(name)
    model_class = _seed_class(task)
    rng = random.Random(seed)
    memo: dict[tuple, set[tuple[str, ...]]] = {}

    def keys(shape: Shape) -> set[tuple[str, ...]]:
        if shape.params not in memo:
            memo[shape.params] = keys_at(task, model_class, shape)
        return memo[shape.params]

    public = set().union(*(keys(s) for s in task.shapes("cuda", hidden=False)))
    fixed = set().union(*(keys(s) for s in task.shapes("cuda", hidden=True)))
    left: dict[int, list[int]] = {n: [] for n in decoys}
    for _ in range(verdicts):
        need = fixed | set().union(*(keys(s) for s in draws.draw(task, "cuda", 1, rng)))
        for n in decoys:
            ahead = public.union(*(keys(s) for s in draws.draw(task, "cuda", n, rng))) if n else public
            left[n].append(len(need - ahead))
    return {n: sum(v) / len(v) for n, v in left.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=sorted(p.name for p in BUILTIN.iterdir() if (p / "seed.py").exists()))
    parser.add_argument("--decoys", type=int, nargs="*", default=[],
                        help="also: numbers of decoy shapes drawn ahead, each row the hidden compiles a verdict has left")
    parser.add_argument("--verdicts", type=int, default=20, help="verdicts simulated for --decoys")
    args = parser.parse_args()
    extra = "".join(f" {f'left, {n} decoys':>16s}" for n in args.decoys)
    print(f"{'task':24s} {'public':>7s} {'hidden':>7s} {'only hidden':>12s} {'compilable ahead':>17s}{extra}")
    for name in args.tasks:
        row = count(name)
        left = left_to_compile(name, args.decoys, args.verdicts) if args.decoys else {}
        print(f"{row['task']:24s} {row['public']:7d} {row['hidden']:7d} {row['only_hidden']:12d} {row['ahead_share']:16.0%}"
              + "".join(f" {left[n]:16.1f}" for n in args.decoys))


if __name__ == "__main__":
    main()
