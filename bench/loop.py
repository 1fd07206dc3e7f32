"""Loop benchmark: the offline tuner (a fast proposer) drives ``kernforge run`` for N attempts per
task, and the table says how busy the devices were kept and what the search found.

    python bench/loop.py --gpu 0                                  # on the H200
    python bench/loop.py --tasks rms_norm --attempts 3            # on a CPU (Triton interpreter)

Each run writes a fresh archive (a temporary file unless ``--db``), so every candidate is
judged: an archive that already held them would answer from its content-addressed verdicts.

* **device busy** = time inside ``judge.verify`` per device / the pipeline's span (from the
  devices being ready to the last verdict), all devices together. The target with a fast proposer
  is >= 80%: the rest is the loop's own overhead between verdicts (recording, choosing the next
  candidate). A verification that waits for a warm sandbox worker counts as busy (the wait is
  inside ``verify``); ``--pool`` sets how many workers warm up per lane, ``--lanes`` how many
  verdicts a device has in flight (busy: at least one of them inside ``verify``).
* **startup** is the time to a warm judge per device (workers started, reference loaded), once.
* **first verdict** per task: seconds from the run's start to its first recorded verdict (issue
  #17 asks for every task's within 5 minutes from an empty archive).
* **verdicts per device-minute**: ``judge.verify`` calls (candidates and audits) over the devices'
  verifying time; the same over the pipeline's span (idle gaps counted) beside it.
* **vs seed** = the seed kernel's geometric-mean time / the best kernel's, same shapes, same
  device: > 1 means the search improved on the seed. **x eager / x compile** are the best
  kernel's geometric-mean speedups over PyTorch eager and torch.compile (GPU only).
* **times of record** (with ``--db``, or the run's temporary archive): per task, how many of the
  run's public GPU times the guard bounded (at launch-bound sizes, what a batch paid once outgrew
  a tenth of its window), how far their pairs of windows lay apart, and its audits' measured over
  recorded times, with those that did not hold.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from rich.table import Table

from kernforge.archive.store import Archive
from kernforge.loop.budget import Budget
from kernforge.loop.display import PlainDisplay, QuietDisplay, fmt_time, fmt_x, stdout_console
from kernforge.loop.runner import RunSettings, run
from kernforge.verifier.audit import Audit
from kernforge.verifier.verdict import BOUNDED

#: Seeds with launch knobs to tune (a block size, warps and stages), so the tuner has room.
DEFAULT_TASKS = ("gemm_small_m", "softmax", "silu_and_mul")


def _write_stacks_each_minute(path: Path) -> None:
    """Every thread's stack appended to ``path`` each minute, from a Python thread holding the GIL
    (sys._current_frames). Not faulthandler.dump_traceback_later: its watchdog reads the other
    threads' frames without the GIL, and a busy run crashed in it (SIGSEGV mid-dump, 7 minutes
    into a 14-task run on the H100; CPython issues 116008 and 131580 report the same)."""
    def write() -> None:
        while True:
            time.sleep(60)
            names = {t.ident: t.name for t in threading.enumerate()}
            lines = [f"--- {time.strftime('%H:%M:%S')}"]
            for ident, frame in sys._current_frames().items():
                lines.append(f"Thread {names.get(ident, ident)}:")
                lines.extend(line.rstrip() for line in traceback.format_stack(frame))
            with path.open("a") as out:
                out.write("\n".join(lines) + "\n\n")

    path.write_text("")
    threading.Thread(target=write, name="stacks", daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="task names or paths")
    parser.add_argument("--attempts", type=int, default=16, help="attempts per task (the seed's included)")
    parser.add_argument("--gpu", type=int, nargs="*", default=[], help="GPU indices (default: all visible; none: the CPU)")
    parser.add_argument("--pool", type=int, default=None, help="warm sandbox workers per device lane (default loop.devices.GPU_POOL on a GPU, 1 on the CPU)")
    parser.add_argument("--lanes", type=int, default=1, help="verdicts in flight per device (verifier/gate.py)")
    parser.add_argument("--hours", type=float, default=None, help="stop after this long whatever is left")
    parser.add_argument("--db", type=Path, default=None, help="archive to write (default: a fresh temporary file)")
    parser.add_argument("--verbose", action="store_true", help="print a line per attempt")
    parser.add_argument("--json", type=Path, default=None, help="also write the run's result here")
    parser.add_argument("--stacks", type=Path, default=None,
                        help="write every thread's stack here each minute (a run that makes no verdict says where it waits)")
    args = parser.parse_args()
    if args.stacks:
        _write_stacks_each_minute(args.stacks)

    with tempfile.TemporaryDirectory(prefix="kf-bench-loop-") as tmp:
        db = args.db or Path(tmp) / "loop.db"
        settings = RunSettings(tasks=tuple(args.tasks), db=db, offline=True, gpus=tuple(args.gpu),
                               budget=Budget(max_attempts=args.attempts, hours=args.hours), pool_size=args.pool,
                               lanes=args.lanes)
        result = run(settings, PlainDisplay() if args.verbose else QuietDisplay())
        records = _records_table(db, result.run_id) if db.exists() else None
    data = result.to_dict()
    if args.json:
        args.json.write_text(json.dumps(data, indent=2, default=str))

    console = stdout_console()
    tasks = Table(title=f"bench/loop.py: offline tuner, {args.attempts} attempts per task, {args.lanes} lane(s) per device, "
                        f"run {result.status}",
                  title_justify="left")
    for col in ("task", "attempts", "accepted", "rejected", "first verdict", "seed time", "best time", "vs seed",
                "x eager", "x compile", "note"):
        tasks.add_column(col, justify="left" if col in ("task", "rejected", "note") else "right")
    for t in result.tasks:
        rejected = ", ".join(f"{k} {n}" for k, n in t.rejected.most_common()) or "-"
        first = "-" if t.first_verdict_s is None else f"{t.first_verdict_s:.0f} s"
        tasks.add_row(t.name, str(t.attempts), str(t.accepted), rejected, first, fmt_time(t.seed_time_us, t.interpreter),
                      fmt_time(t.best_time_us, t.interpreter), fmt_x(t.vs_seed, 3), fmt_x(t.best_speedup_eager, 3),
                      fmt_x(t.best_score, 3), t.note[:60])
    console.print(tasks)

    devices = Table(title="devices", title_justify="left")
    for col in ("device", "verifications", "verifying", "busy"):
        devices.add_column(col, justify="left" if col == "device" else "right")
    span = result.pipeline_s
    for device in result.devices:
        spent = result.verify_s_per_device.get(device, 0.0)
        devices.add_row(device, str(result.verified_per_device.get(device, 0)), f"{spent:.1f} s",
                        f"{100 * spent / span:.0f}%" if span > 0 else "-")
    console.print(devices)
    judged = sum(result.verified_per_device.values()) + sum(result.audited_per_device.values())
    rate = f"{60 * judged / result.verify_s:.1f}" if result.verify_s > 0 else "-"
    rate_span = f"{60 * judged / (span * len(result.devices)):.1f}" if span > 0 and result.devices else "-"
    console.print(f"verdicts {judged} (audits included): {rate} per device-minute verifying, {rate_span} per device-minute of the pipeline")
    busy = "-" if result.busy is None else f"{100 * result.busy:.0f}%"
    console.print(f"attempts {result.attempts}   wall {result.wall_s:.1f} s (startup {result.startup_s:.1f} s, "
                  f"pipeline {span:.1f} s)   device time verifying {result.verify_s:.1f} s   "
                  f"device busy {busy} (target >= 80%)")
    console.print(_rates_table(result.verdict_log))
    console.print(_steps_table(result.verdict_log))
    console.print(ahead_line(result.verdict_log))
    audited, near = sum(t.audits for t in result.tasks), sum(t.near_ties for t in result.tasks)
    console.print(f"would-be bests: {audited} audited; {near} near-tie(s) within the judge's noise of their best, not audited")
    if records is not None:
        console.print(records)
    for note in result.notes:
        console.print(f"note: {note}")


def ahead_line(log: list[dict]) -> str:
    """What the next candidates' Triton kernels compiled ahead came to (verifier/triton_ahead.py):
    of the verdicts that had one, how many got files, the verdicts' statuses, the mean wait."""
    had = [e for e in log if e.get("kind") == "verdict" and "ahead" in e]
    if not had:
        return "kernels compiled ahead: none"
    statuses = collections.Counter(e.get("status", "?") for e in had)
    waited = sum(e.get("steps", {}).get("ahead.wait", 0.0) for e in had) / len(had)
    with_files = sum(1 for e in had if e["ahead"].get("files"))
    line = (f"kernels compiled ahead: {with_files} of {len(had)} verdicts got files "
            f"({', '.join(f'{n} {s}' for s, n in statuses.most_common())}); {waited:.2f} s waited for them a verdict")
    decoys = [e["ahead"].get("decoys") or 0 for e in had]
    if any(decoys):  # decoy shapes' kernels came too (each decoy's compiles done before the verdict began)
        line += f"; {sum(1 for n in decoys if n)} with decoys' ({sum(decoys) / len(had):.1f} decoys a verdict)"
    # why the others got none (no warm worker to spare, a call that failed on meta tensors, ...)
    why = collections.Counter(e["ahead"].get("outcome", "?") for e in had if not e["ahead"].get("files"))
    if why:
        line += "; none for " + ", ".join(f"{n} ({reason})" for reason, n in why.most_common())
    pools = [e["ahead"]["pool"] for e in had if isinstance(e["ahead"].get("pool"), dict)]
    if pools:  # the lane's pool when none was spare: too few warming, or starts too slow for the verdicts?
        ready, starting = (statistics.fmean(p.get(key, 0) for p in pools) for key in ("ready", "starting"))
        start_s = statistics.median_low(p.get("start_ms", 0) for p in pools) / 1000
        steps = [p["start_steps"] for p in pools if isinstance(p.get("start_steps"), dict)]
        told = ""
        if steps:  # the workers' own account of their starts (sandbox/worker.py start_steps), the last such record's
            told = " (" + ", ".join(f"{k} {float(v):.1f}" for k, v in steps[-1].items()) + ")"
        line += f" (the pool then: {ready:.1f} ready, {starting:.1f} starting; a worker's start {start_s:.1f} s{told})"
    audits = [e for e in log if e.get("kind") == "audit" and "ahead" in e]
    if audits:
        line += f"; {sum(1 for e in audits if e['ahead'].get('files'))} of {len(audits)} audits were given their verdict's"
    return line


