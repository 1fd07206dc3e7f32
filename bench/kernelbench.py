"""KernelBench benchmark: every problem in bench/kernelbench/problems/ that has a candidate in
bench/kernelbench/candidates/ (same file stem), judged by the real judge on the ORIGINAL problem
file at its default sizes, with PyTorch eager and torch.compile of the reference timed beside it
on the same GPU.

    python bench/kernelbench.py                              # every problem with a candidate, GPU 0
    python bench/kernelbench.py --problems 19_ReLU 23_Softmax --json out.json
    python bench/kernelbench.py --cpu                        # the CPU-sized copies, interpreter

Per problem: the verdict (status, and the reason of a rejection), the candidate's time of record
at the default shape (us, the judge's trusted clock), PyTorch eager and torch.compile (us), the
speedups over both, and the time to the verdict (s; it includes measuring the two baselines,
torch.compile's compilation among them). Checks still cover every public and hidden shape; only
the timing is restricted to the largest public shape (the default one), so a whole run stays
within minutes. The default sizes are KernelBench's own and large (19_ReLU moves 6.4 GB
per call): this needs an H100/H200-class GPU.

``--cpu`` judges the copies in tests/kernelbench/ instead (verbatim copies with side files of
small CPU shapes) under the Triton interpreter: correctness only, no times or baselines.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernforge.loop.evaluate import open_judge, visible_gpus
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import load_task
from kernforge.verifier.judge import JudgeError, JudgeOptions
from kernforge.verifier.verdict import Verdict

HERE = Path(__file__).resolve().parent
PROBLEMS = HERE / "kernelbench" / "problems"
CANDIDATES = HERE / "kernelbench" / "candidates"
CPU_COPIES = HERE.parent / "tests" / "kernelbench"


def problems_with_candidates(names: list[str] | None = None) -> list[tuple[str, Path, Path]]:
    """(level/stem, problem file, candidate file) for every problem that has a candidate, by
    level then KernelBench number. ``names`` keeps only those given as ``stem`` or ``level/stem``."""
    found = []
    for problem in PROBLEMS.glob("level*/*.py"):
        candidate = CANDIDATES / problem.name
        if candidate.is_file():
            found.append((f"{problem.parent.name}/{problem.stem}", problem, candidate))
    found.sort(key=lambda item: (item[0].split("/")[0], int(item[1].stem.split("_")[0])))
    if names:
        wanted = set(names)
        unknown = wanted - {key for key, _, _ in found} - {p.stem for _, p, _ in found}
        if unknown:
            raise SystemExit(f"no problem with a candidate named {sorted(unknown)}; "
                             f"known: {' '.join(p.stem for _, p, _ in found)}")
        found = [item for item in found if item[0] in wanted or item[1].stem in wanted]
    return found


def row_of(key: str, verdict: Verdict, seconds: float) -> dict:
    """One table row: the verdict and the timed (largest public) shape's figures."""
    row: dict = {"problem": key, "status": verdict.status.value, "verdict_s": round(seconds, 2)}
    if not verdict.accepted:
        row["reason"] = verdict.reason
    timed = next((s for s in verdict.shapes if not s.hidden and s.time_us is not None), None)
    if timed is not None:
        row.update(shape=timed.label, timing=timed.timing, time_us=timed.time_us, eager_us=timed.eager_us,
                   compile_us=timed.compile_us, speedup_eager=timed.speedup_eager,
                   speedup_compile=timed.speedup_compile, max_abs_err=timed.max_abs_err)
    if getattr(verdict, "flags", ()):
        row["flags"] = list(verdict.flags)
    # every shape the verdict checked or timed (the hidden ones' sizes say where a long verdict went)
    row["shapes"] = [{"shape": s.label, "hidden": s.hidden, "time_us": s.time_us} for s in verdict.shapes]
    phases = (verdict.environment or {}).get("phase_seconds") or {}
    if phases:  # where the verdict's time went, the longest steps first
        row["phases"] = dict(phases)
    return row


