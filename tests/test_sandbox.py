"""Hostile candidates against the process backend (THREATS.md #9, #21).

Each test runs one hostile job (tests/sandbox_jobs/hostile.py) in a shared warm pool and checks
three things: the parent gets a classified failure or a result within the limits it set; nothing
leaks (no key, no connection, no file outside the workdir, no process left); and the next job in
the same pool runs normally. Every namespace mechanism this machine offers is exercised.

The descriptor channel (tests/sandbox_jobs/fds.py) is tested the same way: memory shared both
ways through it, and hostile jobs abusing it, after which the parent holds no more descriptors
than before.
"""

from __future__ import annotations

import mmap
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import uuid
from pathlib import Path

import pytest

from kernforge.sandbox import bytecode, isolation
from kernforge.sandbox import FailureKind, Limits, ProcessBackend, WorkerFailure, WorkerSpec
from kernforge.sandbox.protocol import MAX_FDS_PER_MESSAGE, MAX_TAG_CHARS

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from sandbox_helpers import (LIMITS, NEEDLE, REPO, TESTS, assert_connections_refused, assert_next_job_ok,  # noqa: E402
                             leftovers, mechanism_available, no_descriptor_leak, parent_fds, plant_secrets, run_job,
                             world_writable_dir)


def _mechanisms() -> list[str]:
    found = [m for m in ("bwrap", "namespaces") if mechanism_available(m)]
    return found or ["strict"]


@pytest.fixture(scope="module", params=_mechanisms())
def pool(request):
    patch = plant_secrets()  # secrets sit in the parent's environment before any worker starts
    backend = ProcessBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation=request.param), pool_size=2)
    yield backend
    backend.close()
    patch.undo()


def nproc_enforced(backend) -> bool:
    return os.geteuid() != 0 or backend.drop_uid


def only_once(backend) -> None:
    """Resource limits act the same under every mechanism: their slow tests run under the first
    (and under the docker backend, which re-runs these tests in test_sandbox_docker.py)."""
    first = _mechanisms()[0]
    if backend.name == "process" and backend.spec.isolation != first:
        pytest.skip(f"mechanism-independent and slow: covered under {first}")


# ---- results and the workdir ------------------------------------------------------------------
def test_honest_job_gets_private_dir_and_unprivileged_uid(pool):
    outcome = run_job(pool, "echo", {"x": [1, 2.5, "three"]})
    assert outcome.message["echo"] == {"x": [1, 2.5, "three"]}
    assert outcome.message["cwd"] == str(outcome.workdir)
    if os.geteuid() == 0 and pool.drop_uid:
        assert outcome.message["uid"] != 0


def test_files_pass_through_workdir_at_same_path(pool):
    with pool.session("sandbox_jobs.hostile:read_back", {}, LIMITS) as session:
        (session.workdir / "from_parent.txt").write_text("hello")
        session.send({"workdir": str(session.workdir)})
        assert session.recv(30) == {"read": "hello"}
        assert (session.workdir / "from_worker.txt").read_text() == "HELLO"


def test_conversation(pool):
    with pool.session("sandbox_jobs.hostile:conversation", {}, LIMITS) as session:
        for value in (1, 21, -4):
            session.send({"op": "ask", "value": value})
            assert session.recv(30) == {"op": "answer", "value": 2 * value}
        session.send({"op": "stop"})
        assert session.recv(30) == {"op": "stopped"}


# ---- hostile jobs -----------------------------------------------------------------------------
def test_infinite_loop_times_out(pool):
    only_once(pool)
    outcome = run_job(pool, "loop_forever", limits=Limits(wall_seconds=2, cpu_seconds=60))
    assert outcome.failure.kind is FailureKind.TIMEOUT
    assert "wall-clock" in outcome.failure.reason
    assert_next_job_ok(pool)


def test_recv_timeout_kills_the_job(pool):
    session = pool.session("sandbox_jobs.hostile:loop_forever", {}, LIMITS)
    with pytest.raises(WorkerFailure) as info:
        session.recv(timeout=1)
    assert info.value.kind is FailureKind.TIMEOUT and "within 1" in info.value.reason
    with pytest.raises(WorkerFailure):
        session.recv(timeout=1)  # a failed session stays failed
    session.close()
    assert_next_job_ok(pool)


