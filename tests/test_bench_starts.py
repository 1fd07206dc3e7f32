"""bench/worker_start.py and bench/profiled_start_probe.py on the CPU (no GPU, no Nsight Compute:
``env`` stands in for ncu): each says, for every kind of start, that its workers became ready and
where their starts went."""

from __future__ import annotations

import importlib
import re
from pathlib import Path


def _bench(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    return importlib.import_module(name)


def test_the_worker_start_table_has_a_row_per_kind_of_start(monkeypatch, capsys, tmp_path):
    _bench(monkeypatch, "worker_start").main(["--device", "cpu", "--workers", "2", "--rounds", "1", "--json", str(tmp_path / "w.json")])
    out = capsys.readouterr().out
    for row in ("unseeded", "seeded"):
        line = next(line for line in out.splitlines() if line.strip("│ ").startswith(row))
        assert len(re.findall(r"\d+\.\d\d", line)) >= 3, line  # the wall time, the preload, the warm-up's steps
    assert "round 1 seeded:" in out


def test_the_profiled_start_probe_says_which_workers_became_ready(monkeypatch, capsys):
    from kernforge.verifier import ncu

    monkeypatch.setattr(ncu, "available", lambda: "/usr/bin/env")
    monkeypatch.setattr(ncu, "command", lambda exe, log: ("/usr/bin/env",))
    _bench(monkeypatch, "profiled_start_probe").main(["--device", "cpu", "--wait", "60"])
    out = capsys.readouterr().out
    for start in ("seeded", "seeded, under ncu", "under ncu, stopped around windows"):
        assert re.search(rf"^{re.escape(start)}: ready after \d+\.\d s \(.*preload \d", out, re.M), out
