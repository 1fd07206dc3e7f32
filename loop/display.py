"""What a person sees while ``kernforge run`` works, and the summary at the end.

In a terminal: a rich Live table, one row per task (attempts, accepted, cheats caught, rejected,
best time and speedup, tokens and cost) and a footer (wall time, GPU busy %, the proposer). When
stdout is not a terminal (a log file, CI, a pipe): one plain line per attempt. A would-be best is
audited before it counts (search.py): its line says NEW BEST once the audit passed, or that the
audit failed and why (the kernel is demoted, never the best). ``--json``: nothing
while running; the result object at the end. The numbers come from ``TaskStats``, which the
runner updates as verdicts are recorded, and from a ``RunView`` the display asks for.
"""

from __future__ import annotations

import errno
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from kernforge.archive.score import MIN_GAIN
from kernforge.archive.tables import Col, FitTable, fmt_time, fmt_us, fmt_x
from kernforge.verifier.verdict import THREATS, Verdict, printable

__all__ = ["AttemptEvent", "Display", "GuardedDisplay", "LiveDisplay", "PlainDisplay", "QuietDisplay", "RunView", "TaskStats",
           "attempt_line", "fmt_time", "fmt_us", "fmt_x", "make_display", "progress_table", "stdout_console", "summary"]


@dataclass
class TaskStats:
    """One task's counters for this session, and its best kernel (archived or new)."""

    name: str
    attempts: int = 0
    accepted: int = 0
    cheats: int = 0  # verdicts naming a THREATS class
    reused: int = 0
    rejected: Counter = field(default_factory=Counter)  # status -> count
    tokens: int = 0
    cost: float = 0.0
    cost_known: bool = True
    best_attempt: int | None = None
    best_time_us: float | None = None
    best_speedup_eager: float | None = None
    best_score: float | None = None  # geomean speedup vs torch.compile (GPU only)
    #: geomean speedup vs the production kernel library, where it was measured (GPU only)
    best_speedup_library: float | None = None
    best_is_new: bool = False  # found in this run
    seed_time_us: float | None = None
    #: audits of would-be bests made in this run, and how many failed (those kernels were demoted)
    audits: int = 0
    audits_failed: int = 0
    #: verdicts fitter than the best by less than the judge's noise (search.py MIN_GAIN): not audited
    near_ties: int = 0
    note: str = ""
    #: the run judges on the CPU: times are the interpreter's, shown labelled, never compared
    interpreter: bool = False
    #: seconds from this session's start to the task's first verdict in it (None: none yet)
    first_verdict_s: float | None = None

    @property
    def vs_seed(self) -> float | None:
        """How many times faster the best is than the task's seed kernel (same shapes, same device);
        None on the interpreter, whose times are correctness-only figures."""
        if self.seed_time_us and self.best_time_us and not self.interpreter:
            return self.seed_time_us / self.best_time_us
        return None

    def count(self, verdict: Verdict, *, tokens: int, cost: float, cost_known: bool, reused: bool, at_s: float) -> None:
        """One more verdict in this session: ``at_s`` seconds after its start, its proposal's
        ``tokens`` and ``cost``, a reuse of an earlier verdict or not."""
        if self.first_verdict_s is None:
            self.first_verdict_s = at_s
        self.attempts += 1
        self.tokens += tokens
        self.cost += cost
        self.cost_known &= cost_known
        self.reused += reused
        if verdict.accepted:
            self.accepted += 1
        else:
            self.rejected[verdict.status.value] += 1
        self.cheats += verdict.threat is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rejected"] = dict(self.rejected)
        out["vs_seed"] = self.vs_seed
        return out


@dataclass(frozen=True)
class AttemptEvent:
    task: str
    seq: int
    attempt_id: int
    status: str
    threat: int | None
    reused: bool
    proposer: str
    model: str
    time_us: float | None
    speedup_eager: float | None
    new_best: bool
    reason: str
    tokens: int
    cost: float
    verify_s: float | None
    #: ``time_us`` is the interpreter's (labelled, never ranked)
    interpreter: bool = False
    #: the audit of this would-be best: passed, failed (demoted), or None (not audited)
    audit_passed: bool | None = None
    audit_reason: str = ""
    #: why an accepted candidate was timed at some shapes only (verifier/contender.py), or ""
    not_contender: str = ""


