"""Scheduling (loop/fairness.py): every task's first verdict comes early, a slow task gets a
bounded share of the devices, and one GPU verdict is time-boxed by its task. Device time is a
fake clock the stand-in judge advances: every assertion counts turns, none times anything."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import sys
import types
from pathlib import Path

import pytest

from kernforge.loop.fairness import VERDICT_BASE_S, VERDICT_PER_SHAPE_S, FairShare, verdict_limit_s
from kernforge.sandbox.protocol import Limits
from kernforge.tasks.loader import load_task

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from candidates import HONEST  # noqa: E402

TASKS = Path(__file__).resolve().parent / "tasks"

pytestmark = pytest.mark.usefixtures("clean_config_env")


# ---- the turn order ----------------------------------------------------------------------------
def test_a_task_without_a_verdict_goes_before_any_second_verdict():
    fair = FairShare(["a", "b", "c"])
    fair.judged("a", 1.0)
    # b has nothing in flight and no verdict: first; c's first is in flight, so it waits behind a
    assert fair.order([("a", 0), ("b", 0), ("c", 1)]) == ["b", "a", "c"]


def test_the_least_device_time_charged_goes_next_and_ties_go_round_robin():
    fair = FairShare(["slow", "f1", "f2"])
    fair.judged("slow", 100.0)
    fair.judged("f1", 1.0)
    fair.judged("f2", 1.0)
    assert fair.order([("slow", 0), ("f1", 0), ("f2", 0)]) == ["f1", "f2", "slow"]
    assert fair.order([("f2", 0), ("f1", 0), ("slow", 0)]) == ["f2", "f1", "slow"]
    # a proposal in flight is charged the task's mean verdict: f1 with one pending now costs 2 s
    assert fair.order([("f1", 1), ("f2", 0), ("slow", 0)]) == ["f2", "f1", "slow"]
    fair.charge("f2", 5.0)  # an audit's device time counts too
    assert fair.order([("f1", 0), ("f2", 0)]) == ["f1", "f2"]


def test_a_task_before_its_first_verdict_is_charged_the_runs_mean():
    fair = FairShare(["a", "b", "new"])
    assert fair.mean_verdict_s("new") == 0.0
    fair.judged("a", 2.0)
    fair.judged("b", 4.0)
    assert fair.mean_verdict_s("new") == pytest.approx(3.0)
    assert fair.charged_s("new", 2) == pytest.approx(6.0)


def test_a_resumed_run_gives_first_verdicts_to_tasks_that_never_had_one():
    """The H200's KernelBench run, resumed with 28 of 43 problems untried, gave the 15 judged
    ones their second verdicts first: each session's shares started from nothing."""
    fair = FairShare(["judged", "untried"], earlier={"judged": 1})
    assert fair.order([("judged", 0), ("untried", 0)]) == ["untried", "judged"]
    # the earlier verdict's device time is unknown: it does not dilute this session's mean
    assert fair.mean_verdict_s("judged") == 0.0
    fair.judged("judged", 4.0)
    assert fair.mean_verdict_s("judged") == pytest.approx(4.0)
    assert fair.mean_verdict_s("untried") == pytest.approx(4.0)