def judge_all(device: str, selected: list[tuple[str, Path, Path]], task_file, out: Path | None = None) -> list[dict]:
    """Judge every selected problem in turn; the rows so far are written to ``out`` after each
    one, so a run cut short still leaves them."""
    options = JudgeOptions(time_shapes="largest", baselines=device != "cpu",
                           cache_dir=Path(tempfile.mkdtemp(prefix="kf-kernelbench-cache-")))
    console = _console()
    rows = []
    with open_judge(device, pool_size=2, options=options) as judge:
        if device != "cpu":
            console.print(f"device {device}: {judge.environment().get('gpu')}; measured ceilings {judge.ceilings()}")
        for key, problem, candidate in selected:
            t0 = time.perf_counter()
            try:
                verdict = judge.verify(candidate.read_text(), load_task(task_file(problem)))
            except (JudgeError, TaskError) as err:  # the reference or the task failed, not the candidate
                rows.append({"problem": key, "status": "judge_error", "reason": str(err),
                             "verdict_s": round(time.perf_counter() - t0, 2)})
            else:
                rows.append(row_of(key, verdict, time.perf_counter() - t0))
            row = rows[-1]
            reason = f": {row['reason']}" if "reason" in row else ""
            figures = " ".join(f"{k}={row[k]:.4g}" for k in ("time_us", "eager_us", "compile_us") if row.get(k))
            phases = " ".join(f"{k} {v:.1f}s" for k, v in list(row.get("phases", {}).items())[:6])
            console.print(f"{key}: {row['status']} in {row['verdict_s']} s {figures}{reason}"
                          + (f" (steps: {phases})" if phases else ""), soft_wrap=True)
            if out is not None:
                write_rows(out, device, rows)
    return rows


def write_rows(out: Path, device: str, rows: list[dict]) -> None:
    out.write_text(json.dumps({"device": device, "rows": rows}, indent=1, default=str))


def _console() -> Console:
    # a pipe or a log file gets a wide table rather than 80 columns of wrapped names
    return Console() if sys.stdout.isatty() else Console(width=200)


def print_table(rows: list[dict], device: str) -> None:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    title = ("KernelBench candidates at their default shape" if device != "cpu"
             else "KernelBench candidates, CPU-sized copies (interpreter: correctness only)")
    table = Table(title=f"{title} on {device}")
    # the interpreter's times are its wall clock and never compared: show the error instead
    timed = ("us", "eager us", "compile us", "x eager", "x compile") if device != "cpu" else ("max abs err",)
    for col in ("problem", "verdict", *timed, "verdict s"):
        table.add_column(col, justify="left" if col in ("problem", "verdict") else "right")
    for r in rows:
        verdict = r["status"] if "reason" not in r else f"{r['status']}: {r['reason'][:80]}"
        if device == "cpu":
            figures = [f(r.get("max_abs_err"), ".2g")]
        else:
            figures = [f(r.get("time_us"), ".1f"), f(r.get("eager_us"), ".1f"), f(r.get("compile_us"), ".1f"),
                       f(r.get("speedup_eager"), ".2f"), f(r.get("speedup_compile"), ".2f")]
        table.add_row(r["problem"], verdict, *figures, f(r["verdict_s"], ".1f"))
    console = _console()
    console.print(table)
    accepted = sum(r["status"] == "accepted" for r in rows)
    console.print(f"accepted {accepted}/{len(rows)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="*", default=None,
                        help="problem stems (19_ReLU) or level/stem (level1/19_ReLU); default: all with a candidate")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU to judge on (default 0)")
    parser.add_argument("--cpu", action="store_true",
                        help="judge the CPU-sized copies in tests/kernelbench/ under the Triton interpreter")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()

    selected = problems_with_candidates(args.problems)
    if args.cpu:
        device = "cpu"
        rows = judge_all(device, selected, lambda problem: CPU_COPIES / problem.name, args.json)
    else:
        if args.gpu not in visible_gpus():
            raise SystemExit(f"no GPU {args.gpu} here (visible: {visible_gpus() or 'none'}); this bench needs a CUDA "
                             "GPU, and --cpu judges the CPU-sized copies without one")
        device = f"cuda:{args.gpu}"
        rows = judge_all(device, selected, lambda problem: problem, args.json)
    print_table(rows, device)
    if args.json:
        write_rows(args.json, device, rows)


if __name__ == "__main__":
    main()