@pytest.mark.parametrize("ignore", [False, True], ids=["sigxcpu", "ignored-sigxcpu"])
def test_cpu_limit(pool, ignore):
    only_once(pool)
    outcome = run_job(pool, "burn_cpu_and_ignore_sigxcpu", {"ignore": ignore}, Limits(wall_seconds=60, cpu_seconds=1))
    assert outcome.failure.kind is FailureKind.RESOURCE_LIMIT
    assert "CPU time limit" in outcome.failure.reason
    assert_next_job_ok(pool)


def test_memory_hog_is_stopped(pool):
    limit = 256 << 20
    outcome = run_job(pool, "allocate_forever", limits=Limits(wall_seconds=60, memory_bytes=limit))
    assert outcome.failure.kind is FailureKind.OUT_OF_MEMORY
    assert outcome.diagnostics.peak_rss_bytes > limit
    assert_next_job_ok(pool)


def test_fork_spray_is_limited_and_reaped(pool):
    outcome = run_job(pool, "fork_spray", {"attempts": 200}, Limits(wall_seconds=30, processes=24))
    assert outcome.failure is None
    if nproc_enforced(pool):
        assert outcome.message["failed"] > 0 and outcome.message["started"] < 24
    assert_next_job_ok(pool)


def test_a_paused_job_is_stopped_whole_until_resumed(pool):
    """While its judge waits for the GPU another lane may be timing: every process of the job,
    the children it double-forked away from its tree among them, is stopped, then goes on."""
    from kernforge.sandbox import procs

    with pool.session("sandbox_jobs.hostile:fork_spray", {"attempts": 3}, LIMITS) as session:
        workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
        assert session.recv(30)["started"] == 3
        # the processes running the job's code: its uid's (the sandbox's own supervisors run as root)
        members = sorted(procs.uid_states(uid)) if uid is not None else leftovers(workdir, None)
        assert len(members) >= 4, "the job and its three detached children"
        session.pause()
        running = {pid: state for pid in members if (state := _state(pid)) not in "TZ"}  # Z: the double fork's exited middle
        assert running == {}, "every process of the job is stopped"
        session.resume()
        for pid in members:
            if _state(pid) == "Z":
                continue
            assert _wait_state(pid, lambda s: s != "T"), f"process {pid} stayed stopped after resume"
    assert_next_job_ok(pool)


def test_the_jobs_of_several_lanes_are_stopped_together_and_whole(pool):
    """A lane that times stops every other lane's job at once (sandbox.session.pause_all: one
    pass over /proc per round for all of them): every process of each job is stopped, the
    children that left its tree too, and each goes on when its session resumes."""
    from kernforge.sandbox import procs
    from kernforge.sandbox.session import pause_all

    with pool.session("sandbox_jobs.hostile:fork_spray", {"attempts": 3}, LIMITS) as first, \
            pool.session("sandbox_jobs.hostile:wake_each_other", {"children": 3}, LIMITS) as second:
        assert first.recv(30)["started"] == 3
        assert len(second.recv(30)["pids"]) == 4
        members = {}
        for session in (first, second):
            uid = session.worker.lease.uid if session.worker.lease else None
            members[session] = sorted(procs.uid_states(uid)) if uid is not None else leftovers(session.workdir, None)
        assert len(members[first]) >= 4 and len(members[second]) >= 4
        pause_all([first, second])
        for session in (first, second):
            running = {pid: state for pid in members[session] if (state := _state(pid)) not in "TZ"}
            assert running == {}, "every process of every job is stopped"
        for session in (first, second):
            session.resume()
            for pid in members[session]:
                if _state(pid) != "Z":
                    assert _wait_state(pid, lambda s: s != "T"), f"process {pid} stayed stopped after resume"
        assert first.stopped_seconds() > 0 and second.stopped_seconds() > 0
    assert_next_job_ok(pool)