@dataclass(frozen=True)
class RunView:
    """What the display reads on each refresh."""

    run_id: int
    proposer: str
    devices: tuple[str, ...]
    elapsed_s: float
    busy: float | None  # fraction of device time spent verifying, all devices together
    tokens: int
    cost: float
    stopping: str | None
    tasks: tuple[TaskStats, ...]


class Display(Protocol):
    def start(self, view: Callable[[], RunView]) -> None: ...
    def attempt(self, event: AttemptEvent) -> None: ...
    def note(self, message: str) -> None: ...
    def stop(self) -> None: ...


class QuietDisplay:
    """No output while running (``--json``, library use); notes are kept for the result."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, view: Callable[[], RunView]) -> None:
        pass

    def attempt(self, event: AttemptEvent) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)

    def stop(self) -> None:
        pass


class GuardedDisplay:
    """A display whose output may vanish: once a write fails because the reader is gone (a closed
    pipe: ``kernforge run | tee log`` and a Ctrl-C that ended ``tee`` too), it goes quiet instead
    of raising into the run."""

    def __init__(self, inner: Display) -> None:
        self.inner = inner
        self.broken = False

    def _call(self, name: str, *args: Any) -> None:
        if self.broken:
            return
        try:
            getattr(self.inner, name)(*args)
        except (BrokenPipeError, ConnectionResetError, ValueError):  # ValueError: a closed file
            self.broken = True

    def start(self, view: Callable[[], RunView]) -> None:
        self._call("start", view)

    def attempt(self, event: AttemptEvent) -> None:
        self._call("attempt", event)

    def note(self, message: str) -> None:
        self._call("note", message)

    def stop(self) -> None:
        try:
            self.inner.stop()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            self.broken = True


class StdoutConsole(Console):
    """rich's Console, except that a reader gone (a closed pipe) is a BrokenPipeError its caller
    handles (a run ends as it would have, with its own exit code) rather than rich's SystemExit(1)."""

    def on_broken_pipe(self) -> None:
        if self.quiet:
            return
        self.quiet = True  # nothing more is written; the interpreter's last flush goes to /dev/null
        stdout_gone()
        raise BrokenPipeError(errno.EPIPE, "the reader of stdout is gone")


def stdout_console() -> Console:
    """The console for stdout. Piped into a file or a log (no terminal, no COLUMNS), tables keep
    their rows whole at 160 columns instead of wrapping at rich's default of 80."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return StdoutConsole()
    return StdoutConsole(width=160)


def attempt_line(e: AttemptEvent) -> str:
    """One attempt as one line of plain text."""
    head = f"[{e.task}] #{e.seq} attempt {e.attempt_id} {e.proposer}{'/' + e.model if e.model and e.model != 'offline' else ''}: "
    if e.status == "accepted" and e.not_contender:
        body = f"accepted, {e.not_contender[:200]}"
    elif e.status == "accepted":
        body = f"accepted {fmt_time(e.time_us, e.interpreter)}" + (f" ({fmt_x(e.speedup_eager)} eager)" if e.speedup_eager else "")
        if e.audit_passed is False:
            body += f"  AUDIT FAILED, demoted (never the best): {e.audit_reason.splitlines()[0][:240] if e.audit_reason else ''}"
        else:
            body += ("  NEW BEST (audit passed)" if e.audit_passed else "  NEW BEST") if e.new_best else ""
            # the proposal's own description (a model's docstring, a tuner's knobs): its words, not a measurement
            body += f"  (proposed as: {e.reason.splitlines()[0][:160]!r})" if e.reason else ""
    else:
        threat = f" #{e.threat} {THREATS.get(e.threat, '')}" if e.threat else ""
        body = f"{e.status}{threat}: {e.reason.splitlines()[0][:160] if e.reason else ''}"
    tail = " (reused an earlier verdict)" if e.reused else ""
    if e.tokens:
        tail += f"  {e.tokens} tok ${e.cost:.4f}"
    if e.verify_s is not None:
        tail += f"  verified in {e.verify_s:.1f}s"
    return printable(head + body + tail)  # names and words from proposals: text, never a control sequence


class PlainDisplay:
    """A line per attempt and per note: for logs and pipes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def start(self, view: Callable[[], RunView]) -> None:
        v = view()
        self._print(f"run {v.run_id}: {v.proposer} on {', '.join(v.devices)}; tasks: {', '.join(t.name for t in v.tasks)}")

    def attempt(self, event: AttemptEvent) -> None:
        self._print(attempt_line(event))

    def note(self, message: str) -> None:
        self._print(message)

    def stop(self) -> None:
        pass

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


