"""Numbers and tables for people: one formatter for times, and tables that fit the terminal.

Every time a person reads (the live run, its summary, ``archive best``/``show``, ``eval``) goes
through ``fmt_us``, so one line never says ``23.6 ms`` beside ``2.359e+04 us``.

``FitTable`` lays a table out at the width it is rendered at (an 80-column terminal, a 160-column
log): a name or a number is never cut or folded; free text (reasons) wraps at spaces; when even
that is too wide, the least important columns are left out, and the caption says which. rich's own
layout shrinks every column evenly once wrapping is not enough, which cuts names to ``rms…``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


# ---- numbers ------------------------------------------------------------------------------------
def _three_digits(value: float) -> str:
    """Three significant digits, never in exponent form."""
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_us(value: float | None) -> str:
    """A time given in microseconds, in the unit that reads best: ``812 us``, ``23.6 ms``, ``4.10 s``."""
    if value is None:
        return "-"
    if value < 0:
        return "-" + fmt_us(-value)
    for scale, unit in ((1.0, "us"), (1e3, "ms"), (1e6, "s")):
        digits = _three_digits(value / scale)
        if float(digits) < 1000 or unit == "s":
            return f"{digits} {unit}"
    raise AssertionError("unreachable")


def fmt_time(value: float | None, interpreter: bool) -> str:
    """A time, labelled when it is the interpreter's (a wall clock on the CPU, not device time)."""
    return fmt_us(value) + (" (interpreter)" if interpreter and value is not None else "")


def fmt_x(value: float | None, digits: int = 2) -> str:
    """A speedup: ``1.37x``."""
    return "-" if value is None else f"{value:.{digits}f}x"


def fmt_num(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


# ---- tables -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Col:
    """A column. ``wrap``: free text that may wrap at spaces (names and numbers never do).
    ``drop``: 0 is always shown; otherwise, when the table is too wide, the highest goes first."""

    header: str
    justify: str = "left"
    wrap: bool = False
    drop: int = 0


#: what a rich table with edges adds around n columns: a border each side and between, padding 1+1
def _frame(n: int) -> int:
    return 3 * n + 1


def _lines(cell: Any) -> list[str]:
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return text.plain.split("\n")


def _longest_word(lines: Iterable[str]) -> int:
    return max((Text(word).cell_len for line in lines for word in line.split()), default=1)


def _longest_line(lines: Iterable[str]) -> int:
    return max((Text(line).cell_len for line in lines), default=1)


#: a wrapping column is never made narrower than this (unless its widest word is shorter)
WRAP_FLOOR = 16


class FitTable:
    """A table that fits the width it is rendered at (see the module docstring)."""

    def __init__(self, columns: Sequence[Col], rows: Sequence[Sequence[Any]] = (), *, title: str | None = None,
                 caption: str | None = None, **table_options: Any) -> None:
        self.columns = list(columns)
        self.rows: list[list[Any]] = [list(r) for r in rows]
        self.title = title
        self.caption = caption
        self.table_options = table_options

    def add_row(self, *cells: Any) -> None:
        self.rows.append(list(cells))

    def layout(self, width: int) -> tuple[list[int], list[int | None]]:
        """The indices of the columns shown at ``width``, and each one's fixed width (None: natural)."""
        header = [_lines(c.header.replace(" ", "\n")) for c in self.columns]
        cells = [[_lines(r[i]) for r in self.rows] for i in range(len(self.columns))]
        natural, minimum = [], []
        for i, col in enumerate(self.columns):
            body = [line for cell in cells[i] for line in cell]
            full = max(_longest_line(body), _longest_line([col.header]))
            whole = _longest_word(header[i])
            if col.wrap:
                least = max(whole, min(_longest_line(body), max(_longest_word(body), WRAP_FLOOR)))
            else:
                least = max(whole, _longest_line(body))
            natural.append(full)
            minimum.append(min(least, full))
        shown = list(range(len(self.columns)))
        while sum(minimum[i] for i in shown) + _frame(len(shown)) > width:
            droppable = [i for i in shown if self.columns[i].drop]
            if not droppable:
                break
            shown.remove(max(droppable, key=lambda i: (self.columns[i].drop, i)))
        room = width - _frame(len(shown))
        if sum(natural[i] for i in shown) <= room:
            return shown, [None] * len(shown)
        widths = {i: minimum[i] for i in shown}
        spare = room - sum(widths.values())
        # first the headers of whole columns (a header wraps only when nothing else fits), then the text
        for i in shown:
            if not self.columns[i].wrap and spare > 0:
                extra = min(spare, natural[i] - widths[i])
                widths[i] += extra
                spare -= extra
        wrapping = [i for i in shown if self.columns[i].wrap and natural[i] > widths[i]]
        want = sum(natural[i] - widths[i] for i in wrapping)
        for i in wrapping:
            if spare <= 0 or want <= 0:
                break
            extra = min(natural[i] - widths[i], spare * (natural[i] - widths[i]) // want)
            widths[i] += extra
        leftover = room - sum(widths.values())
        for i in wrapping:
            extra = min(max(0, leftover), natural[i] - widths[i])
            widths[i] += extra
            leftover -= extra
        return shown, [widths[i] for i in shown]

    def table(self, width: int) -> Table:
        shown, widths = self.layout(width)
        caption = self.caption
        hidden = [self.columns[i].header for i in range(len(self.columns)) if i not in shown]
        if hidden:
            note = f"not shown at {width} columns: {', '.join(hidden)} (a wider terminal or --json shows them)"
            caption = f"{caption}\n{note}" if caption else note
        table = Table(title=self.title, caption=caption, **self.table_options)
        for i, w in zip(shown, widths):
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify, width=w, overflow="fold",
                             no_wrap=not col.wrap and w is None)
        for row in self.rows:
            table.add_row(*(row[i] if isinstance(row[i], Text) else str(row[i]) for i in shown))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table(options.max_width))