#: the built-in tasks issue #17 counts as norms and elementwise ops (its target there: 30 verdicts per GPU-minute)
NORM_ELEMENTWISE = ("rms_norm", "fused_add_rms_norm", "rms_norm_fp8_quant", "silu_and_mul", "softmax",
                    "rotary_embedding", "fp8_quant_per_token", "fp8_quant_per_group")


def _rates_table(log: list[dict]) -> Table:
    """Verdicts and audits per group of tasks, with the device seconds each took: verdicts per
    device-minute of verifying, with and without the audits' time (lanes overlap, so a group's
    seconds are the sum of its verifications' own)."""
    table = Table(title="verdicts per device-minute (seconds: each verification's own, summed)", title_justify="left")
    for col in ("tasks", "verdicts", "their s", "audits", "their s", "audits' share", "verdicts/min", "with audits' time"):
        table.add_column(col, justify="left" if col == "tasks" else "right")
    groups = {"all": lambda name: True, "norm & elementwise": lambda name: name in NORM_ELEMENTWISE}
    for label, member in groups.items():
        mine = [e for e in log if member(e["task"])]
        v = [e["seconds"] for e in mine if e["kind"] == "verdict"]
        a = [e["seconds"] for e in mine if e["kind"] != "verdict"]
        both = sum(v) + sum(a)
        table.add_row(label, str(len(v)), f"{sum(v):.0f}", str(len(a)), f"{sum(a):.0f}",
                      f"{100 * sum(a) / both:.0f}%" if both else "-",
                      f"{60 * len(v) / sum(v):.1f}" if v and sum(v) else "-", f"{60 * len(v) / both:.1f}" if both else "-")
    return table


