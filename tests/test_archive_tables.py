"""archive/tables.py: one time formatter, and tables that fit the width they are rendered at."""

from __future__ import annotations

import pytest
from rich.console import Console

from kernforge.archive.tables import Col, FitTable, fmt_us, fmt_x


def render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.export_text()


def assert_fits(text: str, width: int = 80) -> None:
    lines = text.splitlines()
    assert max(map(len, lines)) <= width, "\n".join(line for line in lines if len(line) > width)
    assert "…" not in text, text


@pytest.mark.parametrize("us, text", [
    (None, "-"), (0.5123, "0.51 us"), (7.0, "7.00 us"), (812.4, "812 us"), (999.7, "1.00 ms"), (7133.9, "7.13 ms"),
    (23590.0, "23.6 ms"), (153_070.0, "153 ms"), (4.1e6, "4.10 s"), (5e9, "5000 s"),
])
def test_one_unit_per_time_never_an_exponent(us, text):
    assert fmt_us(us) == text
    assert "e+" not in fmt_us(us)


def test_speedups():
    assert fmt_x(1.3749) == "1.37x" and fmt_x(None) == "-"


COLUMNS = [Col("task"), Col("attempts", "right"), Col("reason", wrap=True, drop=3), Col("best time", "right"),
           Col("x eager", "right", drop=2), Col("tokens", "right", drop=1), Col("gpu", drop=4)]
ROWS = [
    ["fp8_quant_per_group", "1234", "correct on every public and hidden shape and input distribution", "7.13 ms",
     "1.37x", "1,234,567", "NVIDIA H200"],
    ["fused_add_rms_norm", "7", "incorrect: max abs err 0.4 at index (3, 17) of output 0", "812 us", "0.98x", "12",
     "NVIDIA H200"],
]


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
def test_names_and_numbers_are_never_cut(width):
    text = render(FitTable(COLUMNS, ROWS, title="a run"), width)
    assert_fits(text, width)
    for row in ROWS:
        assert row[0] in text and row[1] in text and row[3] in text  # whole, on one line


def test_text_wraps_before_any_column_is_dropped():
    table = FitTable(COLUMNS, ROWS)
    shown, widths = table.layout(120)
    assert len(shown) == len(COLUMNS)  # everything fits once the reason wraps
    assert sum(w for w in widths if w) + 3 * len(shown) + 1 <= 120


def test_columns_go_in_the_order_given_and_the_caption_says_which():
    table = FitTable(COLUMNS, ROWS)
    shown, _ = table.layout(60)
    headers = [COLUMNS[i].header for i in shown]
    assert headers[:2] == ["task", "attempts"] and "best time" in headers
    assert "gpu" not in headers  # drop=4 goes first
    text = render(table, 60)
    assert "not shown at 60 columns: " in text and "gpu" in text.split("not shown at 60 columns: ")[1]


def test_a_wide_terminal_shows_the_table_as_it_is():
    text = render(FitTable(COLUMNS, ROWS), 250)
    assert "not shown" not in text and ROWS[0][2] in text  # the reason on one line