def test_a_resume_that_comes_while_a_stop_is_finding_the_job_s_processes_leaves_it_running(pool, monkeypatch):
    """Two lanes' judges stop and resume one job at once: its own judge stops it while it waits for
    the gate, and the lane that was timing resumes every worker it found enlisted. A resume that
    came while the stop was still finding the job's processes once thawed none of them and marked
    the job running; the stop then stopped them for good, and a judge holding the gate waited on
    its own stopped worker (two lanes on an H100, session 57: no verdict in 210 s). A resume that
    comes then must leave the job running."""
    from kernforge.sandbox import procs

    real = procs.freeze_many
    found, resumed = threading.Event(), threading.Event()

    def slow_freeze(targets):
        out = real(targets)  # the processes are stopped; the stop has not yet noted them
        found.set()
        resumed.wait(2.0)  # time for the resume to run in between, where it can
        return out

    monkeypatch.setattr(procs, "freeze_many", slow_freeze)
    with pool.session("sandbox_jobs.hostile:fork_spray", {"attempts": 2}, LIMITS) as session:
        workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
        assert session.recv(30)["started"] == 2
        members = sorted(procs.uid_states(uid)) if uid is not None else leftovers(workdir, None)
        assert len(members) >= 3
        stopper = threading.Thread(target=session.pause)
        stopper.start()
        assert found.wait(30)

        def resume() -> None:
            session.resume()
            resumed.set()

        resumer = threading.Thread(target=resume)
        resumer.start()
        stopper.join(30)
        resumer.join(30)
        assert not stopper.is_alive() and not resumer.is_alive()
        for pid in members:
            if _state(pid) != "Z":
                assert _wait_state(pid, lambda s: s != "T"), f"process {pid} stayed stopped after the resume"
        session.pause()  # and the job stops and goes on as before
        session.resume()
        for pid in members:
            if _state(pid) != "Z":
                assert _wait_state(pid, lambda s: s != "T"), f"process {pid} stayed stopped after a later resume"
    assert_next_job_ok(pool)


def test_a_pause_holds_processes_that_wake_each_other(pool):
    """Each process sends SIGCONT to the others without end: a pause must stop them again until
    none is left to wake anyone, then hold them all for as long as it lasts."""
    import time

    from kernforge.sandbox import procs

    with pool.session("sandbox_jobs.hostile:wake_each_other", {"children": 6}, LIMITS) as session:
        workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
        assert len(session.recv(30)["pids"]) == 7
        pids = sorted(procs.uid_states(uid)) if uid is not None else leftovers(workdir, None)  # host pids
        assert len(pids) >= 7
        for _ in range(5):
            session.pause()
            end = time.monotonic() + 0.2
            while time.monotonic() < end:
                running = {pid: state for pid in pids if (state := _state(pid)) != "T"}
                assert running == {}, "a process woken by another runs during the pause"
            session.resume()
            assert all(_wait_state(pid, lambda s: s != "T") for pid in pids), "the job stayed stopped after resume"
    assert_next_job_ok(pool)


def test_time_a_job_spends_stopped_counts_against_neither_its_deadline_nor_a_request(pool):
    """Another lane times while this job's request is under way (verifier/gate.py stops it):
    the seconds it spends stopped are not its own. A request asked with a timeout shorter than
    the stop, in a session whose wall limit is shorter too, gets its answer once the job goes on;
    the session says how long it was stopped."""
    import dataclasses
    import time

    limits = dataclasses.replace(LIMITS, wall_seconds=3)
    with pool.session("sandbox_jobs.hostile:conversation", {}, limits) as session:
        session.send({"op": "ask", "value": 1})
        assert session.recv(10) == {"op": "answer", "value": 2}
        session.pause()
        session.send({"op": "ask", "value": 21})
        answer: list = []
        asker = threading.Thread(target=lambda: answer.append(_recv_or_failure(session, 2.0)))
        asker.start()
        stopped_until = time.monotonic() + 4.0  # past the request's timeout and the wall limit
        while time.monotonic() < stopped_until:
            time.sleep(0.05)
        session.resume()
        asker.join(30)
        assert answer == [{"op": "answer", "value": 42}]
        assert session.stopped_seconds() >= 4.0
        session.send({"op": "stop"})
        assert session.recv(10) == {"op": "stopped"}
    assert_next_job_ok(pool)