def _steps_table(log: list[dict]) -> Table:
    """Per task: its verdicts, their median length, and the judge's steps that took longest over all of them."""
    table = Table(title="where the verdicts' time went (per task: seconds; steps nest, so they need not add up)",
                  title_justify="left")
    for col in ("task", "verdicts", "audits", "first s", "median s", "checked calls", "ms a call",
                "slowest steps, summed over its verdicts"):
        table.add_column(col, justify="left" if col in ("task", "slowest steps, summed over its verdicts") else "right")
    for task in sorted({e["task"] for e in log}):
        mine = [e for e in log if e["task"] == task]
        verdicts = sorted(e["seconds"] for e in mine if e["kind"] == "verdict")
        steps: dict[str, float] = {}
        for e in mine:
            for name, seconds in e.get("steps", {}).items():
                if ":" not in name:  # a worker's own breakdown nests inside the judge's step
                    steps[name] = steps.get(name, 0.0) + seconds
        top = sorted(steps.items(), key=lambda kv: -kv[1])[:5]
        first = next((e["seconds"] for e in mine if e["kind"] == "verdict"), None)
        calls, each = _checked_calls([e for e in mine if e["kind"] == "verdict"])
        table.add_row(task, str(len(verdicts)), str(len(mine) - len(verdicts)), "-" if first is None else f"{first:.1f}",
                      f"{verdicts[len(verdicts) // 2]:.1f}" if verdicts else "-", calls, each,
                      ", ".join(f"{k} {v:.1f}" for k, v in top))
    return table


