"""Does Nsight Compute profile a process inside the sandbox's isolation? (GPU; ncu on PATH)

    python bench/ncu_sandbox.py

Runs one tiny CUDA program three ways: plain, under the isolation prefix the process sandbox
chose here (namespaces or bwrap), and through a real profiled worker of the judge (the audit's
path); prints how many kernels ncu saw in each and ncu's own error lines.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from kernforge.sandbox.isolation import mechanism as choose_mechanism
from kernforge.verifier import ncu

PROGRAM = "import torch; x = torch.ones(1024, device='cuda'); torch.cuda.nvtx.range_push('kernforge-profile'); " \
          "y = (x * 2).sum(); torch.cuda.synchronize(); torch.cuda.nvtx.range_pop(); print('ok', y.item())"


def attempt(label: str, prefix: list[str]) -> None:
    exe = ncu.available()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "ncu.csv"
        cmd = list(ncu.command(exe, log)) + prefix + [sys.executable, "-c", PROGRAM]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            out = proc.stdout[-300:] + proc.stderr[-600:]
        except subprocess.TimeoutExpired:
            out = "timed out after 120 s"
        text = log.read_text(errors="replace") if log.exists() else ""
    launches = ncu.parse(text)
    errors = [line for line in text.splitlines() if "ERROR" in line or "WARNING" in line][:5]
    print(f"{label}: {len(launches)} kernels {[x.name[:60] for x in launches][:3]}; errors {errors}; output {out!r}", flush=True)


def main() -> None:
    if ncu.available() is None:
        print("ncu is not on PATH")
        return
    attempt("plain", [])
    mech = choose_mechanism("strict")
    print("mechanism:", mech.name, mech.detail, list(mech.command))
    if mech.name == "namespaces":
        attempt("namespaces", list(mech.command) + ["--"])
    from kernforge.loop.evaluate import open_judge
    from kernforge.tasks.loader import load_task
    from kernforge.verifier.judge import JudgeOptions

    task = load_task("rms_norm")
    with open_judge("cuda:0", options=JudgeOptions(device="cuda:0", baselines=False, time_shapes="largest")) as judge:
        profile = judge.profile(task.seed_source, task)
    print("judge.profile:", profile.ran, profile.note, profile.per_call_us, list(profile.to_dict()["kernels"])[:3])


if __name__ == "__main__":
    main()