def _recv_or_failure(session, timeout):
    try:
        return session.recv(timeout)
    except WorkerFailure as failure:
        return failure.reason


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, want, patience: float = 10.0) -> bool:
    import time

    end = time.monotonic() + patience
    while time.monotonic() < end:
        if want(_state(pid)):
            return True
        time.sleep(0.01)
    return False


def test_fork_bomb_is_contained(pool):
    only_once(pool)
    if not nproc_enforced(pool):
        pytest.skip("root without a private uid: RLIMIT_NPROC would not hold a fork bomb")
    session = pool.session("sandbox_jobs.hostile:fork_bomb", {}, Limits(wall_seconds=3, processes=24))
    workdir, uid = session.workdir, session.worker.lease.uid if session.worker.lease else None
    assert session.recv(30) == {"bombing": True}
    with pytest.raises(WorkerFailure) as info:
        session.recv(60)
    session.close()
    assert info.value.kind is FailureKind.TIMEOUT
    assert leftovers(workdir, uid) == []
    assert_next_job_ok(pool)


def test_segfault_is_crashed_with_signal_name(pool):
    outcome = run_job(pool, "segfault")
    assert outcome.failure.kind is FailureKind.CRASHED
    assert "SIGSEGV" in outcome.failure.reason and outcome.diagnostics.signal == "SIGSEGV"
    assert_next_job_ok(pool)


@pytest.mark.parametrize("job, payload, expected", [
    ("hard_exit", {"code": 0}, "exited with code 0"),
    ("hard_exit", {"code": 7}, "exited with code 7"),
    ("soft_exit", {"code": 3}, "sys.exit(3)"),
    ("raise_error", {}, "ValueError: candidate blew up"),
])
def test_early_exits_are_classified(pool, job, payload, expected):
    outcome = run_job(pool, job, payload)
    assert outcome.failure.kind is FailureKind.EXITED_EARLY
    assert expected in outcome.failure.reason
    assert_next_job_ok(pool)


def test_last_message_before_exit_is_delivered(pool):
    with pool.session("sandbox_jobs.hostile:send_then_exit", {}, LIMITS) as session:
        assert session.recv(30) == {"last": "words"}
        with pytest.raises(WorkerFailure) as info:
            session.recv(30)
    assert info.value.kind is FailureKind.EXITED_EARLY
    assert_next_job_ok(pool)


def test_output_flood_is_truncated(pool):
    limits = Limits(wall_seconds=60, output_bytes=4096)
    outcome = run_job(pool, "flood", {"megabytes": 16}, limits)
    assert outcome.message == {"flooded": True}
    for text, end in ((outcome.diagnostics.stdout, "END-OF-STDOUT"), (outcome.diagnostics.stderr, "END-OF-STDERR")):
        assert text.rstrip().endswith(end)
        assert len(text) < 4096 + 200 and "earlier bytes dropped" in text
    assert_next_job_ok(pool)


def test_endless_output_is_bounded(pool):
    """A job that prints forever fills nothing: a process worker's output goes through pipes into
    memory the parent bounds (the newest of it kept) and the job ends when its time does; a
    container's goes to files its file-size limit stops."""
    outcome = run_job(pool, "flood_forever", limits=Limits(wall_seconds=5, file_bytes=8 << 20))
    if type(pool) is ProcessBackend:
        assert outcome.failure.kind is FailureKind.TIMEOUT, outcome.failure
    else:
        assert outcome.failure.kind is FailureKind.RESOURCE_LIMIT and "file size limit" in outcome.failure.reason
    assert len(outcome.diagnostics.stdout) <= Limits().output_bytes + 100
    assert_next_job_ok(pool)


def test_killing_the_parent_fails(pool):
    outcome = run_job(pool, "kill_parent", {"trusted_pid": os.getpid()})
    if outcome.message is not None:
        assert outcome.message["trusted"] != "could signal"
    else:  # it managed to kill its own supervisor (same uid): the sandbox still ends cleanly
        assert outcome.failure.kind in (FailureKind.CRASHED, FailureKind.EXITED_EARLY)
    if pool.drop_uid:
        assert outcome.message["ppid"] == "Operation not permitted"
    assert_next_job_ok(pool)