def _records_table(db: Path, run_id: int) -> Table | None:
    """Per task, how this run's times of record were reached and whether they held: its accepted
    verdicts' GPU-timed public shapes, how many of them the guard bounded (defences/clock.per_call:
    what a batch paid once outgrew a tenth of its window) and how far their pairs of windows lay
    apart (the median); its audits' times against the verdicts' (measured over recorded, the
    geometric means both verdicts timed) and how many did not hold. None where the run has no
    GPU-timed verdict."""
    with Archive.open(db, readonly=True) as archive:
        shapes = archive.conn.execute(
            "SELECT t.name, m.method, m.spread_pct FROM measurements m JOIN attempts a ON a.id = m.attempt_id"
            " JOIN tasks t ON t.id = a.task_id WHERE a.run_id = ? AND a.accepted = 1 AND a.reuse_of IS NULL"
            " AND m.hidden = 0 AND m.timing IN ('graph', 'eager') AND m.time_us > 0", (run_id,)).fetchall()
        audits = [(name, Audit.from_dict({"passed": bool(passed), "reason": reason, "recorded_us": recorded,
                                          "measured_us": measured, "verdict": json.loads(verdict) if verdict else None,
                                          "details": json.loads(details)}))
                  for name, passed, reason, recorded, measured, verdict, details in archive.conn.execute(
                      "SELECT t.name, u.passed, u.reason, u.recorded_us, u.measured_us, u.verdict, u.details FROM audits u"
                      " JOIN tasks t ON t.id = u.task_id WHERE u.run_id = ?", (run_id,))]
    if not shapes:
        return None
    table = Table(title="times of record (this run's accepted verdicts, public shapes) and their audits",
                  title_justify="left")
    for col in ("task", "shapes timed", "bounded", "pairs apart (median)", "audits", "measured / recorded", "did not hold"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task in sorted({row[0] for row in shapes}):
        mine = [row for row in shapes if row[0] == task]
        spreads = [row[2] for row in mine if row[2] is not None]
        checked = [a for name, a in audits if name == task]
        ratios = sorted(a.measured_us / a.recorded_us for a in checked if a.recorded_us and a.measured_us)
        table.add_row(task, str(len(mine)), str(sum(1 for row in mine if row[1] == BOUNDED)),
                      f"{statistics.median(spreads):.0f}%" if spreads else "-", str(len(checked)),
                      f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else "-",
                      str(sum(1 for a in checked if a.only_slower)))
    return table


def _checked_calls(verdicts: list[dict]) -> tuple[str, str]:
    """The checked calls of a task's verdicts (the median count per verdict), and what one cost the
    checks (their public and hidden groups' seconds over all their calls, ms): with 36-59 calls a
    verdict, their round trips are a large share of it."""
    counted = [e for e in verdicts if e.get("checked_calls")]
    if not counted:
        return "-", "-"
    counts = sorted(e["checked_calls"] for e in counted)
    seconds = sum(e.get("steps", {}).get("checks public", 0.0) + e.get("steps", {}).get("checks hidden", 0.0) for e in counted)
    return str(counts[len(counts) // 2]), f"{1e3 * seconds / sum(counts):.1f}"


if __name__ == "__main__":
    main()
