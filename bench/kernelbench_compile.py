"""Compile every Triton kernel a KernelBench candidate launches for a GPU target, on a machine
without a GPU: a check that the candidates will build on the H200 before the GPU bench runs.

The Triton interpreter (what the CPU judge runs) is lenient where the compiler is not: it reads
module globals that the compiler refuses unless they are ``tl.constexpr``, and it ignores
``input_precision``. So each candidate's forward runs once under the interpreter at its CPU
public shape (tests/kernelbench/) while every launch is recorded (kernel, argument types,
constexprs, num_warps, num_stages); then, in this process without the interpreter, each
recorded launch is compiled to a cubin for the target with Triton's own ptxas.

    python bench/kernelbench_compile.py                    # every candidate, sm_90 (H100/H200)
    python bench/kernelbench_compile.py --problems 23_Softmax --arch 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kernelbench import CPU_COPIES, problems_with_candidates  # noqa: E402

#: the most dynamic shared memory one block may use on sm_90 (227 KiB)
SHARED_LIMIT = 232448
TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
                   "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}


def record(candidate: Path, task_file: Path) -> list[dict]:
    """Run under TRITON_INTERPRET=1 (call this in a child process): every launch of one forward."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from kernforge.tasks import runtime
    from kernforge.tasks.loader import load_task

    launches: list[dict] = []
    original = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        bound = dict(zip(self.arg_names, args)) | {k: v for k, v in kwargs.items() if k in self.arg_names}
        params = {}
        for name, value in bound.items():
            if isinstance(value, torch.Tensor):
                params[name] = ["ptr", TORCH_TO_TRITON[str(value.dtype).removeprefix("torch.")]]
            else:  # ints, floats, bools: typed at compile time, or constexpr values there
                params[name] = ["value", value]
        options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        launches.append({"kernel": self.fn.__name__, "params": params, "options": options})
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording
    task = load_task(task_file)
    shape = task.cpu_public_shapes[0]
    init = runtime.make_init_inputs(task, shape)
    model = runtime.build_model(runtime.load_module(candidate).ModelNew, init, 0, "cpu")
    model(*runtime.make_inputs(task, shape, "default", 0, "cpu"))
    return launches


def _scalar_type(value) -> str:
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    return "fp32"


def compile_launches(candidate: Path, launches: list[dict], arch: int) -> list[str]:
    """Compile each distinct launch for ``cuda:arch``; the errors, one line each."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernforge.tasks.runtime import load_module

    module = load_module(candidate, fresh=True)
    errors, seen = [], set()
    for launch in launches:
        key = json.dumps(launch, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        kernel = getattr(module, launch["kernel"])
        signature, constexprs = {}, {}
        for param in kernel.params:
            kind, value = launch["params"][param.name]
            if param.is_constexpr:
                signature[param.name], constexprs[param.name] = "constexpr", value
            elif kind == "ptr":
                signature[param.name] = f"*{value}"
            else:
                signature[param.name] = _scalar_type(value)
        try:
            compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32),
                                      options=launch["options"])
        except Exception as err:  # a compiler error of any kind is this check's finding
            errors.append(f"{launch['kernel']}: {type(err).__name__}: {' '.join(str(err).split())[-300:]}")
            continue
        # shared memory is only checked against the device when a kernel is loaded: check it here
        if compiled.metadata.shared > SHARED_LIMIT:
            errors.append(f"{launch['kernel']}: needs {compiled.metadata.shared} B of shared memory, "
                          f"more than the {SHARED_LIMIT} B an H100/H200 block may have")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="*", default=None, help="problem stems; default: all with a candidate")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--record", nargs=2, metavar=("CANDIDATE", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.record:  # the child: interpreter on
        print(json.dumps(record(Path(args.record[0]), Path(args.record[1]))))
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    failed = 0
    selected = problems_with_candidates(args.problems)
    for key, problem, candidate in selected:
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--record", str(candidate), str(CPU_COPIES / problem.name)],
                               env=env, capture_output=True, text=True)
        if child.returncode:
            failed += 1
            print(f"{key}: FAILED to run under the interpreter: {child.stderr.strip().splitlines()[-1:]}")
            continue
        launches = json.loads(child.stdout.strip().splitlines()[-1])
        errors = compile_launches(candidate, launches, args.arch)
        kernels = sorted({launch["kernel"] for launch in launches})
        status = "ok" if not errors else "FAILED"
        failed += bool(errors)
        print(f"{key}: {status}, {len(kernels)} kernel(s) compiled for sm_{args.arch} "
              f"({', '.join(kernels)}) in {time.perf_counter() - t0:.1f} s")
        for line in errors:
            print(f"    {line}")
    print(f"compiled {len(selected) - failed}/{len(selected)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
