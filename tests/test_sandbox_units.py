"""Sandbox pieces that need no worker: the environment allow-list, framing (of JSON and of
descriptor messages), failure classes, the file-system plan, and the doctor probes."""

from __future__ import annotations

import array
import errno
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest

from kernforge.sandbox import FailureKind, Limits, SandboxError, WorkerSpec
from kernforge.sandbox.env import is_allowed, worker_env
from kernforge.sandbox.isolation import MountOp, describe_isolation, mount_plan
from kernforge.sandbox.fdframes import MAX_TAG_BYTES, FdReader, encode_fd_frame
from kernforge.sandbox.protocol import MAX_FDS_PER_MESSAGE, MAX_FRAME_BYTES, MAX_TAG_CHARS, Channel, FrameBuffer, encode
from kernforge.sandbox.session import classify

PARENT_ENV = {
    "PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "PYTHONPATH": "/src", "CUDA_HOME": "/usr/local/cuda",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "TORCH_CUDA_ARCH_LIST": "9.0",
    "OPENAI_API_KEY": "sk-1", "CUDA_API_KEY": "sk-2", "TRITON_TOKEN": "t", "HF_TOKEN": "t", "MY_PASSWORD": "p",
    "AWS_SECRET_ACCESS_KEY": "s", "GH_CREDENTIALS": "c", "KERNFORGE_API_KEY": "k", "LD_PRELOAD": "/evil.so",
    "SSH_AUTH_SOCK": "/tmp/agent", "HOME": "/root", "TRITON_CACHE_DIR": "/root/.triton", "EDITOR": "vi",
}


@pytest.mark.parametrize("device", ["cpu", "0", "3"])
def test_worker_env_is_an_allow_list_without_secrets(device, tmp_path):
    env = worker_env(WorkerSpec(device=device), tmp_path, PARENT_ENV)
    for name in ("OPENAI_API_KEY", "CUDA_API_KEY", "TRITON_TOKEN", "HF_TOKEN", "MY_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                 "GH_CREDENTIALS", "KERNFORGE_API_KEY", "LD_PRELOAD", "SSH_AUTH_SOCK", "EDITOR"):
        assert name not in env
    for name in ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_HOME", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST"):
        assert env[name] == PARENT_ENV[name]
    for name in ("HOME", "TMPDIR"):
        assert env[name] == str(tmp_path)
    for name in ("TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert Path(env[name]).parent == tmp_path
    if device == "cpu":
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["TRITON_INTERPRET"] == "1"
    else:
        assert env["CUDA_VISIBLE_DEVICES"] == device and "TRITON_INTERPRET" not in env


def test_only_a_trusted_worker_may_join_an_mps_daemons_shared_context(tmp_path):
    """bench/h200.sh mpson: the trusted workers' GPU work in one context; a candidate's worker
    is pointed at a pipe that does not exist, whatever the parent or the spec say."""
    parent = {**PARENT_ENV, "CUDA_MPS_PIPE_DIRECTORY": "/var/tmp/kf-mps-pipe", "CUDA_MPS_LOG_DIRECTORY": "/var/tmp/kf-mps-log"}
    trusted = worker_env(WorkerSpec(device="0", isolation="none"), tmp_path, parent)
    assert trusted["CUDA_MPS_PIPE_DIRECTORY"] == "/var/tmp/kf-mps-pipe"
    for spec in (WorkerSpec(device="0"), WorkerSpec(device="0", env={"CUDA_MPS_PIPE_DIRECTORY": "/var/tmp/kf-mps-pipe"})):
        env = worker_env(spec, tmp_path, parent)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_path}/.no-mps" and "CUDA_MPS_LOG_DIRECTORY" not in env


@pytest.mark.parametrize("name", ["CUDA_KEY", "TORCH_TOKEN_X", "LC_SECRET", "KERNFORGE_PASSWORD", "triton_api_key"])
def test_secret_markers_beat_the_allow_list(name):
    assert not is_allowed(name)


