"""The worker: ``python -m kernforge.sandbox.worker CONFIG`` (started by process.py, never by hand).

Generic: it knows nothing about kernels. Two processes:

* the **supervisor** (first, trusted, tiny): applies the mount plan when it owns a fresh mount
  namespace, forks the job process, and waits. When the job process ends it reports the exact
  wait status on the control socket (fd 5) and, inside a private pid namespace, kills whatever
  the job left behind; when the parent goes away (EOF on fd 5) it kills everything. It keeps
  root, so a candidate cannot signal it or forge its report. It keeps none of the job's
  channels: the JSON pipes (fds 3, 4) and the descriptor socket (fd 6) are the job's alone.
* the **job process**: drops to the worker's private uid (or drops every capability), imports
  the preload modules, runs the trusted warmup, says ``ready``, then blocks for one job
  ``{entry, payload, limits}``. It applies the limits it can apply itself (CPU seconds counted
  from what warm-up already used, file size, processes), calls ``entry(channel, payload)``,
  reports how that ended and exits. One job per process.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
from typing import Any, Callable

from . import seccomp
from .protocol import RESERVED_KEY, WORKER_FDS_FD, WORKER_READ_FD, WORKER_WRITE_FD, Channel

CONTROL_FD = 5
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 36, 38, 24, 47
#: Exit codes of the job process that the parent reads as "the sandbox failed", not the job.
EXIT_STARTUP_FAILED = 70

_libc = ctypes.CDLL(None, use_errno=True)


#: Where ``_install_fds`` puts the descriptors the parent passed, in the order it passed them.
INSTALLED_FDS = (WORKER_READ_FD, WORKER_WRITE_FD, CONTROL_FD, WORKER_FDS_FD)


def _install_fds(fds: list[int]) -> None:
    """Move the inherited channels, whatever their numbers, to fds 3, 4, 5 and 6."""
    if len(fds) != len(INSTALLED_FDS):
        raise ValueError(f"the worker needs {len(INSTALLED_FDS)} descriptors, got {fds}")
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds]  # clear of 3..6 while we shuffle
    for fd in fds:
        os.close(fd)
    for target, fd in zip(INSTALLED_FDS, high):
        os.dup2(fd, target)
        os.close(fd)


def resolve(entry: str) -> Callable[..., Any]:
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise ValueError(f"entry must be 'module:function', not {entry!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


# ---- job process --------------------------------------------------------------------------------
def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable capability sets."""
    _libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _become_unprivileged(config: dict) -> None:
    if config.get("uid") is not None:
        os.setgroups(config.get("groups", []))
        os.setgid(config["gid"])
        os.setuid(config["uid"])  # from root: drops every capability as well
    elif config.get("strict"):
        _drop_capabilities()
    if config.get("strict") and _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")


def apply_limits(limits: dict) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # RLIMIT_CPU counts the process's whole life, in whole seconds: the job's budget starts
    # after warm-up's share.
    soft = max(1, round(usage.ru_utime + usage.ru_stime + limits["cpu_seconds"]))
    _lower(resource.RLIMIT_CPU, soft, soft + 1)  # SIGXCPU at soft, SIGKILL at hard
    _lower(resource.RLIMIT_FSIZE, int(limits["file_bytes"]), int(limits["file_bytes"]))
    _lower(resource.RLIMIT_NPROC, int(limits["processes"]), int(limits["processes"]))


