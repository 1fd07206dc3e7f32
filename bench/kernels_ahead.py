"""What compiling a candidate's Triton kernels ahead saves its verdict (issue #17), per task: each
built-in seed compiled ahead at the public shapes by a sandboxed worker (verifier/triton_ahead.py,
through a GPU judge's pool), then the seed's first call at each public shape timed in two fresh
processes, one with an empty Triton cache and one with the files written into it as the verdict's
worker writes them (harness._kernels_ahead). GPU only.

    python bench/kernels_ahead.py                          # every built-in task
    python bench/kernels_ahead.py --tasks rms_norm softmax
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILTIN = Path(__file__).resolve().parent.parent / "tasks" / "builtin"

#: the child: import the seed from a file, call it once per public shape on real inputs, print
#: each first call's seconds (compile included) as JSON
CHILD = r"""
import json, os, sys, time, importlib.util
import torch
from pathlib import Path
from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier import harness
task = load_task(sys.argv[1])
files = json.loads(Path(sys.argv[2]).read_text())
harness._kernels_ahead(files)
path = Path(sys.argv[3])
spec = importlib.util.spec_from_file_location("kernforge_candidate", path)
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
torch.empty(1, device="cuda"); torch.cuda.synchronize()
walls = []
for shape in task.shapes("cuda", hidden=False):
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x
              for x in runtime.make_inputs(task, shape, task.distributions[0], 0, "cuda")]
    model = runtime.build_model(module.ModelNew, runtime.make_init_inputs(task, shape), 0, "cuda")
    t0 = time.perf_counter(); model(*inputs); torch.cuda.synchronize(); walls.append(time.perf_counter() - t0)
print(json.dumps(walls))
"""


def first_calls(name: str, files: dict[str, str], seed: Path) -> list[float]:
    """The seed's first call at each public shape, in a fresh process with a fresh Triton cache
    holding ``files``."""
    with tempfile.TemporaryDirectory() as cache, tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(files, f)
        f.close()
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CHILD, name, f.name, str(seed)], env=env, capture_output=True,
                             text=True, timeout=300)
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=sorted(p.name for p in BUILTIN.iterdir() if (p / "seed.py").exists()))
    args = parser.parse_args()
    from kernforge.loop.evaluate import open_judge
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import triton_ahead

    rows = []
    with open_judge("cuda:0", pool_size=1) as judge:
        for name in args.tasks:
            task = load_task(name)
            # no warm worker kept aside for verdicts: this bench makes none beside it
            source = task.seed_source or ""
            ahead = triton_ahead.Ahead(judge.candidates, judge.gate, source, task, judge.worker_device, spare=0) \
                if triton_ahead.wanted(source) else None
            t0 = time.perf_counter()
            files = ahead.run() if ahead is not None else {}
            ahead_s = time.perf_counter() - t0
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(task.seed_source or "")
            cold = first_calls(name, {}, Path(f.name))
            warm = first_calls(name, files, Path(f.name))
            os.unlink(f.name)
            rows.append((name, ahead.shapes if ahead else 0, len(files), sum(len(v) for v in files.values()) * 3 // 4,
                         ahead_s, sum(cold), sum(warm)))
            launchers = sum(1 for n in files if n.endswith(".so"))
            print(f"{name}: ahead {ahead_s:.2f} s ({ahead.outcome if ahead else 'not compiled ahead'}; {launchers} launcher(s)), "
                  f"first calls cold {[round(w, 3) for w in cold]} with files {[round(w, 3) for w in warm]}", flush=True)
    print(f"\n{'task':24s} {'shapes':>6s} {'files':>6s} {'KiB':>7s} {'ahead s':>8s} {'first calls cold s':>19s} {'with files s':>13s}")
    for name, shapes, n, size, ahead_s, cold_s, warm_s in rows:
        print(f"{name:24s} {shapes:6d} {n:6d} {size / 1024:7.0f} {ahead_s:8.2f} {cold_s:19.3f} {warm_s:13.3f}")


if __name__ == "__main__":
    main()
