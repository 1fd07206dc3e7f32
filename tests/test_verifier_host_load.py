"""Whether the host was quiet around a sample of the trusted host clock (verifier/host_load.py),
and the reference worker's readings while it waits for a batch's done (refworker._wait_byte)."""

from __future__ import annotations

import socket
import threading

import pytest

from kernforge.verifier import host_load, refworker


def test_runnable_tasks_are_read_from_loadavg(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.52 0.61 0.70 17/1234 98765\n")
    assert host_load.runnable(str(f)) == 17
    f.write_text("garbage\n")
    assert host_load.runnable(str(f)) is None
    assert host_load.runnable(str(tmp_path / "absent")) is None


def test_this_host_s_count_is_read_where_linux_has_it():
    n = host_load.runnable()
    assert n is None or n >= 1  # this test's own process runs


@pytest.mark.parametrize("readings, stall, cpus, quiet", [
    ([3, 5], 0.0, 16, True),
    ([3, 17], 0.0, 16, False),      # more runnable tasks than cores at one reading: some waited
    ([16], 0.0, 16, True),
    ([3, None], 0.0, 16, False),    # a reading that failed: nothing shows the host was free
    ([], 0.0, 16, False),           # no reading at all
    ([2, 2], 0.003, 16, False),     # the trusted side itself stalled 3 ms
    ([2, 2], host_load.STALL_S, 16, True),
])
def test_a_sample_is_quiet_only_where_every_reading_shows_a_free_host(readings, stall, cpus, quiet):
    values = iter(readings)
    watch = host_load.Watch(read=lambda: next(values))
    for _ in readings:
        watch.look()
    watch.stalled(stall)
    assert host_load.quiet(watch.facts(), cpus) is quiet


def test_the_facts_leave_out_a_count_that_could_not_be_read():
    watch = host_load.Watch(read=lambda: None)
    watch.look()
    assert "runnable_max" not in watch.facts()
    assert not host_load.quiet(watch.facts(), 64)


def _pair_with_done_after(delay_s: float):
    ours, theirs = socket.socketpair()
    timer = threading.Timer(delay_s, lambda: theirs.sendall(b"d"))
    timer.start()
    return ours, theirs, timer


def test_the_reference_worker_reads_the_host_while_it_waits_for_done():
    counts = []
    watch = host_load.Watch(read=lambda: counts.append(1) or 4)
    ours, theirs, timer = _pair_with_done_after(0.02)
    try:
        assert refworker._wait_byte(ours, deadline=refworker.time.perf_counter() + 5, watch=watch)
    finally:
        timer.join()
        ours.close()
        theirs.close()
    # a reading at the start and one every LOOK_EVERY_S of the 20 ms wait
    assert len(counts) >= 2
    assert watch.facts()["runnable_max"] == 4.0


def test_a_pause_of_the_reference_worker_s_spin_is_a_stall(monkeypatch):
    """A spin that was not running for a while (preempted) sees the gap between two polls."""
    real = refworker.time.perf_counter
    state = {"calls": 0}

    def clock():
        state["calls"] += 1
        # the tenth reading of the clock comes 4 ms late, as after a preemption
        return real() + (0.004 if state["calls"] >= 10 else 0.0)

    monkeypatch.setattr(refworker.time, "perf_counter", clock)
    watch = host_load.Watch(read=lambda: 1)
    ours, theirs, timer = _pair_with_done_after(0.01)
    try:
        assert refworker._wait_byte(ours, deadline=real() + 5, watch=watch)
    finally:
        timer.join()
        ours.close()
        theirs.close()
    assert watch.facts()["stall_max"] >= 0.004
    assert not host_load.quiet(watch.facts(), 64)


def test_a_wait_without_a_watch_still_ends_at_its_deadline_or_on_a_closed_socket():
    ours, theirs = socket.socketpair()
    try:
        assert not refworker._wait_byte(ours, deadline=refworker.time.perf_counter() + 0.01)
        theirs.close()
        assert not refworker._wait_byte(ours, deadline=refworker.time.perf_counter() + 5)
    finally:
        ours.close()