#: the run's columns, most important first; ``drop``: which go first when the terminal is narrow
RUN_COLUMNS = (
    Col("task"), Col("attempts", "right"), Col("accepted", "right"), Col("cheats caught", "right", drop=3),
    Col("rejected", wrap=True, drop=5), Col("best time", "right"), Col("x eager", "right", drop=2),
    Col("x compile", "right", drop=1), Col("x library", "right", drop=8), Col("vs seed", "right", drop=4),
)


def progress_table(v: RunView) -> FitTable:
    table = FitTable(RUN_COLUMNS + (Col("tokens", "right", drop=6), Col("cost", "right", drop=7)),
                     title=f"kernforge run {v.run_id}: {v.proposer}", title_justify="left")
    for t in v.tasks:
        rejected = ", ".join(f"{k} {n}" for k, n in t.rejected.most_common(3)) or "-"
        table.add_row(
            t.name + (f"\n[dim]{escape(t.note)}[/]" if t.note else ""), str(t.attempts), str(t.accepted),
            str(t.cheats), rejected, _best(t.best_time_us, t.interpreter, t.best_is_new), fmt_x(t.best_speedup_eager),
            fmt_x(t.best_score), fmt_x(t.best_speedup_library), fmt_x(t.vs_seed), f"{t.tokens:,}", f"${t.cost:.3f}" + ("" if t.cost_known else "+?"),
        )
    busy = "-" if v.busy is None else f"{100 * v.busy:.0f}%"
    footer = (f"{v.elapsed_s:.0f}s on {', '.join(v.devices)}  busy verifying {busy}  "
              f"{v.tokens:,} tokens  ${v.cost:.3f}  (* new best this run)")
    if any(t.interpreter for t in v.tasks):
        footer += f"  {INTERPRETER_NOTE}"
    if v.stopping:
        footer += f"  stopping: {v.stopping}"
    table.caption = footer
    return table


#: why an interpreter run shows no best (what ``kernforge archive best`` says too)
INTERPRETER_NOTE = "interpreter (CPU) runs check correctness only: no best, no speedups"


def _best(time_us: float | None, interpreter: bool, new: bool) -> str:
    if interpreter:
        return "- (interpreter)"
    return fmt_us(time_us) + (" *" if new and time_us is not None else "")