def test_no_secret_reaches_the_worker(pool):
    outcome = run_job(pool, "read_secrets", {"needle": NEEDLE})
    assert outcome.message == {"found": []}
    assert NEEDLE not in outcome.diagnostics.stdout + outcome.diagnostics.stderr
    assert_next_job_ok(pool)


def test_no_network(pool):
    if not pool.mechanism.netns:
        pytest.skip("no network namespace on this machine")
    assert_connections_refused(pool)
    assert_next_job_ok(pool)


def test_writes_outside_workdir_do_not_land(pool):
    if not pool.mechanism.mountns:
        pytest.skip("no mount namespace on this machine")
    with world_writable_dir() as open_dir:
        targets = [open_dir / "a.txt", REPO / "escape.txt", Path(f"/tmp/kf-escape-{uuid.uuid4().hex}"),
                   Path(f"/dev/shm/kf-escape-{uuid.uuid4().hex}")]
        outcome = run_job(pool, "write_outside", {"paths": [str(p) for p in targets]})
        assert outcome.message[str(open_dir / "a.txt")] == "Read-only file system"
        assert [p for p in targets if p.exists()] == []
    assert_next_job_ok(pool)


def test_a_job_reads_the_bytecode_compiled_beside_the_sources_and_cannot_plant_its_own(pool):
    """sandbox/bytecode.py compiles what an install lacks beside its sources, for every candidate
    worker to read. The worker reads it (a stale-looking pyc proves it: the source now says 2, its
    size and time unchanged, and the import says 1), and a candidate cannot plant bytecode there
    for the next importer, in a package's folder or one without bytecode yet."""
    if not pool.mechanism.mountns:
        pytest.skip("no mount namespace on this machine")
    site = Path(sysconfig.get_paths()["purelib"])  # where a worker imports its packages from
    if not os.access(site, os.W_OK):
        pytest.skip(f"{site} is not writable here: no package to plant the probe in")
    module = f"kf_bytecode_probe_{uuid.uuid4().hex[:8]}"
    folder = site / module
    folder.mkdir()
    try:
        source = folder / "__init__.py"
        source.write_text("VALUE = 1\n")
        subprocess.run(bytecode.command([folder], [], 1), check=True, timeout=60)
        compiled = bytecode.beside(source)
        stat = source.stat()
        source.write_text("VALUE = 2\n")
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        planted = [compiled, folder / "other" / "__pycache__" / f"x.{sys.implementation.cache_tag}.pyc"]
        (folder / "other").mkdir()
        before = compiled.read_bytes()
        outcome = run_job(pool, "import_and_poison", {"folder": str(site), "module": module,
                                                      "plant": [str(p) for p in planted]})
        assert outcome.message is not None, (outcome.failure, outcome.diagnostics)
        assert outcome.message["value"] == 1, outcome.message
        assert set(outcome.message["planted"].values()) <= {"Read-only file system", "Permission denied"}, outcome.message
        assert compiled.read_bytes() == before and not planted[1].exists()
    finally:
        shutil.rmtree(folder)
    assert_next_job_ok(pool)


@pytest.mark.parametrize("kind", ["oversized", "not_json", "not_object"])
def test_bad_frames_are_protocol_violations(pool, kind):
    outcome = run_job(pool, "bad_frame", {"kind": kind})
    assert outcome.failure.kind is FailureKind.PROTOCOL_VIOLATION
    assert_next_job_ok(pool)


def test_parent_exception_inside_session_kills_worker(pool):
    with pytest.raises(RuntimeError):
        with pool.session("sandbox_jobs.hostile:fork_spray", {"attempts": 5}, LIMITS) as session:
            workdir = session.workdir
            uid = session.worker.lease.uid if session.worker.lease else None
            session.recv(30)
            raise RuntimeError("the judge's own code failed")
    assert leftovers(workdir, uid) == []
    assert not workdir.exists()
    assert_next_job_ok(pool)


