"""Does Nsight Compute profile a process inside the sandbox's isolation? (GPU; ncu on PATH)

    python bench/ncu_sandbox.py [--timeout 40]

Runs one tiny CUDA program under ncu in several ways, one isolation step at a time (plain, a
network namespace alone, a pid namespace alone, a mount namespace alone, another uid, the whole
prefix the process sandbox chose here) and then through a real profiled worker of the judge (the
audit's path); prints how many kernels ncu saw in each, how long it took and ncu's own error
lines. The step whose run hangs or sees no kernel is the one that breaks the profiler.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernforge.sandbox.isolation import for_profiler, mechanism as choose_mechanism
from kernforge.verifier import ncu

PROGRAM = "import torch; x = torch.ones(1024, device='cuda'); torch.cuda.nvtx.range_push('kernforge-profile'); " \
          "y = (x * 2).sum(); torch.cuda.synchronize(); torch.cuda.nvtx.range_pop(); print('ok', y.item())"


def attempt(label: str, prefix: list[str], timeout: float) -> None:
    exe = ncu.available()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "ncu.csv"
        cmd = list(ncu.command(exe, log)) + prefix + [sys.executable, "-c", PROGRAM]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            out = proc.stdout[-300:] + proc.stderr[-600:]
        except subprocess.TimeoutExpired as err:
            out = f"timed out after {timeout:.0f} s; " + str(err.stdout or b"")[-200:] + str(err.stderr or b"")[-400:]
        text = log.read_text(errors="replace") if log.exists() else ""
    launches = ncu.parse(text)
    errors = [line for line in text.splitlines() if "ERROR" in line or "WARNING" in line][:5]
    print(f"{label} ({time.perf_counter() - t0:.1f} s): {len(launches)} kernels {[x.name[:60] for x in launches][:3]}; "
          f"errors {errors}; output {out!r}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=40.0)
    args = parser.parse_args()
    if ncu.available() is None:
        print("ncu is not on PATH")
        return
    attempt("plain", [], args.timeout)
    if shutil.which("unshare"):
        for flags in (["--net"], ["--pid", "--fork"], ["--mount"], ["--net", "--pid", "--fork", "--mount"]):
            attempt("unshare " + " ".join(flags), ["unshare", *flags, "--"], args.timeout)
    if shutil.which("setpriv"):
        attempt("another uid", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"], args.timeout)
    mech = choose_mechanism("strict")
    print("mechanism:", mech.name, mech.detail, list(mech.command), flush=True)
    if mech.name == "namespaces":
        attempt("namespaces", list(mech.command) + ["--"], args.timeout)
        profiled = for_profiler(mech)
        if profiled.name == "namespaces":
            attempt("namespaces for a profiler", list(profiled.command) + ["--"], args.timeout)
    from kernforge.loop import evaluate
    from kernforge.loop.evaluate import open_judge
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.judge import JudgeOptions

    evaluate.PROFILED_START_S = 2 * args.timeout  # a hung profiled worker costs this much device time, not 120 s
    task = load_task("rms_norm")
    t0 = time.perf_counter()
    with open_judge("cuda:0", options=JudgeOptions(device="cuda:0", baselines=False, time_shapes="largest")) as judge:
        profile = judge.profile(task.seed_source, task)
    print(f"judge.profile ({time.perf_counter() - t0:.1f} s):", profile.ran, profile.note, profile.per_call_us,
          list(profile.to_dict()["kernels"])[:3], flush=True)


if __name__ == "__main__":
    main()
