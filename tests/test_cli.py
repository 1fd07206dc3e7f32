"""cli.py: help that reads like prose at 80 columns, for every command."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from kernforge.cli import app


def command_paths(group: typer.Typer, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for command in group.registered_commands:
        paths.append(prefix + (command.name or command.callback.__name__,))
    for sub in group.registered_groups:
        paths += command_paths(sub.typer_instance, prefix + (sub.name,))
    return paths


ALL = command_paths(app)


def help_text(path: tuple[str, ...], monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "kernforge")
def test_help_names_values_not_python_types(path, monkeypatch):
    text = help_text(path, monkeypatch)
    assert max(len(line) for line in text.splitlines()) <= 80
    labels = re.findall(r"<(?:bool|int|float|str|path|list\[[a-z]+\])>", text)
    assert labels == [], f"python type labels in `kernforge {' '.join(path)} --help`: {labels}"
    assert "x>=" not in text and "<=x" not in text  # ranges are checked by the command, said in words


GROUPS = [()] + [(sub.name,) for sub in app.registered_groups]


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p) or "kernforge")
def test_command_lists_read_as_sentences(path, monkeypatch):
    """A summary reflows at the panel's width: no line breaks where the docstring's source line did
    (a short line followed by the rest of the sentence)."""
    text = help_text(path, monkeypatch)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╭─ Commands"))
    body = lines[start + 1:]
    body = body[:next(i for i, line in enumerate(body) if line.startswith("╰"))]
    for this, following in zip(body, body[1:]):
        continues = re.match(r"│ {5,}\S", following)  # the next line carries on the same description
        text_this = this.strip("│ ").rstrip()
        if continues and not text_this.endswith((".", ":", ")")):
            assert len(this.rstrip("│ ").rstrip()) >= 60, f"line broken mid-sentence:\n{this}\n{following}"


def test_a_plain_string_is_shown_as_text_not_markup_nor_control(monkeypatch):
    """An audit line quoting a candidate with ``[/]`` ended `archive audit` with a MarkupError, and
    ``[conceal]`` would have hidden the words after it; ESC sequences rewrote the terminal."""
    import io

    from rich.console import Console

    from kernforge import cli as cli_module

    buffer = io.StringIO()
    monkeypatch.setattr(cli_module, "out", Console(file=buffer, width=200, force_terminal=True))
    assert cli_module.show("audit failed: x[/] [conceal]demoted\x1b[2K", highlight=False)
    shown = buffer.getvalue()
    assert "x[/] [conceal]demoted" in shown and "\\x1b[2K" in shown and "\x1b[2K" not in shown