def test_pool_refills(pool):
    assert pool.wait_warm(timeout=120) == pool.pool_size


# ---- the descriptor channel -------------------------------------------------------------------
FDS = "sandbox_jobs.fds"
#: Messages of descriptors with odd tags: several in one, none, the limits of both.
MESSAGES = [
    {"tag": "three in one", "contents": ["a", "bb", "ccc"]},
    {"tag": "", "contents": []},
    {"tag": "ünïcødé ✓ \u0000 \n", "contents": ["x"]},
    {"tag": "t" * MAX_TAG_CHARS, "contents": [f"fd {i}" for i in range(MAX_FDS_PER_MESSAGE)]},
]


def memfd(content: bytes) -> int:
    fd = os.memfd_create("kf-parent")
    os.write(fd, content)
    return fd


def contents(fds: list[int]) -> list[str]:
    return [os.pread(fd, 1 << 16, 0).decode() for fd in fds]


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def test_parent_memory_is_shared_with_the_job(pool):
    fd = memfd(b"parent bytes" + bytes(4096 - 12))
    mine = mmap.mmap(fd, 4096)  # before the count: a mapping holds a descriptor of its own
    try:
        with no_descriptor_leak(pool):
            with pool.session(f"{FDS}:rewrite_shared", {"length": 12, "write": "JOB WROTE IT"}, LIMITS) as session:
                session.send_fds([fd], "arena", timeout=30)
                assert session.recv(30) == {"tag": "arena", "read": "parent bytes", "mapped": "parent bytes"}
            assert mine[:12] == b"JOB WROTE IT" and os.pread(fd, 12, 0) == b"JOB WROTE IT"
    finally:
        mine.close()
        os.close(fd)  # still the parent's: send_fds closed nothing
    assert_next_job_ok(pool)


def test_job_memory_is_shared_with_the_parent(pool):
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:share_own", {"messages": [{"tag": "job arena", "contents": ["job bytes"]}]},
                          LIMITS) as session:
            tag, fds = session.recv_fds(30)
            assert tag == "job arena" and contents(fds) == ["job bytes"]
            with mmap.mmap(fds[0], 9) as theirs:
                assert theirs[:] == b"job bytes"
                theirs[:] = b"JOB BYTES"
            close_all(fds)
            assert session.recv(30) == {"sent": 1}
            session.send({"go": True})
            assert session.recv(30) == {"first": "JOB BYTES"}, "the job does not see the parent's write"


def test_messages_sent_early_arrive_in_order_with_their_tags(pool):
    """Several messages, several descriptors each, all sent before the parent asks for one."""
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:share_own", {"messages": MESSAGES}, LIMITS) as session:
            assert session.recv(30) == {"sent": len(MESSAGES)}
            for message in MESSAGES:
                tag, fds = session.recv_fds(30)
                got = contents(fds)
                close_all(fds)
                assert (tag, got) == (message["tag"], message["contents"])
            session.send({"go": True})
            assert session.recv(30) == {"first": "a"}


def test_parent_sends_several_messages_and_descriptors(pool):
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:describe_received", {"messages": len(MESSAGES)}, LIMITS) as session:
            with pytest.raises(ValueError):
                session.send_fds([0] * (MAX_FDS_PER_MESSAGE + 1))
            with pytest.raises(ValueError):
                session.send_fds([], "t" * (MAX_TAG_CHARS + 1))
            for message in MESSAGES:  # the refused calls sent nothing
                fds = [memfd(text.encode()) for text in message["contents"]]
                try:
                    session.send_fds(fds, message["tag"], timeout=30)
                    for fd in fds:
                        os.fstat(fd)  # still open: the worker got copies
                finally:
                    close_all(fds)
            for message in MESSAGES:
                assert session.recv(30) == message


