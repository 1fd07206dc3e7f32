"""bench/stop_cost.py and bench/start_noise_probe.py on the CPU: each prints its table, one row
per way or neighbour, with figures in every cell."""

from __future__ import annotations

import importlib
import re
from pathlib import Path


def _bench(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    return importlib.import_module(name)


def test_the_stop_cost_table_has_each_way_of_stopping(monkeypatch, capsys):
    _bench(monkeypatch, "stop_cost").main(["--others", "5", "--trees", "2", "--repeats", "3"])
    out = capsys.readouterr().out
    for row in ("freeze_many", "stop_trusted_tree"):
        line = next(line for line in out.splitlines() if row in line)
        assert len(re.findall(r"\d+\.\d\d", line)) == 2, line


def test_the_start_noise_table_has_a_row_per_neighbour(monkeypatch, capsys):
    _bench(monkeypatch, "start_noise_probe").main(["--device", "cpu", "--seconds", "0.5", "--calls", "8", "--starters", "1"])
    out = capsys.readouterr().out
    for row in ("alone", "starts", "starts, stopped"):
        assert any(line.strip("│ ").startswith(row) and re.search(r"\d+\.\d\d", line) for line in out.splitlines()), out