# ---- a run: one slow task among fast ones --------------------------------------------------------
def _seeded(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for part in ("reference.py", "meta.py"):
        (folder / part).write_text((TASKS / "tiny_norm" / part).read_text())
    (folder / "seed.py").write_text(HONEST)
    return folder


#: the offline tuner's variants of the HONEST seed on tiny_norm: each task's budget here
ATTEMPTS = 5


@pytest.mark.parametrize("slow_s", [2.5, 20.0])
def test_a_slow_task_cannot_starve_the_others(tmp_path, monkeypatch, slow_s):
    """Five tasks on one device; the "slow" one's verdicts hold it ``slow_s`` (fake) seconds, the
    others' one second. Every task's first verdict is among the first five; the slow task's second
    turn comes only once each fast task has had as much device time (``ceil(slow_s)`` verdicts, or
    its whole budget), where round robin would give it the sixth verdict."""
    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run
    from test_loop_runner import StandInJudge

    clock = [0.0]

    class ClockedJudge(StandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            clock[0] += slow_s if task.name == "slow" else 1.0
            self.script.append("accepted")
            return super().verify(code, task)

    boxes = []

    @contextlib.contextmanager
    def stand_in(device, **kw):
        boxes.append(kw.get("time_box"))
        yield ClockedJudge([])

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr(devices, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    names = ["slow", "f1", "f2", "f3", "f4"]
    db = tmp_path / "k.db"
    result = run(RunSettings(tasks=tuple(str(_seeded(tmp_path, n)) for n in names), db=db, offline=True,
                             budget=Budget(max_attempts=ATTEMPTS)))
    assert result.status == "finished" and boxes == [None]  # the interpreter is not time-boxed
    conn = sqlite3.connect(db)
    order = [r[0] for r in conn.execute(
        "SELECT t.name FROM attempts a JOIN tasks t ON t.id = a.task_id ORDER BY a.seq")]
    conn.close()
    assert {n: order.count(n) for n in names} == {n: ATTEMPTS for n in names}, order
    assert sorted(order[:5]) == sorted(names)  # every task's first verdict before any second one
    fast_turns = min(math.ceil(slow_s), ATTEMPTS)
    second = order.index("slow", 1)
    assert second == 1 + 4 * fast_turns, order
    assert all(order[:second].count(n) == fast_turns for n in names[1:]), order


# ---- one verdict, time-boxed -------------------------------------------------------------------
def test_a_gpu_verdict_is_limited_by_its_task():
    task = load_task(str(TASKS / "tiny_norm"))
    shapes = len(task.public_shapes) + len(task.hidden_shapes)
    # tiny_norm's calls move kilobytes: the per-GB allowance adds well under a second
    assert VERDICT_BASE_S + VERDICT_PER_SHAPE_S * shapes <= verdict_limit_s(task) < VERDICT_BASE_S + VERDICT_PER_SHAPE_S * shapes + 1
    assert verdict_limit_s(task) < Limits().wall_seconds
    assert verdict_limit_s(task, cap_s=30.0) == 30.0


def test_a_task_that_moves_gigabytes_or_has_no_roofline_gets_the_sandboxs_limit():
    """KernelBench's default sizes move 6-8 GB per call (an honest verdict took minutes on the
    H200); a bare KernelBench file has no roofline, so its sizes are unknown: never less than the cap."""
    big = load_task("rms_norm")  # 256 MB per call at its largest shape, eight shapes
    assert verdict_limit_s(big, cap_s=None) > verdict_limit_s(load_task(str(TASKS / "tiny_norm")), cap_s=None) + 10
    bare = load_task(str(Path(__file__).resolve().parent / "kernelbench" / "19_ReLU.py"))
    assert verdict_limit_s(bare) == Limits().wall_seconds
    assert verdict_limit_s(bare, cap_s=None) == float("inf")


def test_a_time_box_caps_a_candidates_session_by_its_task_only():
    """The judge opens a candidate's session with ``options.limits.capped(time_box.get(task))``."""
    time_box = {"slow": 100.0}
    mem = Limits().memory_bytes
    seen = [(limits.wall_seconds, limits.memory_bytes) for limits in (
        Limits().capped(time_box.get("slow")),
        Limits().capped(time_box.get("other")),  # no limit named: unchanged
        Limits(wall_seconds=50.0).capped(time_box.get("slow")),  # a tighter one stays
        Limits(wall_seconds=None).capped(None),  # no deadline and none named: unchanged
        Limits(wall_seconds=None).capped(float("inf")),  # a task of unknown size: unchanged
    )]
    assert seen == [(100.0, mem), (300.0, mem), (50.0, mem), (None, mem), (None, mem)]


def test_a_gpu_run_time_boxes_each_task(monkeypatch):
    """Devices on a GPU hand the judge each task's limit; on the CPU none."""
    import asyncio

    from kernforge.loop import devices

    boxes = {}

    class Judge:
        def environment(self):
            return {"gpu": "H200"}

    @contextlib.contextmanager
    def stand_in(device, **kw):
        boxes[device] = kw.get("time_box")
        yield Judge()

    monkeypatch.setattr(devices, "open_judge", stand_in)
    tasks = [load_task("rms_norm"), load_task("softmax")]
    for names in (["cuda:0"], ["cpu"]):
        d = devices.Devices(names, tasks=tasks)
        asyncio.run(d.open())
        asyncio.run(d.close())
    assert boxes["cuda:0"] == {t.name: verdict_limit_s(t) for t in tasks} and boxes["cpu"] is None