@pytest.mark.parametrize("job, payload, reason", [
    ("flood_one_message", {"count": 100}, f"more than {MAX_FDS_PER_MESSAGE} descriptors"),
    ("bad_fd_frame", {"kind": "huge_header"}, "tag (limit"),
    ("bad_fd_frame", {"kind": "not_utf8"}, "not UTF-8"),
    ("bad_fd_frame", {"kind": "too_many_chars"}, "300 characters"),
    ("bad_fd_frame", {"kind": "mid_frame"}, "middle of a frame"),
])
def test_bad_descriptor_messages_are_protocol_violations(pool, job, payload, reason):
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:{job}", payload, LIMITS) as session:
            assert "sent" in session.recv(30)
            with pytest.raises(WorkerFailure) as info:
                session.recv_fds(30)
    assert info.value.kind is FailureKind.PROTOCOL_VIOLATION and reason in info.value.reason, info.value
    assert_next_job_ok(pool)


def test_descriptor_flood_in_many_messages_stays_bounded(pool):
    """The parent holds only the messages it asked for; the rest die with the session."""
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:flood_many_messages", {"messages": 100, "fds": MAX_FDS_PER_MESSAGE},
                          LIMITS) as session:
            assert session.recv(30) == {"sending": 100}
            for number in range(3):
                tag, fds = session.recv_fds(30)
                close_all(fds)
                assert (tag, len(fds)) == (f"flood {number}", MAX_FDS_PER_MESSAGE)
    assert_next_job_ok(pool)


def test_descriptors_of_an_unfinished_message_are_closed_with_the_session(pool):
    with no_descriptor_leak(pool):
        before = parent_fds()
        with pool.session(f"{FDS}:partial_frame", {}, LIMITS) as session:
            assert session.recv(30) == {"sent": True}
            with pytest.raises(WorkerFailure) as info:
                session.recv_fds(timeout=2)
            assert info.value.kind is FailureKind.TIMEOUT
            assert parent_fds() >= before + MAX_FDS_PER_MESSAGE, "the half message's descriptors never arrived"
    assert_next_job_ok(pool)


def test_silent_job_times_out_on_recv_fds(pool):
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:sleep_forever", {}, LIMITS) as session:
            with pytest.raises(WorkerFailure) as info:
                session.recv_fds(timeout=1)
            assert info.value.kind is FailureKind.TIMEOUT and "within 1" in info.value.reason
            with pytest.raises(WorkerFailure):
                session.send_fds([], "after the failure")  # a failed session stays failed
    assert_next_job_ok(pool)


def test_job_that_closes_its_descriptor_channel(pool):
    """The parent sees the job's end close (bwrap's outer process closes what it passed on; with
    isolation "none" or docker there is none). Under unshare --fork, whose outer process keeps a
    copy of every descriptor it passed on, the channel just goes silent, as the JSON pipes do
    when a job closes them."""
    intermediate = pool.mechanism.name == "namespaces"
    with no_descriptor_leak(pool):
        with pool.session(f"{FDS}:close_fd_channel", {}, LIMITS) as session:
            assert session.recv(30) == {"closed": True}
            with pytest.raises(WorkerFailure) as info:
                session.recv_fds(timeout=10 if intermediate else 60)
    if intermediate:
        assert info.value.kind is FailureKind.TIMEOUT, info.value
    else:
        assert info.value.kind is FailureKind.PROTOCOL_VIOLATION and "descriptor channel" in info.value.reason
    assert_next_job_ok(pool)


@pytest.mark.parametrize("job, kind, expected", [
    ("raise_error", FailureKind.EXITED_EARLY, "ValueError: candidate blew up"),
    ("segfault", FailureKind.CRASHED, "SIGSEGV"),
    ("hard_exit", FailureKind.EXITED_EARLY, "exited with code 7"),
])
def test_job_death_during_recv_fds_is_classified(pool, job, kind, expected):
    with no_descriptor_leak(pool):
        with pool.session(f"sandbox_jobs.hostile:{job}", {"code": 7}, LIMITS) as session:
            with pytest.raises(WorkerFailure) as info:
                session.recv_fds(60)
    assert info.value.kind is kind and expected in info.value.reason, info.value
    assert_next_job_ok(pool)