@pytest.mark.parametrize("parent, index, expected", [
    (None, "0", "0"), ("", "1", "1"), ("2,3", "0", "2"), ("2,3", "1", "3"), ("GPU-aa, GPU-bb", "1", "GPU-bb"),
])
def test_gpu_index_is_the_parents_numbering(parent, index, expected, tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": parent} if parent is not None else {}
    assert worker_env(WorkerSpec(device=index), tmp_path, env)["CUDA_VISIBLE_DEVICES"] == expected


def test_gpu_index_beyond_the_parents_view_is_refused(tmp_path):
    with pytest.raises(SandboxError):
        worker_env(WorkerSpec(device="2"), tmp_path, {"CUDA_VISIBLE_DEVICES": "4,5"})


def test_spec_env_is_merged(tmp_path):
    env = worker_env(WorkerSpec(env={"OMP_NUM_THREADS": "2", "PYTHONPATH": "/jobs"}), tmp_path, PARENT_ENV)
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONPATH"] == "/jobs"


@pytest.mark.parametrize("env", [{"HF_TOKEN": "x"}, {"EDITOR": "vi"}, {"TMPDIR": "/tmp"}])
def test_spec_env_refused(env, tmp_path):
    with pytest.raises(SandboxError):
        worker_env(WorkerSpec(env=env), tmp_path, {})


def test_only_a_trusted_worker_keeps_its_compiles_in_a_shared_folder(tmp_path):
    """The reference worker's Triton and Inductor caches outlive it (its torch.compile baselines
    compile once); a candidate's worker may never be given such a folder: what a compiler cache
    holds is code its next reader runs."""
    trusted = worker_env(WorkerSpec(isolation="none", trusted_cache="/cache/compiled"), tmp_path, PARENT_ENV)
    assert trusted["TRITON_CACHE_DIR"] == "/cache/compiled/triton"
    assert trusted["TORCHINDUCTOR_CACHE_DIR"] == "/cache/compiled/inductor"
    assert trusted["PYTHONPYCACHEPREFIX"] == "/cache/compiled/pycache" and "PYTHONDONTWRITEBYTECODE" not in trusted
    candidate = worker_env(WorkerSpec(), tmp_path, PARENT_ENV)
    assert candidate["TRITON_CACHE_DIR"] == f"{tmp_path}/.triton"
    assert candidate["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in candidate
    with pytest.raises(SandboxError, match="trusted workers"):
        WorkerSpec(isolation="strict", trusted_cache="/cache/compiled")


def test_a_trusted_worker_keeps_its_bytecode_in_the_trusted_cache_and_a_candidate_none(tmp_path):
    """Imports compiled from source (an environment installed without bytecode) are kept by a
    trusted worker in its trusted cache, never next to the sources; a candidate's worker writes
    none anywhere (a module's bytecode is code its next importer runs)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "kf_probe_module.py").write_text("VALUE = 1\n")
    parent = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    runs = {"trusted": WorkerSpec(isolation="none", trusted_cache=str(tmp_path / "cache")), "candidate": WorkerSpec()}
    for name, spec in runs.items():
        home = tmp_path / name
        home.mkdir()
        env = worker_env(spec, home, parent) | {"PYTHONPATH": str(source)}
        subprocess.run([sys.executable, "-c", "import kf_probe_module"], env=env, check=True, timeout=60)
    kept = [p.name for p in (tmp_path / "cache" / "pycache").rglob("*.pyc")]
    assert any(name.startswith("kf_probe_module.") for name in kept), kept
    assert not list(source.rglob("*.pyc")) and not list((tmp_path / "candidate").rglob("*.pyc"))


def test_records_round_trip():
    spec = WorkerSpec(device="1", preload=("torch",), warmup="m:f", env={"OMP_NUM_THREADS": "1"}, hidden_paths=("/a",))
    assert WorkerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    trusted = WorkerSpec(isolation="none", trusted_cache="/cache/compiled")
    assert WorkerSpec.from_dict(json.loads(json.dumps(trusted.to_dict()))) == trusted
    limits = Limits(wall_seconds=None, cpu_seconds=5)
    assert Limits.from_dict(json.loads(json.dumps(limits.to_dict()))) == limits


@pytest.mark.parametrize("device", ["cuda", "-1", "cuda:0"])
def test_bad_device_refused(device):
    with pytest.raises(SandboxError):
        WorkerSpec(device=device)


# ---- framing ------------------------------------------------------------------------------------
def test_frames_split_anywhere_reassemble():
    data = encode({"a": 1}) + encode({"b": [1, 2]}) + encode({"c": "é" * 1000})
    for cut in (1, 3, 4, 5, 17, len(data) - 1):
        buf, got = FrameBuffer(), []
        for piece in (data[:cut], data[cut:]):
            buf.feed(piece)
            while (msg := buf.pop()) is not None:
                got.append(msg)
        assert got == [{"a": 1}, {"b": [1, 2]}, {"c": "é" * 1000}]


@pytest.mark.parametrize("raw", [
    struct.pack(">I", MAX_FRAME_BYTES + 1),
    struct.pack(">I", 4) + b"nope",
    struct.pack(">I", 9) + b"[1, 2, 3]",
    struct.pack(">I", 2) + b"\xff\xfe",
    struct.pack(">I", 200_000) + b"[" * 100_000 + b"]" * 100_000,
])
def test_bad_frames_raise_value_error(raw):
    buf = FrameBuffer()
    buf.feed(raw)
    with pytest.raises(ValueError):
        buf.pop()


def test_oversized_message_refused_by_sender():
    with pytest.raises(ValueError):
        encode({"x": "a" * (MAX_FRAME_BYTES + 1)})


# ---- descriptor messages ------------------------------------------------------------------------
@pytest.fixture
def socket_pair():
    """(parent end, worker end) of a descriptor channel, and a Channel on the worker end."""
    parent, worker = socket.socketpair()
    channel = Channel(read_fd=-1, write_fd=-1, fds_fd=worker.detach())
    yield parent, channel
    parent.close()
    channel._fd_socket().close()


def open_fds() -> set[int]:
    return set(map(int, os.listdir("/proc/self/fd")))


def copies_of(fd: int) -> set[int]:
    """This process's descriptors of the file ``fd`` is open on: what another thread of the test
    process opens meanwhile (a judge's pool kept for the session, a client's connection) is not
    counted, where a count of every descriptor was (a CI run failed so)."""
    target = os.fstat(fd)
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.add(int(name))
    return found


def memfd(text: str) -> int:
    fd = os.memfd_create("kf-unit")
    os.write(fd, text.encode())
    return fd


def read_all(reader: FdReader, sock: socket.socket) -> tuple[str, list[int]]:
    while (message := reader.pop()) is None:
        assert reader.receive(sock), "end of stream before a whole message"
    return message


def test_descriptor_messages_both_ways(socket_pair):
    parent, channel = socket_pair
    sent = [memfd("one"), memfd("two")]
    channel.send_fds(sent, "pair ✓")
    channel.send_fds([], "")
    reader = FdReader()
    tag, fds = read_all(reader, parent)
    assert tag == "pair ✓" and [os.pread(fd, 9, 0) for fd in fds] == [b"one", b"two"]
    assert not set(fds) & set(sent), "copies, not the sender's numbers"
    assert read_all(reader, parent) == ("", [])
    parent.sendmsg([encode_fd_frame("back")], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    tag, back = channel.recv_fds()
    assert tag == "back" and [os.pread(fd, 9, 0) for fd in back] == [b"one", b"two"]
    for fd in sent + fds + back:
        os.close(fd)


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 9])
def test_descriptor_frames_split_anywhere_reassemble(socket_pair, cut):
    parent, channel = socket_pair
    frame, fd = encode_fd_frame("split tag"), memfd("x")
    channel._fd_socket().sendmsg([frame[:cut]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    channel._fd_socket().sendall(frame[cut:])
    tag, fds = read_all(FdReader(), parent)
    assert tag == "split tag" and len(fds) == 1
    os.close(fd)
    os.close(fds[0])


@pytest.mark.parametrize("pieces, reason", [
    ([(struct.pack(">I", MAX_TAG_BYTES + 1), 3)], "limit"),
    ([(struct.pack(">I", 2) + b"\xff\xfe", 3)], "not UTF-8"),
    ([(struct.pack(">I", MAX_TAG_CHARS + 1) + b"t" * (MAX_TAG_CHARS + 1), 3)], "characters"),
    ([(struct.pack(">I", 4), 0), (b"body", 3)], "middle of a frame"),
    ([(struct.pack(">I", 4) + b"ab", 2), (b"cd", 1)], "middle of a frame"),
    ([(encode_fd_frame("many"), MAX_FDS_PER_MESSAGE + 5)], "more than"),
])
def test_bad_descriptor_frames_close_every_descriptor(socket_pair, pieces, reason):
    """The reader closes what it received at once, before anyone calls close()."""
    parent, channel = socket_pair
    null = os.memfd_create("kf-sent")  # a file of its own: its copies are the ones sent
    for data, count in pieces:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * count))] if count else []
        channel._fd_socket().sendmsg([data], ancillary)
    before = copies_of(null)
    reader = FdReader()
    with pytest.raises(ValueError, match=reason):
        read_all(reader, parent)
    assert copies_of(null) == before
    os.close(null)


def test_end_of_stream_closes_the_unfinished_message(socket_pair):
    parent, channel = socket_pair
    null = os.memfd_create("kf-sent")
    channel._fd_socket().sendmsg([struct.pack(">I", 9)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null]))])
    channel._fd_socket().close()
    before = copies_of(null)
    reader = FdReader()
    assert reader.receive(parent) and reader.pop() is None
    assert len(copies_of(null) - before) == 1, "the descriptor came with the header"
    assert not reader.receive(parent)
    assert copies_of(null) == before
    os.close(null)


@pytest.mark.parametrize("fds, tag", [
    ([0] * (MAX_FDS_PER_MESSAGE + 1), ""), ([], "t" * (MAX_TAG_CHARS + 1)), ([], b"bytes"), ([-1], ""), (["0"], ""),
])
def test_channel_refuses_what_a_message_cannot_carry(socket_pair, fds, tag):
    with pytest.raises((ValueError, TypeError)):
        socket_pair[1].send_fds(fds, tag)


def test_channel_recv_fds_at_end_of_stream(socket_pair):
    parent, channel = socket_pair
    parent.close()
    with pytest.raises(EOFError):
        channel.recv_fds()


# ---- failure classes ----------------------------------------------------------------------------
LIM = Limits(cpu_seconds=10, file_bytes=1000, processes=8)


@pytest.mark.parametrize("final, report, kind, words", [
    (None, {"signal": signal.SIGSEGV, "cpu_seconds": 0.1}, FailureKind.CRASHED, "SIGSEGV"),
    (None, {"signal": signal.SIGABRT, "cpu_seconds": 0.1}, FailureKind.CRASHED, "SIGABRT"),
    (None, {"signal": signal.SIGKILL, "cpu_seconds": 0.1}, FailureKind.CRASHED, "OOM killer"),
    (None, {"signal": signal.SIGKILL, "cpu_seconds": 11.0}, FailureKind.RESOURCE_LIMIT, "CPU time"),
    (None, {"signal": signal.SIGXCPU, "cpu_seconds": 10.0}, FailureKind.RESOURCE_LIMIT, "CPU time"),
    (None, {"signal": signal.SIGXFSZ}, FailureKind.RESOURCE_LIMIT, "file size"),
    (None, {"exit_code": 0}, FailureKind.EXITED_EARLY, "code 0"),
    (None, None, FailureKind.EXITED_EARLY, "supervisor"),
    ({"status": "returned"}, {"exit_code": 0}, FailureKind.EXITED_EARLY, "returned"),
    ({"status": "raised", "type": "MemoryError", "message": ""}, {"exit_code": 1}, FailureKind.OUT_OF_MEMORY, "MemoryError"),
    ({"status": "raised", "type": "BlockingIOError", "message": "fork", "errno": errno.EAGAIN}, {"exit_code": 1},
     FailureKind.RESOURCE_LIMIT, "process limit of 8"),
    ({"status": "raised", "type": "OSError", "message": "File too large", "errno": errno.EFBIG}, {"exit_code": 1},
     FailureKind.RESOURCE_LIMIT, "file size"),
    ({"status": "raised", "type": "SystemExit", "message": "4", "code": 4}, {"exit_code": 1}, FailureKind.EXITED_EARLY, "sys.exit(4)"),
    ({"status": "raised", "type": "KeyError", "message": "'x'"}, {"exit_code": 1}, FailureKind.EXITED_EARLY, "KeyError"),
])
def test_classify(final, report, kind, words):
    got_kind, reason = classify(final, report, LIM)
    assert got_kind is kind and words in reason


# ---- file-system plan ---------------------------------------------------------------------------
def test_mount_plan_covers_hides_and_binds_back(tmp_path):
    home = tmp_path / "home"
    (home / "venv" / "lib").mkdir(parents=True)
    (home / "secrets").mkdir()
    db = tmp_path / "repo" / "kernforge.db"
    db.parent.mkdir()
    db.write_text("x")
    workdir = "/tmp/kf-sbx-test/work"
    plan = mount_plan(workdir, needed=(str(home / "venv"), str(tmp_path / "repo"), "/usr/lib"),
                      hidden=(str(home), str(db)), drop_uid=False)
    by_path = {op.path: op for op in plan}
    assert by_path["/tmp"] == MountOp("tmpfs", "/tmp", True, 0o1777)
    assert by_path[workdir] == MountOp("bind", workdir, writable=True)
    under_tmp = str(tmp_path).startswith("/tmp/")
    if under_tmp:  # the private /tmp hides the home already: no second cover (its mount point is hidden)
        assert str(home) not in by_path
    else:
        assert by_path[str(home)].kind == "tmpfs" and not by_path[str(home)].writable
    assert by_path[str(home / "venv")] == MountOp("bind", str(home / "venv"))
    assert by_path[str(db)].kind == "hide_file"
    assert "/usr/lib" not in by_path  # visible anyway: not under any cover
    if under_tmp:  # under the private /tmp: bound back in
        assert by_path[str(tmp_path / "repo")] == MountOp("bind", str(tmp_path / "repo"))
    order = [op.path for op in plan]
    if not under_tmp:
        assert order.index(str(home)) < order.index(str(home / "venv"))
    assert order.index("/tmp") < order.index(workdir)


@pytest.mark.parametrize("bound_back", [False, True])
def test_mount_plan_covers_nothing_twice(bound_back):
    """A hidden folder under the private /tmp is hidden by it already: a tmpfs of its own would
    need a mount point the /tmp tmpfs hid (mount(2) makes none). Bound back in, it is covered."""
    hidden = ("/tmp/pytest-of-x/hidden_tests", "/tmp/repo/hidden_tests")
    needed = ("/tmp/repo",) if bound_back else ()
    with mock.patch("os.path.exists", return_value=True), mock.patch("os.path.isdir", return_value=True), \
            mock.patch("os.path.realpath", side_effect=lambda p: p):
        plan = mount_plan("/tmp/w/work", needed=needed, hidden=hidden, drop_uid=False)
    covers = {op.path for op in plan if op.kind == "tmpfs"}
    assert "/tmp/pytest-of-x/hidden_tests" not in covers
    assert ("/tmp/repo/hidden_tests" in covers) is bound_back


def test_mount_plan_never_covers_system_folders():
    plan = mount_plan("/tmp/w/work", needed=(), hidden=("/", "/usr", "/proc"), drop_uid=False)
    # the private temp folders and the private /dev (its device nodes bound back in): never a hidden one
    assert {op.path for op in plan if op.kind == "tmpfs"} == {"/tmp", "/var/tmp", "/dev/shm", "/dev"}
    assert {op.path for op in plan if op.kind == "bind" and op.path.startswith("/dev/")} >= {"/dev/null", "/dev/urandom"}


# ---- doctor probes ------------------------------------------------------------------------------
def test_describe_isolation_answers():
    ok, detail = describe_isolation()
    assert isinstance(ok, bool) and detail
    if ok:
        assert "no network" in detail


def test_probe_docker_never_raises():
    from kernforge.sandbox.docker_probe import probe_docker

    ok, detail = probe_docker()
    assert isinstance(ok, bool) and detail


@pytest.mark.parametrize("command, expected", [
    (("unshare", "--net", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc"), ("unshare", "--mount")),
    (("unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--fork", "--kill-child"),
     ("unshare", "--user", "--map-root-user", "--mount")),
])
def test_a_profiled_worker_keeps_its_file_system_view_but_not_the_namespaces_the_profiler_needs(command, expected):
    """Nsight Compute reaches the process it profiles over loopback TCP and by pid: under a
    network or pid namespace the profiled worker never starts (measured on the H200)."""
    from kernforge.sandbox.isolation import Mechanism, bwrap_command, for_profiler

    mech = Mechanism("namespaces", " ".join(command), netns=True, pidns=True, mountns=True, command=command)
    profiled = for_profiler(mech)
    assert (profiled.name, profiled.command, profiled.netns, profiled.pidns, profiled.mountns) == \
        ("namespaces", expected, False, False, True)
    assert for_profiler(Mechanism("namespaces", "unshare --net", netns=True, command=("unshare", "--net"))).name == "none"
    bwrap = for_profiler(Mechanism("bwrap", "bwrap", netns=True, pidns=True, mountns=True))
    cmd = bwrap_command(bwrap, [], "/tmp/w")
    assert "--unshare-net" not in cmd and "--unshare-pid" not in cmd and "--ro-bind" in cmd
    assert "--unshare-net" in bwrap_command(Mechanism("bwrap", "bwrap", netns=True, pidns=True, mountns=True), [], "/tmp/w")


def test_a_hidden_folder_the_worker_needs_stays_and_its_hidden_files_go():
    """The archive's folder is hidden, unless it is one the worker needs (the checkout that holds
    the package): then only the archive's files are, by name."""
    with mock.patch("os.path.exists", return_value=True), mock.patch("os.path.realpath", side_effect=lambda p: p), \
            mock.patch("os.path.isdir", side_effect=lambda p: not p.endswith(".db")):
        plan = mount_plan("/tmp/w/work", needed=("/srv/checkout", "/srv/venv"),
                          hidden=("/srv/checkout", "/srv/checkout/k.db", "/srv/runs"), drop_uid=False)
    by_path = {op.path: op.kind for op in plan}
    assert "/srv/checkout" not in by_path  # shown as it is
    assert by_path["/srv/checkout/k.db"] == "hide_file" and by_path["/srv/runs"] == "tmpfs"


def test_checkout_metadata_finds_the_history_of_every_checkout_shown(tmp_path):
    """A worker shown a folder of a checkout (a package run from its clone) must not see the
    checkout's history, nor, for a worktree, the history its ``.git`` file names."""
    from kernforge.sandbox.isolation import checkout_metadata

    main = tmp_path / "main"
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (main / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (main / "pkg").mkdir()
    tree = tmp_path / "wt"
    (tree / "pkg").mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'wt'}\n")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert checkout_metadata([str(main / "pkg")]) == (str(main / ".git"),)
    assert set(checkout_metadata([str(tree / "pkg")])) == {
        str(tree / ".git"), str(main / ".git" / "worktrees" / "wt"), str(main / ".git")}
    assert all(not p.startswith(str(plain)) for p in checkout_metadata([str(plain)]))


def test_top_level_folders_outside_the_system_ones_are_hidden(tmp_path):
    """Where users keep checkouts and data (another clone of kernforge holds the built-in tasks'
    metadata): hidden from workers, with the folders they need bound back in."""
    from kernforge.sandbox.isolation import other_roots

    for name in ("usr", "etc", "opt", "work", "home", "srv"):
        (tmp_path / name).mkdir()
    (tmp_path / "a-file").write_text("x")
    assert other_roots(str(tmp_path)) == tuple(str(tmp_path / n) for n in ("home", "srv", "work"))
    plan = mount_plan("/tmp/w/work", needed=("/work/venv", "/work/checkout"), hidden=("/work",), drop_uid=False)
    by_path = {op.path: op.kind for op in plan if op.path.startswith("/work")}
    if os.path.isdir("/work"):
        assert by_path == {"/work": "tmpfs", "/work/venv": "bind", "/work/checkout": "bind"}


def test_a_toolkit_outside_the_system_folders_stays_in_sight(tmp_path):
    """A cluster's module system may put CUDA in a top-level folder of its own: the folders the
    worker's environment names for its toolkits are bound back in; the home folder never is."""
    from kernforge.sandbox.isolation import toolkit_paths

    cuda, lib = tmp_path / "software" / "cuda-13.0", tmp_path / "software" / "lib"
    cuda.mkdir(parents=True)
    lib.mkdir()
    env = {"CUDA_HOME": str(cuda), "LD_LIBRARY_PATH": f"{lib}:relative:{tmp_path / 'missing'}", "PATH": "",
           "ROCM_PATH": os.path.expanduser("~")}
    assert toolkit_paths(env) == (str(cuda.resolve()), str(lib.resolve()))


@pytest.mark.parametrize("children_files", [True, False], ids=["children files", "one walk of /proc"])
def test_a_trusted_tree_is_stopped_whole_without_a_walk_per_stop_and_goes_on_when_thawed(monkeypatch, children_files):
    """A warming worker's tree (trusted code) is stopped before every timed window: its root and
    every descendant, found through the children files (or, where the kernel keeps none, one walk
    of /proc), and all of it goes on once thawed."""
    from kernforge.sandbox import procs

    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); time.sleep(600)'])\n"
              "time.sleep(600)\n")
    root = subprocess.Popen([sys.executable, "-c", script])
    try:
        def tree():
            return procs.descendants(root.pid, procs.snapshot())

        for _ in range(600):
            if len(tree()) == 3:
                break
            threading.Event().wait(0.05)
        members = tree()
        assert len(members) == 3, members
        if not children_files:
            real = os.path.exists
            monkeypatch.setattr(procs.os.path, "exists", lambda p: False if str(p).endswith("/children") else real(p))
        stopped = procs.stop_trusted_tree(root.pid)
        assert stopped == set(members)
        for pid in members:
            assert wait_state(pid, "tT"), f"{pid} runs on"
        procs.thaw(stopped)
        for pid in members:
            assert wait_state(pid, "SR"), f"{pid} stays stopped"
    finally:
        for pid in procs.descendants(root.pid, procs.snapshot())[::-1]:
            procs._signal(pid, signal.SIGKILL)
        root.wait()


def wait_state(pid: int, letters: str) -> bool:
    from kernforge.sandbox import procs

    for _ in range(600):
        if procs._state(pid) and procs._state(pid) in letters:
            return True
        threading.Event().wait(0.01)
    return False
