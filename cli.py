"""The kernforge command line: the only place that parses arguments.

Each command parses, calls one library function, and turns our own exceptions into a clear
message and an exit code (2 for usage, task or input errors). No logic lives here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="kernforge: ask an LLM for GPU kernels, verify them against cheating, keep the best.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
tasks_app = typer.Typer(help="List and inspect tasks (what to optimise).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

out = Console()
err = Console(stderr=True)

# ---- shared options (declared once) -------------------------------------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts instead of tables.")]
TaskArg = Annotated[str, typer.Argument(help="A built-in task name, a KernelBench-form .py file, or a folder of them.")]


class UsageFailure(Exception):
    """Raised by commands for bad input; printed without a traceback, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _known_errors() -> tuple[type[BaseException], ...]:
    """Our own exception classes: each becomes a one-line message and exit code 2."""
    from kernforge.tasks.errors import TaskError

    return (TaskError, UsageFailure)


def command(group: typer.Typer, name: str | None = None):
    """Register a command on ``group`` with our error handling around it."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except _known_errors() as error:
                fail(str(error))

        return group.command(name)(wrapper)

    return decorate


# ---- tasks ------------------------------------------------------------------------------------
@command(tasks_app, "list")
def tasks_list(
    path: Annotated[Optional[str], typer.Argument(help="A KernelBench file or folder; the built-in suite if omitted.")] = None,
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
        out.print_json(json.dumps({"tasks": rows, "errors": [str(e) for e in errors]}))
    else:
        table = Table(title=f"{len(rows)} task(s)")
        for col in ("name", "public shapes", "dtype", "bound", "seed", "interpreter"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["name"], "\n".join(r["public_shapes"]), r["dtype"], r["bound"],
                "yes" if r["seed"] else "no", "yes" if r["interpreter"] else "GPU only",
            )
        out.print(table)
        for e in errors:
            err.print(f"[red]broken task:[/] {e}", highlight=False)
    if errors:
        raise typer.Exit(1)


@command(tasks_app, "show")
def tasks_show(
    task: TaskArg,
    device: Annotated[str, typer.Option(help="Show the spec for 'cuda' (GPU) or 'cpu' (Triton interpreter).")] = "cuda",
    as_json: JsonOpt = False,
) -> None:
    """Show exactly what the model is shown about a task (never the hidden shapes)."""
    from kernforge.tasks import report
    from kernforge.tasks.loader import load_task

    if device not in ("cuda", "cpu"):
        raise UsageFailure(f"--device must be 'cuda' or 'cpu', not {device!r}")
    loaded = load_task(task)
    if as_json:
        spec = loaded.public_spec()
        spec["roofline"] = report.roofline_rows(loaded, device)
        out.print_json(json.dumps(spec))
    else:
        typer.echo(report.show_text(loaded, device))


# ---- doctor -----------------------------------------------------------------------------------
@command(app)
def doctor(as_json: JsonOpt = False) -> None:
    """Check this machine: Python, torch, Triton, CUDA and GPUs, nvcc, sandbox isolation,
    the Docker engine, and whether an API key is configured (yes/no, never the key)."""
    from kernforge.loop.doctor import run_checks

    checks = run_checks()
    if as_json:
        out.print_json(json.dumps({c.name: {"ok": c.ok, "detail": c.detail} for c in checks}))
        return
    table = Table(title="kernforge doctor")
    table.add_column("check")
    table.add_column("")
    table.add_column("detail")
    for c in checks:
        table.add_row(c.name, "[green]ok[/]" if c.ok else "[yellow]--[/]", c.detail)
    out.print(table)


def main() -> None:
    """Console-script entry."""
    app()


if __name__ == "__main__":
    main()