def test_descriptors_in_a_trusted_worker():
    """Isolation "none" (trusted workers): the same channel, both ways, and a job's closed end
    seen at once."""
    with ProcessBackend(WorkerSpec(env={"PYTHONPATH": str(TESTS)}, isolation="none"), pool_size=1) as backend:
        assert backend.mechanism.name == "none"
        test_parent_memory_is_shared_with_the_job(backend)
        test_job_memory_is_shared_with_the_parent(backend)
        test_messages_sent_early_arrive_in_order_with_their_tags(backend)
        test_bad_descriptor_messages_are_protocol_violations(backend, "flood_one_message", {"count": 100}, "more than")
        test_job_that_closes_its_descriptor_channel(backend)


def test_kernel_interfaces_no_kernel_needs_are_refused_and_builds_still_run(pool):
    """A key stored in the uid's keyring outlived the worker, and worker uids are leased again:
    the red team relayed the shapes each worker was called at to the next. Under strict isolation
    the job's seccomp filter refuses keyrings, new namespaces and other processes' memory, the
    kernel's log, and a file's times (a touch of the host's /dev/null, timed to a hidden size, was
    read back by the next worker); threads and programs run as before (a build forks and execs)."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(f"no system call numbers for {platform.machine()}")
    outcome = run_job(pool, "kernel_state")
    said = outcome.message
    assert said["thread"] == "ok" and said["program"] == "ok", said
    if pool.spec.isolation == "none":
        return
    assert {said[name] for name in ("add_key", "keyctl", "unshare", "process_vm_readv", "clone", "io_uring_setup",
                                    "syslog", "utime", "msgget")} == {"EPERM"}, said
    assert said["fadvise"] == "ENOSYS", said  # as on a kernel without it: a hint its callers may ignore


def test_a_job_sees_a_private_dev_of_the_nodes_it_needs(pool):
    """The host's /dev is shared state: a pty master's timestamps carried a hidden size from one
    worker to the next (red team), /dev/kmsg is the kernel's log. A strict job's /dev holds the
    basic nodes and its GPUs' only; a pty it opens (under bubblewrap) is of an instance of its own."""
    if pool.spec.isolation == "none" or not isolation.mechanism(pool.spec.isolation).mountns:
        pytest.skip("no mount namespace here: the host's /dev is shown")
    outcome = run_job(pool, "devices")
    said = outcome.message
    assert said["null"] == "ok" and said["urandom"], said
    assert {"kmsg", "fuse", "console", "loop0", "tty1"}.isdisjoint(said["names"]), said["names"]
    assert said["kmsg"] == "ENOENT" and said["fuse"] == "ENOENT", said
    assert {"null", "zero", "full", "random", "urandom", "fd", "shm"} <= set(said["names"]), said["names"]
    assert said["ptmx"] in (False, "pts/ptmx"), said  # none, or bubblewrap's link to a pty instance of its own


@pytest.mark.parametrize("payload, words", [({"megabytes": 48}, "MiB in"), ({"files": 3000}, "files and folders")],
                         ids=["bytes", "entries"])
@pytest.mark.parametrize("others", ["quiet", "freeing"])
def test_a_folder_past_its_disk_limits_ends_the_job(pool, payload, words, others, monkeypatch):
    """The worker's folder is on the host's disk, where a file's size is capped and their sum and
    number were not (the red team wrote 9 GiB in one verdict); a full disk ends the run that writes
    its archive there."""
    only_once(pool)
    if others == "freeing":  # another process frees as much as the job writes: the file system's free space stands still
        from kernforge.sandbox import session as session_module

        monkeypatch.setattr(session_module, "free_space", lambda folder: (1 << 40, 1 << 30))
    limits = Limits(**{**LIMITS.to_dict(), "disk_bytes": 16 << 20, "disk_entries": 1000})
    with pool.session("sandbox_jobs.hostile:fill_folder", payload, limits) as session:
        with pytest.raises(WorkerFailure) as ended:  # while it writes, or in the minute it waits after
            for _ in range(2):
                assert session.recv(60) == {"written": True}
    assert ended.value.kind is FailureKind.RESOURCE_LIMIT, ended.value
    assert "its folder on the host's disk holds" in ended.value.reason and words in ended.value.reason