def _lower(which: int, soft: int, hard: int) -> None:
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def job_process(config: dict) -> None:
    channel = Channel()
    try:
        if config.get("nice"):
            os.nice(config["nice"])  # warming up must not slow the job being judged next door
        _become_unprivileged(config)
        filtered = (seccomp.install(fork=config.get("fork", True)) if config.get("strict")
                    else "not installed: a trusted worker")
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        cwd = os.getcwd()
        sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
        start = time.monotonic()
        for name in config.get("preload", []):
            importlib.import_module(name)
        steps: dict[str, float] = {"preload": time.monotonic() - start}
        if config.get("warmup"):
            said = resolve(config["warmup"])()
            # a warm-up may say where its time went; else it is one step
            steps.update(said if isinstance(said, dict) else {"warmup": time.monotonic() - start - steps["preload"]})
        channel.send({RESERVED_KEY: "ready", "pid": os.getpid(), "uid": os.getuid(),
                      "warmup_seconds": time.monotonic() - start, "mount_warnings": config.get("mount_warnings", []),
                      "seccomp": filtered, "start_steps": steps})
    except BaseException:
        traceback.print_exc()
        _exit(EXIT_STARTUP_FAILED)
    try:
        job = channel.recv()
    except (EOFError, OSError, ValueError):
        _exit(0)  # the pool closed before handing this worker a job
    if job.get(RESERVED_KEY) != "job":
        print(f"sandbox worker: expected a job frame, got keys {sorted(job)[:10]}", file=sys.stderr)
        _exit(EXIT_STARTUP_FAILED)
    try:
        apply_limits(job["limits"])
        resolve(job["entry"])(channel, job.get("payload", {}))
        outcome = {RESERVED_KEY: "exit", "status": "returned"}
        code = 0
    except BaseException as e:  # the job's failure is reported, whatever it was
        traceback.print_exc()
        outcome = {RESERVED_KEY: "exit", "status": "raised", "type": type(e).__name__,
                   "message": str(e)[:2000], "errno": getattr(e, "errno", None)}
        if isinstance(e, SystemExit):
            outcome["code"] = e.code if isinstance(e.code, int) else str(e.code)[:200]
        code = 1
    try:
        channel.send(outcome)
    except (OSError, ValueError):
        pass
    _exit(code)


# ---- supervisor ---------------------------------------------------------------------------------
def _kill_rest(config: dict) -> None:
    # kill(-1) reaches every process we may signal: only safe inside our own pid namespace, where
    # the supervisor is pid 1 (unshare) or 2 (under bwrap's init). Never on the host.
    if config.get("pidns") and os.getpid() in (1, 2):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap(child: int) -> tuple[int, Any] | None:
    """Reap every finished child; the job process's (status, rusage) if it is among them."""
    found = None
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = (status, usage)


def supervise(child: int, config: dict) -> None:
    for fd in (WORKER_READ_FD, WORKER_WRITE_FD, WORKER_FDS_FD):
        os.close(fd)  # the parent must see the job's end of each channel close when the job ends
    watch = [CONTROL_FD]
    try:
        watch.append(os.pidfd_open(child))
    except (AttributeError, OSError):
        pass  # without pidfd: poll once a second
    ended = None
    while ended is None:
        ready, _, _ = select.select(watch, [], [], 1.0)
        if CONTROL_FD in ready and not os.read(CONTROL_FD, 4096):
            # The parent is gone or closed the session: nothing here may outlive it.
            _kill_rest(config)
            try:
                os.kill(child, signal.SIGKILL)
                if not config.get("pidns"):
                    os.killpg(0, signal.SIGKILL)  # our own group: the job and what it started
            except ProcessLookupError:
                pass
            os._exit(0)
        ended = _reap(child)
    status, usage = ended
    report = {"cpu_seconds": usage.ru_utime + usage.ru_stime, "maxrss_bytes": usage.ru_maxrss * 1024}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["exit_code"] = os.WEXITSTATUS(status)
    try:
        os.write(CONTROL_FD, json.dumps(report).encode() + b"\n")
    except OSError:
        pass
    _kill_rest(config)
    _reap(child)
    os._exit(0)


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    _install_fds(config["fds"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config.get("plan") is not None:
        from .mounts import apply_plan

        config["mount_warnings"] = apply_plan(config["plan"], config["tmpfs_bytes"])
    os.chdir(config["workdir"])
    # Orphans of the job are re-parented here (not to the host's init) so the parent finds them.
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    child = os.fork()
    if child == 0:
        os.close(CONTROL_FD)
        job_process(config)
    supervise(child, config)


if __name__ == "__main__":
    main(sys.argv)