class LiveDisplay:
    """A rich Live table, refreshed a few times a second; notes print above it."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Live | None = None

    def start(self, view: Callable[[], RunView]) -> None:
        self._live = Live(get_renderable=lambda: progress_table(view()), console=self.console,
                          refresh_per_second=4, transient=True)
        self._live.start()

    def attempt(self, event: AttemptEvent) -> None:
        if event.new_best or event.status != "accepted" or event.audit_passed is False:
            style = "green" if event.new_best else ("red" if event.threat or event.audit_passed is False else "yellow")
            self.console.print(Text(attempt_line(event), style=style))

    def note(self, message: str) -> None:
        self.console.print(Text(message, style="cyan"))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def make_display(console: Console, *, quiet: bool) -> Display:
    if quiet:
        return QuietDisplay()
    return LiveDisplay(console) if console.is_terminal else PlainDisplay(console.file)


def summary(result: Mapping[str, Any]) -> Group:
    """The table printed at the end, from ``RunResult.to_dict()``. Its best per task is the one
    ``kernforge archive best`` shows: audited GPU kernels only, never an interpreter verdict."""
    table = FitTable(RUN_COLUMNS + (Col("best attempt", "right"),),
                     title=f"run {result['run_id']} {result['status']}: {result['proposer']}", title_justify="left")
    for t in result["tasks"]:
        rejected = ", ".join(f"{k} {n}" for k, n in sorted(t["rejected"].items(), key=lambda kv: -kv[1])) or "-"
        table.add_row(
            t["name"], str(t["attempts"]), str(t["accepted"]), str(t["cheats"]), rejected,
            _best(t["best_time_us"], t["interpreter"], t["best_is_new"]), fmt_x(t["best_speedup_eager"]),
            fmt_x(t["best_score"]), fmt_x(t.get("best_speedup_library")), fmt_x(t["vs_seed"]), str(t["best_attempt"] or "-"),
        )
    interpreter = any(t["interpreter"] for t in result["tasks"])
    table.caption = ("best time: geometric mean over the shapes of the audited best (as `kernforge archive best`); "
                     "* new best this run; x eager / x compile / x library: geometric-mean speedups; vs seed: the seed's time / "
                     "the best's" + (f"; {INTERPRETER_NOTE}" if interpreter else ""))
    busy = "-" if result["busy"] is None else f"{100 * result['busy']:.0f}%"
    lines: list[Any] = [
        table,
        Text(f"{result['attempts']} attempt(s) in {result['wall_s']:.0f}s; device time verifying "
             f"{result['verify_s']:.0f}s (busy {busy}); {result['tokens']:,} tokens, ${result['cost']:.4f}; "
             f"{result['retries']} LLM retr{'y' if result['retries'] == 1 else 'ies'}, "
             f"{result['llm_failures']} failed request(s)"),
    ]
    audits = sum(t.get("audits", 0) for t in result["tasks"])
    if audits:
        failed = sum(t.get("audits_failed", 0) for t in result["tasks"])
        lines.append(Text(f"{audits} would-be best(s) audited (judged again in a fresh worker on fresh inputs): "
                          f"{audits - failed} passed, {failed} failed and demoted"))
    near = sum(t.get("near_ties", 0) for t in result["tasks"])
    if near:
        lines.append(Text(f"{near} kernel(s) fitter than their task's best by less than {MIN_GAIN:.0%}, the judge's own "
                          "noise: near-ties, kept as parents, neither audited nor a new best"))
    if result.get("stop_reason"):
        lines.append(Text(f"stopped: {result['stop_reason']}"))
    if result.get("unjudged"):
        lines.append(Text(f"{result['unjudged']} proposal(s) left unjudged: the time budget was spent before a device "
                          "was free for them"))
    lines += [Text(f"{t['name']}: {t['note']}") for t in result["tasks"] if t["note"]]
    best = [t for t in result["tasks"] if t["best_attempt"]]
    if best:
        lines.append(Text("best kernels: " + "; ".join(
            f"{t['name']}: kernforge archive show {t['best_attempt']} --db {result['db']}" for t in best)))
    elif interpreter and any(t["accepted"] for t in result["tasks"]):
        lines.append(Text(f"accepted kernels (correct on the interpreter; never a best or an export): "
                          f"kernforge archive sql \"SELECT id, status FROM attempts WHERE run_id = {result['run_id']}\" "
                          f"--db {result['db']}"))
    lines.append(Text(f"resume with: kernforge run --resume {result['run_id']} --db {result['db']}"
                      if result["status"] in ("interrupted", "failed") else f"archive: {result['db']}"))
    return Group(*lines)


def stdout_gone() -> None:
    """Point stdout at /dev/null once its reader is gone, so the interpreter's last flush at exit
    cannot raise again (what the Python documentation recommends for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
