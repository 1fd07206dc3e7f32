"""bench/timeslice_probe.py on the CPU: each case measures its victim's steps beside its
neighbour, and the neighbour, in another process or on a thread, reports its own rate."""

from __future__ import annotations

import importlib
from pathlib import Path


def test_each_case_times_the_victims_steps_and_its_neighbours_rate(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))  # the neighbour's process imports it
    bench = importlib.import_module("timeslice_probe")
    alone = bench.measure("alone", "cpu", 4, 2, 1.0)
    assert len(alone["walls"]) == 4 and all(w > 0 for w in alone["walls"]) and alone["rate"] is None
    for case, unit in (("steps, other process", "steps/s"), ("spin, other process", "spins/s"),
                       ("traffic, same process", "GB/s")):
        r = bench.measure(case, "cpu", 4, 2, 1.0, traffic_bytes=1 << 20)
        assert len(r["walls"]) == 4, case
        rate, got = r["rate"]
        assert got == unit and rate > 0, (case, r["rate"])
