"""The kernforge command line: the only place that parses arguments.

Each command parses, calls one library function, and turns our own exceptions into a clear
message and an exit code (2 for usage, task or input errors). No logic lives here.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from kernforge.archive.tables import Col, FitTable
from kernforge.loop.display import stdout_console, stdout_gone


class _Prose:
    """Help that reads like prose: a flag shows no ``<bool>`` type label (options name their
    value: PATH, N, NAME), and docstrings are markdown, so a paragraph reflows at any width
    instead of breaking where the source line did."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
            elif param.param_type_name == "argument":
                param.display_type_rich = _no_type  # its metavar (FILE, TASK) says what it is
        return params


def _no_type(ctx=None) -> None:
    return None


class Command(_Prose, TyperCommand):
    pass


class Group(_Prose, TyperGroup):
    pass


def _typer(help: str) -> typer.Typer:
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode="markdown", cls=Group,
                       pretty_exceptions_enable=False, add_completion=False)


app = _typer("kernforge: ask an LLM for GPU kernels, verify them against cheating, keep the best.")
tasks_app = _typer("List and inspect tasks (what to optimise).")
app.add_typer(tasks_app, name="tasks")
archive_app = _typer("Query the archive of every attempt (SQLite).")
app.add_typer(archive_app, name="archive")
bench_app = _typer("Benchmarks: KernelBench problems through the loop, scored with KernelBench's metrics.")
app.add_typer(bench_app, name="bench")
sandbox_app = _typer("The docker sandbox (`--sandbox docker`): its worker image.")
app.add_typer(sandbox_app, name="sandbox")

# Piped into a file or a log, tables keep their rows whole instead of wrapping at 80 columns.
out = stdout_console()
err = Console(stderr=True)

# ---- shared options (declared once) -------------------------------------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts instead of tables.")]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="A built-in task name, a KernelBench-form .py file, or a folder of them.")]
DbOpt = Annotated[Path, typer.Option("--db", envvar="KERNFORGE_DB", metavar="PATH", help="The archive file (SQLite).")]
DEFAULT_DB = Path("kernforge.db")
GpuOpt = Annotated[Optional[int], typer.Option("--gpu", metavar="N", help="GPU index to run on; the first GPU by default, the CPU interpreter without one.")]
SandboxOpt = Annotated[str, typer.Option("--sandbox", metavar="KIND", help="Where candidates run: `process` (default) or `docker`.")]
TaskOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="Only this task (name).")]


class UsageFailure(Exception):
    """Raised by commands for bad input; printed without a traceback, exit code 2."""


def positive(value: int, flag: str) -> None:
    if value < 1:
        raise UsageFailure(f"{flag} must be 1 or more, not {value}")


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _known_errors() -> tuple[type[BaseException], ...]:
    """Our own exception classes: each becomes a one-line message and exit code 2."""
    from kernforge.archive.errors import ArchiveError
    from kernforge.loop.config import ConfigError
    from kernforge.loop.errors import LoopError
    from kernforge.loop.evaluate import EvaluationError
    from kernforge.sandbox.protocol import SandboxError
    from kernforge.tasks.errors import TaskError
    from kernforge.verifier.judge import JudgeError

    return (TaskError, ArchiveError, UsageFailure, EvaluationError, JudgeError, SandboxError, ConfigError, LoopError)


