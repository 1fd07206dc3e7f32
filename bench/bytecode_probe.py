"""What a candidate's worker spends importing its preload (torch, Triton, the harness) from
source, against reading the bytecode sandbox/bytecode.py compiles beside the sources.

A candidate's worker writes no bytecode. On an install without any (uv's default, the H200's
torch) it compiled every module it imports in every start. "from source" here is exactly that:
the import with an empty pycache prefix, which makes Python ignore the bytecode beside the
sources. "bytecode" reads the bytecode beside them, which this install has (pip writes it) or
``compile_missing`` wrote. Also said: how many of the preload's modules lack bytecode beside
their sources here, and what compiling them took.

Usage: python bench/bytecode_probe.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the folder holding the kernforge checkout

PRELOAD = "import torch, triton, kernforge.verifier.harness"


def _timed(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", PRELOAD], env=env, check=True, timeout=300)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch  # noqa: F401  (the judge's process has them imported when a judge opens)
    import triton  # noqa: F401

    from kernforge.sandbox import bytecode

    sources = bytecode.imported_sources()
    lacking = [s for s in sources if not bytecode.beside(s).exists()]
    started = time.perf_counter()
    roots = bytecode.compile_missing()
    compile_s = time.perf_counter() - started
    print(f"{len(sources)} modules of {', '.join(bytecode.PACKAGES)} imported here; {len(lacking)} lacked bytecode beside "
          f"their sources; compile_missing compiled {len(roots)} folder(s) in {compile_s:.1f} s")
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    rows = []
    with tempfile.TemporaryDirectory() as empty:
        for name, env in (("from source", base | {"PYTHONPYCACHEPREFIX": empty}), ("bytecode", base)):
            _timed(env)  # the page cache warm for both
            times = [_timed(env) for _ in range(args.repeats)]
            rows.append((name, statistics.median(times), min(times), max(times)))
    print(f"\n{'worker preload':<14} {'median s':>9} {'min s':>7} {'max s':>7}   ({PRELOAD}; {args.repeats} runs, {os.cpu_count()} cores)")
    for name, median, low, high in rows:
        print(f"{name:<14} {median:>9.2f} {low:>7.2f} {high:>7.2f}")
    print(f"saved per worker start: {rows[0][1] - rows[1][1]:.2f} s")


if __name__ == "__main__":
    main()
