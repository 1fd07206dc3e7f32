"""The run's devices outside their judges: GPU work of the run itself holds every GPU's gate."""

from __future__ import annotations

import asyncio

from bench_helpers import bench_script

from kernforge.loop.devices import Devices
from kernforge.verifier.verdict import Accepted


def test_a_gpu_child_starts_with_every_gate_held_and_is_stopped_by_any_judge_about_to_time():
    """GPU work of the run itself (an Inductor capture's child) starts while every device's gate
    is held shared (nobody times as it starts), then is enlisted with every gate until it ends:
    a judge about to time on any device stops it instead of waiting for it; once it ended, nobody
    stops it."""
    import sys

    devices = Devices(["cuda:0", "cuda:1"], lanes=2)
    seen = []

    async def work() -> None:
        async def start():
            seen.append([devices.gates[name]._shared for name in devices.names])
            return await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")

        async with devices.gpu_child(start) as child:
            assert [devices.gates[name]._shared for name in devices.names] == [0, 0], "held only while it starts"
            for name in devices.names:
                def timed(gate=devices.gates[name]):
                    with gate.exclusive():
                        seen.append(_state(child.pid))
                await asyncio.to_thread(timed)
            child.kill()
            await child.wait()
        assert all(not gate._enlisted for gate in devices.gates.values())

    asyncio.run(work())
    assert seen == [[1, 1], "T", "T"]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_an_audit_is_logged_with_its_nsight_compute_stages(monkeypatch):
    """bench/loop.py's table of where time went shows an audit's profiled run beside its second
    verdict: the stages the Nsight Compute record carries join the verdict's steps."""
    from kernforge.loop import devices as devices_module
    from kernforge.verifier.audit import Audit

    again = Accepted(shapes=(), environment={"phase_seconds": {"ref.verify_batch": 2.5}})
    result = Audit(True, "accepted again", verdict=again,
                   details={"ncu": {"ran": True, "seconds": {"ncu.start": 4.0, "ncu.calls": 0.5}}})
    monkeypatch.setattr(devices_module.auditing, "audit", lambda judge, code, task, verdict: result)
    devices = Devices(["cpu"])
    devices.judges = [object()]

    class Task:
        name = "tiny_norm"

    got, _ = asyncio.run(devices.audit(0, "code", Task(), again))
    assert got is result
    assert devices.log[-1]["kind"] == "audit"
    assert devices.log[-1]["steps"] == {"ref.verify_batch": 2.5, "ncu.start": 4.0, "ncu.calls": 0.5}


def test_the_loop_table_says_what_a_checked_call_cost():
    """bench/loop.py's table of where time went: each task's checked calls per verdict (the
    median) and what one cost its checks, from the counts the verdicts carry into the log."""
    loop = bench_script("loop")
    log = [{"kind": "verdict", "task": "t", "seconds": 3.0, "checked_calls": 40,
            "steps": {"checks public": 0.5, "checks hidden": 0.3}},
           {"kind": "verdict", "task": "t", "seconds": 2.0, "checked_calls": 60,
            "steps": {"checks public": 0.7, "checks hidden": 0.5}},
           {"kind": "audit", "task": "t", "seconds": 9.0, "checked_calls": 50, "steps": {"checks public": 5.0}}]
    table = loop._steps_table(log + [{"kind": "verdict", "task": "u", "seconds": 1.0}])
    cells = {c.header: c._cells for c in table.columns}
    # the audit's calls are not a verdict's; a verdict that carries no count shows none
    assert (cells["task"], cells["checked calls"], cells["ms a call"]) == (["t", "u"], ["60", "-"], ["20.0", "-"])
    devices = Devices(["cpu"])

    class Task:
        name = "t"

    devices._note("verdict", 0, Task(), devices._t0, Accepted(shapes=(), environment={"checked_calls": 42, "phase_seconds": {}}))
    assert devices.log[-1]["checked_calls"] == 42


def test_the_loop_table_says_how_the_times_of_record_were_reached_and_held(tmp_path):
    """bench/loop.py's table of times of record: per task, the run's accepted public GPU shapes,
    how many the guard bounded, their pairs' median spread, and its audits' measured over recorded
    times with those that did not hold; other runs' attempts and hidden shapes are not counted."""
    from dataclasses import replace

    from kernforge.archive import synthetic
    from kernforge.archive.records import NewAttempt
    from kernforge.archive.store import Archive
    from kernforge.verifier.audit import compare
    from kernforge.verifier.verdict import BOUNDED, ShapeResult

    def shape(t, method, spread, hidden=False):
        return ShapeResult(shape={"T": t}, hidden=hidden, dtype="bfloat16", timing="graph", time_us=10.0 * t,
                           spread_pct=spread, compile_us=20.0, method=method)

    loop = bench_script("loop")
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        earlier, run = archive.start_run({}), archive.start_run({})
        verdict = Accepted(shapes=(shape(1, BOUNDED, 60.0), shape(64, "difference", 2.0), shape(2, BOUNDED, 90.0, hidden=True)),
                           environment=dict(synthetic.H200))
        ids = [archive.record_attempt(NewAttempt(r, seq, task, f"c = {seq}", verdict)) for seq, r in enumerate((earlier, run, run))]
        for attempt, ratio in zip(ids[1:], (0.9, 1.4)):  # judged again: held, then 40% slower (did not hold)
            again = Accepted(shapes=tuple(replace(s, time_us=s.time_us * ratio) for s in verdict.shapes),
                             environment=verdict.environment)
            archive.record_audit(attempt, compare(verdict, again), run_id=run)
    table = loop._records_table(tmp_path / "k.db", run)
    cells = {c.header: c._cells for c in table.columns}
    assert cells["task"] == ["rms_norm"] and cells["shapes timed"] == ["4"] and cells["bounded"] == ["2"]
    assert cells["pairs apart (median)"] == ["31%"] and cells["audits"] == ["2"]
    assert cells["measured / recorded"] == ["0.90-1.40"] and cells["did not hold"] == ["1"]
    assert loop._records_table(tmp_path / "k.db", earlier + 100) is None