def command(group: typer.Typer, name: str | None = None):
    """Register a command on ``group`` with our error handling around it."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except _known_errors() as error:
                fail(str(error))
            except BrokenPipeError:  # `kernforge ... | head`: the reader is gone, nothing more to say
                stdout_gone()
                raise typer.Exit(1) from None

        return group.command(name, cls=Command)(wrapper)

    return decorate


def show(renderable, **options) -> bool:
    """Print to stdout; False (and nothing raised) when its reader is gone. A plain string is
    text, never markup, with its control characters shown as escapes: it may quote a candidate
    (an audit's reason, a package test's output), and ``[/]`` in one ended `archive audit` with a
    MarkupError while ESC sequences in another rewrote the terminal."""
    if isinstance(renderable, str):
        from rich.text import Text

        from kernforge.verifier.verdict import printable

        renderable = Text(printable(renderable))
    try:
        out.print(renderable, **options)
        out.file.flush()
    except BrokenPipeError:
        stdout_gone()
        return False
    return True


# ---- tasks ------------------------------------------------------------------------------------
@command(tasks_app, "list")
def tasks_list(
    path: Annotated[Optional[str], typer.Argument(metavar="PATH", help="A KernelBench file or folder; the built-in suite if omitted.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List tasks: name, public shapes, dtype, and whether memory- or compute-bound."""
    from kernforge.tasks import report
    from kernforge.tasks.loader import builtin_names, load_tasks

    tasks, errors = [], []
    for source in [path] if path else builtin_names():
        found, broken = load_tasks(source)
        tasks += found
        errors += broken
    rows = [report.list_row(t) for t in tasks]
    if as_json:
        show_json({"tasks": rows, "errors": [str(e) for e in errors]})
    else:
        table = FitTable([Col("name"), Col("public shapes", wrap=True), Col("dtype", drop=2), Col("bound", drop=1),
                          Col("seed"), Col("interpreter")], title=f"{len(rows)} task(s)",
                         caption="seed: a Triton kernel to start from; interpreter: whether that seed runs on the "
                                 "CPU (Triton interpreter) or on a GPU only")
        for r in rows:
            table.add_row(
                r["name"], "\n".join(r["public_shapes"]), r["dtype"], r["bound"],
                "yes" if r["seed"] else "no", "yes" if r["interpreter"] else "GPU only",
            )
        show(table)
        for e in errors:
            err.print(f"[red]broken task:[/] {e}", highlight=False)
    if errors:
        raise typer.Exit(1)


@command(tasks_app, "show")
def tasks_show(
    task: TaskArg,
    device: Annotated[str, typer.Option(metavar="KIND", help="Show the spec for `cuda` (GPU) or `cpu` (Triton interpreter).")] = "cuda",
    db: DbOpt = DEFAULT_DB,
    as_json: JsonOpt = False,
) -> None:
    """Show exactly what the model is shown about a task (never the hidden shapes), how many
    hidden shapes are fixed and how each verdict draws more, which production kernel libraries are
    tried as its library baseline (and which are installed here), then the baselines measured in
    the archive, flagged where one is far slower than the roofline."""
    from kernforge.archive import report as archive_report
    from kernforge.archive.records import TaskRecord
    from kernforge.archive.score import slow_baselines
    from kernforge.archive.store import Archive
    from kernforge.tasks import report
    from kernforge.tasks.loader import load_task
    from kernforge.verifier import library

    if device not in ("cuda", "cpu"):
        raise UsageFailure(f"--device must be 'cuda' or 'cpu', not {device!r}")
    loaded = load_task(task)
    found = []
    if db.exists():
        with Archive.open(db, readonly=True) as archive:
            found = archive.baselines(loaded.name, TaskRecord.from_task(loaded).source_hash)
    if as_json:
        spec = loaded.public_spec()
        spec["roofline"] = report.roofline_rows(loaded, device)
        spec["baselines"] = [b.to_dict() | {"slow": [s.line() for s in slow_baselines(b.shapes)]} for b in found]
        spec["hidden"] = report.hidden_summary(loaded, device)
        spec["libraries"] = library.listing(loaded)
        show_json(spec)
    else:
        show_line(report.show_text(loaded, device).rstrip("\n") + "\n\n" + report.hidden_text(loaded, device) + "\n"
                  + library.listing_text(loaded) + "\n\n" + archive_report.baselines_text(found))


