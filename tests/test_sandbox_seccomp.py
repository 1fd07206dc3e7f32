"""The candidate workers' seccomp filter (sandbox/seccomp.py), installed in a child of the test."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

import pytest

from kernforge.sandbox import seccomp

MACHINES = sorted(seccomp.ARCHES)


@pytest.mark.parametrize("fork", [True, False], ids=["fork", "no_fork"])
@pytest.mark.parametrize("machine", MACHINES)
def test_every_jump_lands_on_the_deny_and_everything_else_on_the_allow(machine, fork):
    """Walk the program for each refused number, another number and another architecture, as the
    kernel would (a tiny classic-BPF interpreter over the ops it uses)."""
    code = seccomp.program(machine, fork)
    ops = [struct.unpack("HBBI", code[i:i + 8]) for i in range(0, len(code), 8)]
    arch, numbers = seccomp.ARCHES[machine]

    clone, clone3 = seccomp.CLONES[machine]

    def run(nr: int, audit_arch: int, flags: int = 0, args: tuple[int, ...] = ()) -> int:
        data = {seccomp.NR: nr, seccomp.ARCH: audit_arch, seccomp.ARG0: flags}
        data |= {seccomp._arg(i): v for i, v in enumerate(args) if i}
        pc = acc = 0
        while True:
            op, jt, jf, k = ops[pc]
            if op == seccomp.LD_W_ABS:
                acc, pc = data[k], pc + 1
            elif op == seccomp.JEQ_K:
                pc += 1 + (jt if acc == k else jf)
            elif op == seccomp.JGE_K:
                pc += 1 + (jt if acc >= k else jf)
            elif op == seccomp.JSET_K:
                pc += 1 + (jt if acc & k else jf)
            else:
                assert op == seccomp.RET_K
                return k

    denied = seccomp.RET_ERRNO | errno.EPERM
    assert {run(nr, arch) for nr in numbers.values()} == {denied}
    assert run(0, arch) == run(39, arch) == seccomp.RET_ALLOW  # read, getpid (x86-64) / io_setup
    assert run(0, 0x40000003) == denied  # another architecture's calling convention (i386)
    if machine == "x86_64":
        assert run(numbers["keyctl"] | seccomp.X32_BIT, arch) == denied and run(seccomp.X32_BIT, arch) == denied
    thread = 0x00010000 | 0x00000100 | 0x00000200 | 0x00000400 | 0x00000800 | 0x00040000 | 0x00080000 | 0x00100000 \
        | 0x00200000  # CLONE_THREAD|VM|FS|FILES|SIGHAND|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID: pthread_create's
    vfork = 0x00004000 | 0x00000100 | 17  # CLONE_VFORK|CLONE_VM|SIGCHLD: posix_spawn's, subprocess's
    assert run(clone, arch, thread) == seccomp.RET_ALLOW
    # a plain fork (SIGCHLD alone) and a vfork: a new process, which fork=False refuses
    assert run(clone, arch, 17) == run(clone, arch, vfork) == (seccomp.RET_ALLOW if fork else denied)
    for number in seccomp.FORKS.get(machine, {}).values():
        assert run(number, arch) == (seccomp.RET_ALLOW if fork else denied)
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000):  # NEWUSER, NEWPID, NEWNET, NEWNS
        assert run(clone, arch, 17 | flag) == run(clone, arch, vfork | flag) == denied
    assert run(clone3, arch) == seccomp.RET_ERRNO | errno.ENOSYS
    # the page cache's controls: eviction and residency probes fail, plain reads and advice pass
    nosys = seccomp.RET_ERRNO | errno.ENOSYS
    assert {run(nr, arch) for nr in seccomp.QUIET[machine].values()} == {nosys}
    preadv2, madvise = seccomp.ARG_CHECKED[machine]
    assert run(preadv2, arch, args=(3, 0, 1, 0, 0, seccomp.RWF_NOWAIT)) == seccomp.RET_ERRNO | errno.EOPNOTSUPP
    assert run(preadv2, arch, args=(3, 0, 1, 0, 0, 0)) == seccomp.RET_ALLOW
    assert run(madvise, arch, args=(0, 4096, seccomp.MADV_PAGEOUT)) == run(madvise, arch, args=(0, 4096, seccomp.MADV_COLD)) \
        == denied
    assert run(madvise, arch, args=(0, 4096, 4)) == seccomp.RET_ALLOW  # MADV_DONTNEED: drops the mapping, not the cache


def _in_a_child(work) -> str:
    """``work()``'s answer, run in a forked child with PR_SET_NO_NEW_PRIVS set (a filter lasts for
    the life of the process that installs it, so never this one)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
            os.write(write, work().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    said = os.read(read, 1000).decode()
    os.close(read)
    return said


@pytest.mark.skipif(platform.machine() not in seccomp.ARCHES, reason="no system call numbers for this machine")
def test_an_installed_filter_refuses_keyrings_and_allows_the_rest():
    def work() -> str:
        said = seccomp.install()
        libc = ctypes.CDLL(None, use_errno=True)
        nr = seccomp.ARCHES[platform.machine()][1]["keyctl"]
        ctypes.set_errno(0)
        got = libc.syscall(nr, 0, -4, 0, 0, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
        key = "refused" if got < 0 and ctypes.get_errno() == errno.EPERM else f"allowed ({got})"
        return f"{said}|{key}|{os.getpid() > 0}|{len(os.listdir('/')) > 0}"

    said = _in_a_child(work)
    assert said == "installed|refused|True|True", said


@pytest.mark.skipif(platform.machine() not in seccomp.ARCHES, reason="no system call numbers for this machine")
def test_a_filter_without_fork_refuses_every_new_process_and_keeps_threads():
    """fork, and vfork with exec (subprocess, posix_spawn: a program started at each call that
    computes from a pipe and ends before any look at the process tree), fail; a thread runs."""
    def work() -> str:
        import subprocess
        import threading

        said = [seccomp.install(fork=False)]
        for start in (lambda: subprocess.run(["/bin/true"], check=True), lambda: os.posix_spawn("/bin/true", ["true"], {}),
                      os.fork):
            try:
                if start() == 0:
                    os._exit(0)
                said.append("started")
            except OSError as e:
                said.append(errno.errorcode.get(e.errno, str(e.errno)))
        ran = []
        thread = threading.Thread(target=lambda: ran.append(1))
        thread.start()
        thread.join()
        return "|".join(said + [f"thread {len(ran)}"])

    said = _in_a_child(work)
    assert said == "installed|EPERM|EPERM|EPERM|thread 1", said
