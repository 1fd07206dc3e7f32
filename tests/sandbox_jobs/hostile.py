"""Job entry points that behave like hostile candidates. Each is ``fn(channel, payload)``.

They run inside sandbox workers started by tests/test_sandbox.py (this folder's parent is put on
the workers' PYTHONPATH). They report what they managed to do; the tests assert on what the
parent sees and on what leaked.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import struct
import sys
import time


def echo(channel, payload):
    """The honest job: what the next candidate in a pool must still get."""
    channel.send({"echo": payload, "uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"),
                  "t": time.monotonic()})


def conversation(channel, payload):
    """A long-lived trusted worker: answers until told to stop."""
    while True:
        msg = channel.recv()
        if msg.get("op") == "stop":
            channel.send({"op": "stopped"})
            return
        channel.send({"op": "answer", "value": msg.get("value", 0) * 2})


def loop_forever(channel, payload):
    while True:
        pass


def allocate_forever(channel, payload):
    hoard = []
    while True:
        hoard.append(b"\x01" * (32 << 20))  # touched pages: resident, not just reserved


def fork_spray(channel, payload):
    """Start as many detached, sleeping children as the limits allow, then hang."""
    started = failed = 0
    for _ in range(payload.get("attempts", 200)):
        try:
            pid = os.fork()
        except OSError:
            failed += 1
            continue
        if pid == 0:
            os.setsid()
            if os.fork() == 0:  # double fork: re-parented away from the job process
                time.sleep(3600)
            os._exit(0)
        started += 1
    channel.send({"started": started, "failed": failed})
    time.sleep(3600)


def wake_each_other(channel, payload):
    """Processes that keep sending SIGCONT to each other: one stopped before its neighbour is
    woken again by it, so a pause that stops each process once leaves some running."""
    pids = [os.getpid()]
    for _ in range(payload.get("children", 6)):
        pid = os.fork()
        if pid == 0:
            pids.append(os.getpid())
            break
        pids.append(pid)
    if os.getpid() == pids[0]:
        channel.send({"pids": pids})
    while True:  # each knows the job and the siblings forked before it; the job knows them all
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def busy_children(channel, payload):
    """A parent and its children all computing (bench/freeze_probe.py: an honest busy job)."""
    pids = [os.getpid()]
    for _ in range(payload.get("children", 6)):
        pid = os.fork()
        if pid == 0:
            while True:
                pass
        pids.append(pid)
    channel.send({"pids": pids})
    while True:
        pass


def fork_bomb(channel, payload):
    channel.send({"bombing": True})
    while True:
        try:
            os.fork()
        except OSError:
            pass


def segfault(channel, payload):
    ctypes.string_at(0)


def hard_exit(channel, payload):
    os._exit(payload.get("code", 0))


def soft_exit(channel, payload):
    sys.exit(payload.get("code", 3))


def send_then_exit(channel, payload):
    channel.send({"last": "words"})
    os._exit(0)


def raise_error(channel, payload):
    raise ValueError("candidate blew up")


def flood(channel, payload):
    chunk = "x" * 65535 + "\n"
    for _ in range(payload["megabytes"] * 16):
        sys.stdout.write(chunk)
        sys.stderr.write(chunk)
    sys.stdout.write("END-OF-STDOUT\n")
    sys.stderr.write("END-OF-STDERR\n")
    channel.send({"flooded": True})


def flood_forever(channel, payload):
    chunk = b"y" * (1 << 20)
    while True:
        os.write(1, chunk)


def kill_parent(channel, payload):
    """Try to kill the supervisor, everything else, and probe the trusted parent."""
    results = {}
    for name, target in (("ppid", os.getppid()), ("init", 1)):
        try:
            os.kill(target, signal.SIGKILL)
            results[name] = "killed"
        except OSError as e:
            results[name] = e.strerror
    try:
        os.kill(payload["trusted_pid"], 0)  # signal 0: permission probe, harmless if it works
        results["trusted"] = "could signal"
    except OSError as e:
        results["trusted"] = e.strerror
    time.sleep(0.2)
    channel.send(results)


def read_secrets(channel, payload):
    """Look for the key everywhere a candidate could: env, every readable /proc/*/environ."""
    found = [f"env {k}" for k, v in os.environ.items() if payload["needle"] in v or "API_KEY" in k]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for leaf in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{leaf}", "rb") as f:
                        if payload["needle"].encode() in f.read():
                            found.append(f"/proc/{pid}/{leaf}")
                except OSError:
                    pass
    channel.send({"found": found})


def connect(channel, payload):
    try:
        with socket.create_connection((payload["host"], payload["port"]), timeout=3) as s:
            s.sendall(b"exfiltrated")
        outcome = "connected"
    except OSError as e:
        outcome = f"refused: {e}"
    channel.send({"outcome": outcome})


def write_outside(channel, payload):
    results = {}
    for path in payload["paths"]:
        try:
            with open(path, "w") as f:
                f.write("escaped")
            results[path] = "written"
        except OSError as e:
            results[path] = e.strerror
    with open(os.path.join(os.getcwd(), "inside.txt"), "w") as f:
        f.write("allowed")
    channel.send(results)


def import_and_poison(channel, payload):
    """Imports a module from a shared folder, then tries to plant bytecode there for the next
    importer (a candidate's worker reads the bytecode trusted code compiled beside the sources)."""
    sys.path.insert(0, payload["folder"])
    module = __import__(payload["module"])
    outcomes = {}
    for path in payload["plant"]:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"planted")
            outcomes[path] = "written"
        except OSError as e:
            outcomes[path] = e.strerror
    channel.send({"value": module.VALUE, "planted": outcomes})


def read_hidden(channel, payload):
    results = {}
    for path in payload["paths"]:
        try:
            with open(path, "rb") as f:
                results[path] = f.read().decode(errors="replace")
        except OSError as e:
            results[path] = f"error: {e.strerror}"
    channel.send(results)


def bad_frame(channel, payload):
    kind = payload["kind"]
    if kind == "oversized":
        os.write(4, struct.pack(">I", 0xFFFFFFF0) + b"{}")
    elif kind == "not_json":
        body = b"this is not json"
        os.write(4, struct.pack(">I", len(body)) + body)
    elif kind == "not_object":
        body = b"[1, 2, 3]"
        os.write(4, struct.pack(">I", len(body)) + body)
    time.sleep(3600)


def burn_cpu_and_ignore_sigxcpu(channel, payload):
    if payload.get("ignore"):
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass


def read_back(channel, payload):
    """The parent passes files through the workdir, by its absolute path, in both directions."""
    where = channel.recv()["workdir"]
    with open(os.path.join(where, "from_parent.txt")) as f:
        text = f.read()
    with open(os.path.join(where, "from_worker.txt"), "w") as f:
        f.write(text.upper())
    channel.send({"read": text})


def broken_warmup():
    raise RuntimeError("warm-up is broken on purpose")


def kernel_state(channel, payload):
    """Try what the seccomp filter refuses (a key in the uid's keyring, a namespace of its own,
    another process's memory) and what a build needs (a thread, a program run to its end)."""
    import ctypes
    import platform
    import subprocess
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    numbers = {"x86_64": {"add_key": 248, "keyctl": 250, "unshare": 272, "process_vm_readv": 310, "clone": 56,
                          "io_uring_setup": 425, "syslog": 103, "msgget": 68},
               "aarch64": {"add_key": 217, "keyctl": 219, "unshare": 97, "process_vm_readv": 270, "clone": 220,
                           "io_uring_setup": 425, "syslog": 116, "msgget": 186}}[platform.machine()]
    results = {}
    for name, args in (("add_key", (b"user", b"kernforge-relay", b"T=3", 3, -4)),  # KEY_SPEC_USER_KEYRING
                       ("keyctl", (0, -4, 0, 0, 0)),  # KEYCTL_GET_KEYRING_ID of the user keyring
                       ("unshare", (0x10000000, 0, 0, 0, 0)),  # CLONE_NEWUSER
                       ("process_vm_readv", (1, 0, 0, 0, 0)),
                       ("clone", (0x10000000 | 0x20000000 | 17, 0, 0, 0, 0)),  # CLONE_NEWUSER|NEWPID, SIGCHLD
                       ("io_uring_setup", (8, 0, 0, 0, 0)),
                       ("syslog", (10, 0, 0, 0, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
                       ("msgget", (0x6B66, 0o1666, 0, 0, 0))):  # a System V queue for a key, IPC_CREAT
        ctypes.set_errno(0)
        got = libc.syscall(numbers[name], *[ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
        if name == "clone" and got == 0:  # the child, in namespaces of its own
            os._exit(0)
        if name == "clone" and got > 0:
            os.waitpid(got, 0)
        results[name] = "ok" if got >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    try:  # a time set on a node every worker shares (the host's /dev/null): a message to the next
        os.utime("/dev/null")
        results["utime"] = "ok"
    except OSError as e:
        results["utime"] = errno.errorcode.get(e.errno, "?")
    try:  # evicting a file's pages (a bit in the page cache every worker reads)
        with open(sys.executable, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        results["fadvise"] = "ok"
    except OSError as e:
        results["fadvise"] = errno.errorcode.get(e.errno, "?")
    box = []
    thread = threading.Thread(target=lambda: box.append(1))
    thread.start()
    thread.join()
    results["thread"] = "ok" if box else "failed"
    results["program"] = "ok" if subprocess.run([sys.executable, "-c", "pass"]).returncode == 0 else "failed"
    channel.send(results)


def fill_folder(channel, payload):
    """Write ``megabytes`` 1 MiB files, or ``files`` empty ones, into its folder; then wait."""
    chunk = os.urandom(1 << 20)
    for i in range(payload.get("megabytes", 0)):
        with open(f"blob{i}", "wb") as f:
            f.write(chunk)
    for i in range(payload.get("files", 0)):
        open(f"f{i}", "w").close()
    channel.send({"written": True})
    time.sleep(60)
    channel.send({"still": "here"})


def devices(channel, payload):
    """What the job's /dev holds, and whether the shared state there opens: a pty master (whose
    timestamps outlived the job on the host's /dev), the kernel's log, fuse."""
    def opens(path, flags=os.O_RDONLY):
        try:
            os.close(os.open(path, flags | os.O_NONBLOCK))
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))

    channel.send({"names": sorted(os.listdir("/dev")), "null": opens("/dev/null", os.O_WRONLY),
                  "urandom": open("/dev/urandom", "rb").read(4) != b"",
                  "kmsg": opens("/dev/kmsg"), "fuse": opens("/dev/fuse", os.O_RDWR),
                  "ptmx": os.readlink("/dev/ptmx") if os.path.islink("/dev/ptmx") else os.path.exists("/dev/ptmx")})
