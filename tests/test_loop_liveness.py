"""loop/liveness.py and ``Archive.resume_run``: a live run is never resumed under it, and a dead
holder never blocks a resume."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from kernforge.archive.errors import RunBusyError
from kernforge.archive.store import Archive
from kernforge.loop.liveness import STALE_S, Heartbeat, holder_alive, this_process
from kernforge.sandbox import procs


def dead_process() -> str:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = f"{socket.gethostname()}|{procs.owner_id(child.pid)}"
    child.wait()
    return owner


def test_a_holder_on_this_machine_is_alive_while_its_process_is():
    assert holder_alive(this_process(), heartbeat_age_s=1e9)  # a slow heartbeat changes nothing here
    assert not holder_alive(dead_process(), heartbeat_age_s=0.0)  # gone, even with a fresh heartbeat


@pytest.mark.parametrize("age, alive", [(1.0, True), (STALE_S + 1, False)])
def test_a_holder_on_another_machine_is_alive_while_its_heartbeat_is_fresh(age, alive):
    assert holder_alive("gpu-node-7|some-boot/4242/1234", heartbeat_age_s=age) is alive


@pytest.fixture
def archive(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        yield archive


def test_a_live_run_is_refused_and_left_as_it_was(archive):
    me = this_process()
    run = archive.start_run({}, owner=me)
    with pytest.raises(RunBusyError, match=f"run {run} .* is still running"):
        archive.resume_run(run, "other-host|x/1/2", holder_alive)
    record = archive.run_status(run).run
    assert (record.status, record.owner, record.resumes) == ("running", me, 0)


@pytest.mark.parametrize("status", ["running", "interrupted"])
def test_a_dead_holder_is_taken_over(archive, status):
    run = archive.start_run({}, owner=dead_process())
    if status != "running":
        archive.finish_run(run, status)
    me = this_process()
    record = archive.resume_run(run, me, holder_alive).run
    assert (record.status, record.owner, record.resumes) == ("running", me, 1)
    archive.finish_run(run, "finished", owner=me, seconds=3.0)
    record = archive.run_status(run).run
    assert (record.status, record.owner, record.seconds) == ("finished", None, 3.0)


def test_a_run_taken_over_is_not_let_go_by_its_old_holder(archive):
    old, new = dead_process(), this_process()
    run = archive.start_run({}, owner=old)
    archive.resume_run(run, new, holder_alive)
    archive.finish_run(run, "failed", owner=old)  # the old holder, late: changes nothing
    assert archive.run_status(run).run.status == "running"
    assert not archive.heartbeat(run, old, 1.0) and archive.heartbeat(run, new, 2.0)


def test_the_heartbeat_records_the_wall_time(tmp_path):
    with Archive.create(tmp_path / "k.db") as archive:
        me = this_process()
        run = archive.start_run({}, owner=me)
        beat = Heartbeat(tmp_path / "k.db", run, me, lambda: 42.0, interval_s=0.05)
        try:
            import time

            deadline = time.monotonic() + 10
            while archive.run_status(run).run.seconds != 42.0:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            beat.stop()