# ---- archive ----------------------------------------------------------------------------------
@command(archive_app, "best")
def archive_best(
    db: DbOpt = DEFAULT_DB,
    task: TaskOpt = None,
    gpu: Annotated[Optional[str], typer.Option(metavar="NAME", help="Only GPUs whose name contains this, e.g. H200.")] = None,
    shapes: Annotated[bool, typer.Option("--shapes", help="The fastest accepted time per shape instead.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Best attempt per task and GPU: times, speedup vs eager and torch.compile, % of roofline.

    Only attempts whose latest audit by this judge passed count (see `kernforge archive audit`);
    interpreter (CPU) verdicts never do."""
    from kernforge.archive import report
    from kernforge.archive.store import Archive

    with Archive.open(db, readonly=True) as archive:
        rows = archive.best_per_shape(task, gpu) if shapes else archive.best(task, gpu)
        awaiting = archive.awaiting_audit(task, gpu)
    if as_json:
        show_json({"best": [r.to_dict() for r in rows], "awaiting_audit": [a.to_dict() for a in awaiting]})
    else:
        show(report.shape_best_table(rows, awaiting) if shapes else report.best_table(rows, awaiting))


@command(archive_app, "show")
def archive_show(
    attempt: Annotated[int, typer.Argument(metavar="ID", help="Attempt id.")], db: DbOpt = DEFAULT_DB, as_json: JsonOpt = False
) -> None:
    """One attempt: code, verdict, audit, measurements and lineage."""
    from kernforge.archive import report
    from kernforge.archive.store import Archive

    with Archive.open(db, readonly=True) as archive:
        record = archive.get_attempt(attempt)  # with its task's audited best: a near-tie with it is said to be one
        parts = (record, archive.lineage(attempt), archive.reuse_count(attempt), archive.audits(attempt),
                 archive.best_for(record))
    if as_json:
        show_json(report.show_json(*parts))
    else:
        show(report.show(*parts))


@command(archive_app, "stats")
def archive_stats(
    db: DbOpt = DEFAULT_DB,
    task: TaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per task and per model: attempts, acceptance rate, cheats caught by class, tokens, cost."""
    from kernforge.archive import report
    from kernforge.archive.store import Archive

    with Archive.open(db, readonly=True) as archive:
        stats = archive.stats(task)
    if as_json:
        show_json(stats.to_dict())
    else:
        show(report.stats_tables(stats))


@command(archive_app, "search")
def archive_search(
    text: Annotated[str, typer.Argument(metavar="WORDS", help="Words to find in code or verdict reasons.")],
    db: DbOpt = DEFAULT_DB,
    limit: Annotated[int, typer.Option(metavar="N", help="At most this many attempts.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Full-text search over attempts' code and verdict reasons."""
    from kernforge.archive import report
    from kernforge.archive.store import Archive

    positive(limit, "--limit")
    with Archive.open(db, readonly=True) as archive:
        rows = archive.search(text, limit)
    if as_json:
        show_json({"attempts": [r.to_dict() for r in rows]})
    else:
        show(report.summary_table(rows, f"{len(rows)} match(es)"))


@command(archive_app, "sql")
def archive_sql(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="One read-only statement, e.g. \"SELECT status, count(*) FROM attempts GROUP BY 1\".")],
    db: DbOpt = DEFAULT_DB,
    limit: Annotated[int, typer.Option(metavar="N", help="At most this many rows (0: all).")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Run a read-only SQL query on the archive; a statement that writes is refused."""
    from kernforge.archive import report
    from kernforge.archive.store import Archive

    if limit < 0:
        raise UsageFailure(f"--limit must be 0 (all rows) or more, not {limit}")
    with Archive.open(db, readonly=True) as archive:
        columns, rows, truncated = archive.sql(query, limit or None)
    if as_json:
        show_json({"columns": columns, "rows": rows, "truncated": truncated})
    else:
        show(report.sql_table(columns, rows, truncated))


@command(archive_app, "browse")
def archive_browse(
    db: DbOpt = DEFAULT_DB,
    port: Annotated[int, typer.Option(metavar="N", help="Port for Datasette.")] = 8001,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="Open a web browser.")] = True,
) -> None:
    """Explore the archive in Datasette (needs the `datasette` extra)."""
    from kernforge.archive.browse import browse

    if not 0 < port < 65536:
        raise UsageFailure(f"--port must be between 1 and 65535, not {port}")
    raise typer.Exit(browse(db, port, open_browser))


@command(archive_app, "audit")
def archive_audit(
    db: DbOpt = DEFAULT_DB,
    task: TaskOpt = None,
    gpu: Annotated[Optional[int], typer.Option("--gpu", metavar="N", help="GPU index to audit on, of the model the times were measured on; the first GPU by default (never the CPU).")] = None,
    sandbox: SandboxOpt = "process",
    limit: Annotated[int, typer.Option(metavar="N", help="At most this many audits per task.")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """Audit each task's best accepted attempts on a GPU, best first, until one passes.

    Each is judged again in a fresh worker on fresh inputs and must be accepted again and about as
    fast. Only an attempt whose latest audit by the installed judge passed is a best or exported
    (after an upgrade of kernforge, its bests are audited again). One less than 2% above the
    audited best is a near-tie, within the judge's own noise, and is not audited (nor does a run
    audit it)."""
    from kernforge.loop.auditing import audit_archive

    positive(limit, "--limit")
    with err.status("auditing (a fresh judge on the GPU)...", spinner="dots"):
        report = audit_archive(db, task=task, gpu=gpu, sandbox=sandbox, limit=limit)
    if as_json:
        show_line(json.dumps(report.to_dict(), default=str))
    else:
        for line in report.lines():
            show(line, highlight=False, soft_wrap=True)


@command(archive_app, "migrate")
def archive_migrate(db: DbOpt = DEFAULT_DB) -> None:
    """Bring an archive written by an older kernforge up to this version's schema."""
    from kernforge.archive.store import Archive

    with Archive.open(db) as archive:
        show(f"{db}: archive schema v{archive.migrate()}")
        earlier = archive.earlier_audits()
        if earlier:
            show(f"{earlier} audit(s) were made by an earlier judge and no longer make a best: "
                 "`kernforge archive audit` audits each task's best again")


# ---- export -----------------------------------------------------------------------------------
@command(app, "export")
def export_cmd(
    out_dir: Annotated[Path, typer.Option("--out", metavar="PATH", help="Folder to write the package into (new, or an earlier export with --force).")],
    db: DbOpt = DEFAULT_DB,
    name: Annotated[str, typer.Option(metavar="NAME", help="Package name; also the torch.library namespace of its ops.")] = "kernforge_kernels",
    tasks: Annotated[Optional[list[str]], typer.Option("--tasks", metavar="NAMES", help="Only these tasks (names or paths; repeat or comma-separate).")] = None,
    gpu: Annotated[Optional[list[str]], typer.Option(metavar="NAME", help="Only GPUs whose name contains this (repeatable); interpreter (CPU) verdicts are never exported.")] = None,
    min_speedup: Annotated[float, typer.Option(metavar="X", help="A bucket runs a kernel only at this speedup over --baseline or more.")] = 1.0,
    baseline: Annotated[str, typer.Option(metavar="KIND", help="What --min-speedup compares with: `eager` (the op's fallback) or `compile`.")] = "eager",
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier export in --out.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Then build the wheel, install it into a fresh venv and run the package's tests there.")] = False,
) -> None:
    """Write the best verified kernels as a pip-installable package of torch custom ops.

    Only GPU-verified, audited kernels are exported. `--check` works without a GPU too: the
    package's tests then run on the CPU (the reference fallbacks, opcheck and torch.compile)."""
    from kernforge.archive import export, export_check
    from kernforge.sandbox.confine import confine_command

    wanted = tuple(t.strip() for item in tasks or () for t in item.split(",") if t.strip())
    options = export.ExportOptions(name=name, tasks=wanted, gpus=tuple(gpu or ()), min_speedup=min_speedup,
                                   baseline=baseline, force=force)
    try:
        result = export.export(db, out_dir, options)
    except export.NothingToExport as error:
        fail(str(error), code=1)
    show(export.summary(result), highlight=False, soft_wrap=True)
    if check:
        try:
            show(export_check.check(result.out, confine=confine_command), highlight=False, soft_wrap=True)
        except export_check.PackageCheckFailed as error:
            fail(str(error), code=1)


# ---- report -----------------------------------------------------------------------------------
@command(app, "report")
def report_cmd(
    db: DbOpt = DEFAULT_DB,
    run: Annotated[Optional[int], typer.Option("--run", metavar="ID", help="Only this run (its id, as `kernforge run` printed it); the whole archive by default.")] = None,
    out_file: Annotated[Path, typer.Option("--out", metavar="PATH", help="The HTML file to write (replaced if it exists).")] = Path("kernforge-report.html"),
    png: Annotated[Optional[Path], typer.Option("--png", metavar="PATH", help="Also save a full-page PNG screenshot here (needs headless Chromium: apt-get install chromium).")] = None,
) -> None:
    """Write one HTML page about the archive (or one run) that opens offline in any browser.

    Per task and GPU it shows the best time over the attempts and the running best, the best
    against PyTorch eager and torch.compile per shape, its % of roofline, the verdicts by status
    and cheat class, the lineage of the best, and tokens and cost. Interpreter (CPU) verdicts
    check correctness only, so their times are never plotted; what the archive does not record
    (the GPUs' busy time) the page says it does not know."""
    from kernforge.archive.html_report import write_report

    out.print(write_report(db, out_file, run_id=run, png=png).summary(), highlight=False, soft_wrap=True)


# ---- sandbox ----------------------------------------------------------------------------------
@command(sandbox_app, "build-image")
def sandbox_build_image(
    base: Annotated[Optional[str], typer.Option(metavar="IMAGE", help="Base image: a CUDA PyTorch image from a registry (default: pytorch/pytorch, CUDA, -devel).")] = None,
    tag: Annotated[Optional[str], typer.Option(metavar="TAG", help="Tag of the worker image (default: kernforge-worker, or $KERNFORGE_SANDBOX_IMAGE).")] = None,
    from_host: Annotated[bool, typer.Option("--from-host", help="No registry needed: the base is made from this machine's Python and system libraries.")] = False,
    toolchain: Annotated[Optional[bool], typer.Option("--toolchain/--no-toolchain", help="With --from-host: include this machine's C compiler (Triton needs it on a GPU; default: when a GPU is present).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when an image from the same sources and base exists.")] = False,
) -> None:
    """Build the worker image the docker sandbox runs candidates in (skipped when up to date)."""
    from kernforge.sandbox.docker_image import build_image, default_tag

    info = build_image(base=base, tag=tag or default_tag(), from_host=from_host, with_toolchain=toolchain, force=force,
                       log=lambda line: err.print(line, highlight=False, soft_wrap=True))
    show(info.describe(), highlight=False, soft_wrap=True)


# ---- eval -------------------------------------------------------------------------------------


@command(app, "eval")
def eval_cmd(
    candidate: Annotated[Path, typer.Argument(metavar="FILE", help="A candidate module defining ModelNew (KernelBench form).")],
    task: Annotated[str, typer.Option("--task", metavar="TASK", help="A built-in task name, or a KernelBench-form .py file.")],
    gpu: GpuOpt = None,
    sandbox: SandboxOpt = "process",
    as_json: JsonOpt = False,
) -> None:
    """Verify one candidate against a task.

    Hidden-shape correctness, anti-cheating checks, and timings against PyTorch eager and
    torch.compile. Exit code 0 accepted, 1 rejected, 2 usage error."""
    from kernforge.archive.report import verdict_view
    from kernforge.loop.evaluate import evaluate_file

    with err.status(f"verifying {candidate.name} on {task}...", spinner="dots"):
        verdict, task_name = evaluate_file(candidate, task, gpu=gpu, sandbox=sandbox)
    if as_json:
        show_line(json.dumps({"task": task_name, "candidate": str(candidate), **verdict.to_dict()}, default=str))
    else:
        show(verdict_view(verdict, task_name))
    raise typer.Exit(0 if verdict.accepted else 1)


# ---- run ----------------------------------------------------------------------------------------
GpusOpt = Annotated[Optional[list[int]], typer.Option("--gpu", metavar="N", help="GPU index (repeatable); every visible GPU by default, the CPU interpreter without one.")]
LanesOpt = Annotated[int, typer.Option("--lanes", metavar="N", help="Verdicts in flight per device (1 or more): their workers start, compile and are checked side by side; each timed phase has the GPU to itself, every other lane's worker stopped. On one H100 two lanes made 8% more verdicts than one, each verdict taking 1.5-2x as long (the GPU time-slices between their processes): 1 is the default.")]
# the proposer's options, shared by `run` and `bench kernelbench`
ProviderOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="LLM preset: minimax (default, MiniMax M3), minimax-cn, together, openai, local, custom.")]
BaseUrlOpt = Annotated[Optional[str], typer.Option("--base-url", metavar="URL", help="Any OpenAI-compatible endpoint, e.g. http://localhost:8000/v1; the key from KERNFORGE_API_KEY.")]
ModelOpt = Annotated[Optional[list[str]], typer.Option("--model", metavar="NAME", help="Model name (repeatable: the run learns which pays off).")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Use the offline tuner even when an API key is configured.")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the search's random choices.")]


@command(app, "run")
def run_cmd(
    task: Annotated[Optional[list[str]], typer.Option("--task", metavar="TASK", help="A built-in task name, a KernelBench-form .py file, or a folder of them (repeatable).")] = None,
    db: DbOpt = DEFAULT_DB,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    max_attempts: Annotated[Optional[int], typer.Option("--max-attempts", metavar="N", help="Attempts per task.")] = None,
    hours: Annotated[Optional[float], typer.Option("--hours", metavar="H", help="Wall-clock budget of the run.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", metavar="N", help="Token budget of the run (prompt + completion).")] = None,
    max_cost: Annotated[Optional[float], typer.Option("--max-cost", metavar="USD", help="Money budget of the run, USD.")] = None,
    gpu: GpusOpt = None,
    lanes: LanesOpt = 1,
    sandbox: SandboxOpt = "process",
    resume: Annotated[Optional[int], typer.Option("--resume", metavar="RUN_ID", help="Continue this run (killed or stopped) without redoing or losing attempts; a run still going is refused.")] = None,
    offline: OfflineOpt = False,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Search for faster kernels, archiving every attempt.

    Asks the LLM (or, with no API key, the offline tuner) for candidates and verifies each on the
    GPUs (the CPU interpreter without one). Exit code 0 when the budget is used up, 130 when
    interrupted, 2 for bad input."""
    from kernforge.loop import display
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run

    settings = RunSettings(
        tasks=tuple(task or ()), db=db, provider=provider, base_url=base_url, models=tuple(model or ()),
        offline=offline, budget=Budget(max_attempts, hours, max_tokens, max_cost), gpus=tuple(gpu or ()),
        sandbox=sandbox, resume=resume, seed=seed, lanes=lanes,
    )
    result = run(settings, display.make_display(out, quiet=as_json))
    if as_json:
        show_line(json.dumps(result.to_dict(), default=str))
    else:
        show(display.summary(result.to_dict()), highlight=False)
    raise typer.Exit(0 if result.status == "finished" else 130)


# ---- bench ------------------------------------------------------------------------------------
@command(bench_app, "kernelbench")
def bench_kernelbench(
    problems: Annotated[Optional[list[str]], typer.Argument(metavar="PATH", help="KernelBench problem files, or level folders of them (e.g. bench/kernelbench/problems/level1).")] = None,
    db: DbOpt = DEFAULT_DB,
    provider: ProviderOpt = None,
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    max_attempts: Annotated[Optional[int], typer.Option("--max-attempts", metavar="N", help="Attempts per problem (10 when neither this nor --minutes is given).")] = None,
    minutes: Annotated[Optional[float], typer.Option("--minutes", metavar="M", help="Wall time per problem; the run gets M times the number of problems, spent while problems take turns.")] = None,
    gpu: GpusOpt = None,
    lanes: LanesOpt = 1,
    sandbox: SandboxOpt = "process",
    resume: Annotated[Optional[int], typer.Option("--resume", metavar="RUN_ID", help="Continue this benchmark run (killed or stopped) with its own problems and proposer.")] = None,
    offline: OfflineOpt = False,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run KernelBench problems through the loop, then print KernelBench's metrics.

    Each problem gets the configured proposer (the LLM, or with no API key the offline tuner)
    and the budget per problem; every attempt is archived in one run tagged as a KernelBench
    run, so `--resume` continues it and `kernforge bench report` shows it beside another model's.

    Metrics per level and overall: the correctness rate (problems with an accepted kernel),
    fast_p for p = 0, 1, 1.5 and 2 over PyTorch eager and over torch.compile (the share of ALL
    problems whose kernel is correct and more than p times faster), the share faster than
    torch.compile, and the geometric-mean speedup over each baseline, taken over the correct
    problems. Speedups are the fastest audited kernel's, at the problem's own sizes. On the CPU
    (Triton interpreter) verdicts check correctness only: the time-based metrics then read
    "not measured". Exit code 0 when the budget is used up, 130 when interrupted, 2 for bad input."""
    from kernforge.archive.bench_report import report_view
    from kernforge.loop import display
    from kernforge.loop.benchmark import BenchSettings, run_benchmark

    settings = BenchSettings(
        problems=tuple(problems or ()), db=db, provider=provider, base_url=base_url, models=tuple(model or ()),
        offline=offline, max_attempts=max_attempts, minutes=minutes, gpus=tuple(gpu or ()), lanes=lanes, sandbox=sandbox,
        resume=resume, seed=seed,
    )
    result = run_benchmark(settings, display.make_display(out, quiet=as_json))
    if as_json:
        show_line(json.dumps(result.to_dict(), default=str))
    else:
        show(report_view(result.report))
    raise typer.Exit(0 if result.run.status == "finished" else 130)


@command(bench_app, "report")
def bench_report_cmd(
    runs: Annotated[Optional[list[int]], typer.Argument(metavar="RUN_ID", help="Benchmark runs: one to show, several to compare; every benchmark run is listed if omitted.")] = None,
    db: DbOpt = DEFAULT_DB,
    as_json: JsonOpt = False,
) -> None:
    """Show a benchmark run's metrics and problems, or several runs side by side.

    Two models' runs compare metric by metric, per level, and problem by problem. With no run
    given, every benchmark run in the archive is listed."""
    from kernforge.archive import bench_report
    from kernforge.loop.benchmark import list_runs, read_reports

    if not runs:
        found = list_runs(db)
        if as_json:
            show_json({"runs": [r.to_dict() for r in found]})
        else:
            show(bench_report.runs_table(found))
        return
    reports = read_reports(db, runs)
    if as_json:
        show_json({"runs": [r.to_dict() for r in reports]})
    elif len(reports) == 1:
        show(bench_report.report_view(reports[0]))
    else:
        show(bench_report.compare_view(reports))


# ---- doctor -----------------------------------------------------------------------------------
@command(app)
def doctor(as_json: JsonOpt = False) -> None:
    """Check this machine: Python, torch, Triton, GPUs, nvcc, sandbox isolation, Docker, API key.

    Whether an API key is configured is said yes or no, never the key."""
    from kernforge.loop.doctor import run_checks

    checks = run_checks()
    if as_json:
        show_json({c.name: {"ok": c.ok, "detail": c.detail} for c in checks})
        return
    table = FitTable([Col("check"), Col(""), Col("detail", wrap=True)], title="kernforge doctor")
    for c in checks:
        table.add_row(c.name, "[green]ok[/]" if c.ok else "[yellow]--[/]", escape(c.detail))
    show(table)


def show_json(data) -> bool:
    """One JSON object on stdout (pretty in a terminal)."""
    try:
        out.print_json(json.dumps(data, default=str))
        out.file.flush()
    except BrokenPipeError:
        stdout_gone()
        return False
    return True


def show_line(text: str) -> bool:
    """One line of plain text on stdout, exactly as given (``--json`` of run and eval)."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()
        return False
    return True


def main() -> None:
    """Console-script entry."""
    app()


if __name__ == "__main__":
    main()
