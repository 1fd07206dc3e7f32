"""A seccomp filter for a strict worker's job process: kernel interfaces a kernel never needs fail.

Installed by the job process itself before any untrusted code exists in it (after the uid drop
and PR_SET_NO_NEW_PRIVS, before the preload), it binds that process and everything it starts for
their whole life: a filter can be added to, never taken away. Each call below fails with EPERM:

* ``keyctl``, ``add_key``, ``request_key``: the kernel's keyrings belong to a uid and outlive the
  process. Worker uids are leased again and again, so a key one candidate stored was there for
  the next (red team: the shapes each worker was called at, relayed to later ones, until one
  fitted them all), and for the audit of the same code.
* ``unshare``, ``setns``, and ``clone`` with any namespace flag: namespaces of its own (a user
  namespace gives a tmpfs whose pages no limit of the worker's counts: the red team wrote 1 GiB
  into one through ``clone(CLONE_NEWUSER | ...)``; a pid namespace, processes the parent's sweep
  may miss). ``clone3`` passes its flags in memory, where a filter cannot read them: it fails with
  ENOSYS, and the C library falls back to ``clone`` (threads included).
* ``io_uring_*``: a second way into the kernel that runs operations no filter sees.
* With ``fork=False`` (``WorkerSpec.fork``), every new process: ``fork``, ``vfork`` and a
  ``clone`` that does not join the job's thread group. A forked child keeps a copy of the job's
  memory and works beside it, beyond every trace of the job (red team: forked at each call, it
  computed the outputs with torch into a shared buffer of its own and was gone before the call
  returned); a program started with vfork and exec at each call (subprocess, the C library's
  posix_spawn) computed them from what a pipe gave it, and ended before any look at the
  worker's process tree (``Session.strays``) could see it. Threads run as before. A build whose
  tools start programs (nvcc, ptxas) cannot, so a worker that builds kernels for a GPU keeps it.
* ``ptrace``, ``process_vm_readv``, ``process_vm_writev``: other processes' memory.
* ``syslog``: the kernel's log, where a machine that does not restrict it keeps what one worker
  made the kernel say (a crash's fault address, chosen) for the next to read.
* ``msgget``, ``semget``, ``shmget``, ``mq_open``: System V and POSIX IPC, whose objects outlive
  the worker where its IPC namespace is the host's (red team: a message queue carried a value
  from one worker to the next under ``unshare`` without ``--ipc``).
* The page cache's controls: ``fadvise64`` (DONTNEED evicts a file's pages), ``readahead``,
  ``cachestat``, ``preadv2`` with RWF_NOWAIT (an exact probe of residency), ``madvise`` with
  MADV_COLD or MADV_PAGEOUT. The page cache of the files every worker reads outlives each of
  them: a writer evicted and read pages to spell bits, and the next worker probed them (red
  team). The first three fail with ENOSYS, as on a kernel without them; the rest refuse.
  A worker can still bring a page in by reading it, and time its own reads: that part of the
  channel is not closed here (see README, "What the sandbox does not close").
* ``utime``, ``utimes``, ``futimesat``, ``utimensat``: setting a file's times. Anyone who may
  write a file may set its times to "now", and the device nodes a worker needs (/dev/null, its
  GPU's) are the host's, 0666: a writer timed its touch of /dev/null to a hidden size and the
  next worker read it back from the node's mtime (red team). No build or kernel sets a time.

Every call of another architecture's calling convention (``int 0x80`` on x86-64, the x32 ABI)
fails too: the numbers above would not name it. Builds are untouched (a CUDA extension's compile
forks and execs as it likes). Where the kernel has no seccomp, or the architecture is not one
listed here, nothing is installed and ``install`` says why.

Standard library only: the classic BPF program is assembled here (``struct sock_filter``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# classic BPF
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
#: struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (the low half
#: of args[0] first, on these little-endian machines)
NR, ARCH, ARG0 = 0, 4, 16
X32_BIT = 0x40000000
#: clone's namespace flags: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

#: per machine: the audit architecture its system calls report, and the numbers refused
ARCHES = {
    "x86_64": (0xC000003E, {"keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308, "syslog": 103,
                            "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280,
                            "msgget": 68, "semget": 64, "shmget": 29, "mq_open": 240,
                            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "io_uring_setup": 425,
                            "io_uring_enter": 426, "io_uring_register": 427}),
    "aarch64": (0xC00000B7, {"keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "setns": 268, "syslog": 116,
                             "utimensat": 88, "msgget": 186, "semget": 190, "shmget": 194, "mq_open": 180,
                             "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "io_uring_setup": 425,
                             "io_uring_enter": 426, "io_uring_register": 427}),
}
#: per machine: the page cache's controls, which fail with ENOSYS (a hint its callers may ignore):
#: ``fadvise64`` (evicts a file's pages: DONTNEED), ``readahead``, ``cachestat`` (reads residency)
QUIET = {"x86_64": {"fadvise64": 221, "readahead": 187, "cachestat": 451},
         "aarch64": {"fadvise64": 223, "readahead": 213, "cachestat": 451}}
#: per machine: ``clone`` (refused with a namespace flag) and ``clone3`` (ENOSYS)
CLONES = {"x86_64": (56, 435), "aarch64": (220, 435)}
#: per machine: ``preadv2`` (refused with RWF_NOWAIT: an exact probe of the page cache) and
#: ``madvise`` (refused with MADV_COLD or MADV_PAGEOUT: it evicts a file's pages)
ARG_CHECKED = {"x86_64": (327, 28), "aarch64": (286, 233)}
RWF_NOWAIT, MADV_COLD, MADV_PAGEOUT = 0x8, 20, 21
#: ``fork``'s and ``vfork``'s own numbers (aarch64 has neither: its C library uses clone)
FORKS = {"x86_64": {"fork": 57, "vfork": 58}}
#: a clone that joins the job's thread group: a thread, the only clone ``fork=False`` allows
CLONE_THREAD = 0x00010000


def _arg(i: int) -> int:
    """The offset of the low half of ``args[i]`` in struct seccomp_data."""
    return ARG0 + 8 * i


class _Assembler:
    """Classic BPF with forward jumps to named labels, resolved when the program is packed."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, int, str | None, str | None]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def op(self, code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self.ops.append((code, k, jt, jf))

    def pack(self) -> bytes:
        out = []
        for i, (code, k, jt, jf) in enumerate(self.ops):
            offsets = [0 if j is None else self.labels[j] - i - 1 for j in (jt, jf)]
            if not all(0 <= o < 256 for o in offsets):
                raise ValueError(f"a jump of instruction {i} out of reach: {offsets}")
            out.append(struct.pack("HBBI", code, offsets[0], offsets[1], k))
        return b"".join(out)


def program(machine: str, fork: bool = True) -> bytes:
    """The filter for ``machine`` (``platform.machine()``), as packed ``sock_filter`` entries;
    ``fork=False`` refuses every new process too."""
    arch, numbers = ARCHES[machine]
    refused = {**numbers, **({} if fork else FORKS.get(machine, {}))}
    clone, clone3 = CLONES[machine]
    preadv2, madvise = ARG_CHECKED[machine]
    a = _Assembler()
    a.op(LD_W_ABS, ARCH)
    a.op(JEQ_K, arch, jf="deny")  # another architecture's calling convention
    a.op(LD_W_ABS, NR)
    if machine == "x86_64":  # the x32 ABI's calls carry this bit: none is ours to allow
        a.op(JGE_K, X32_BIT, jt="deny")
    for nr in sorted(refused.values()):
        a.op(JEQ_K, nr, jt="deny")
    for nr in sorted(QUIET[machine].values()):
        a.op(JEQ_K, nr, jt="nosys")
    a.op(JEQ_K, clone3, jt="nosys")  # its flags are in memory, where a filter cannot read them
    a.op(JEQ_K, clone, jt="clone")
    a.op(JEQ_K, preadv2, jt="preadv2")
    a.op(JEQ_K, madvise, jt="madvise")
    a.op(RET_K, RET_ALLOW)
    # the calls judged by an argument (classic BPF jumps forward only: the shared returns last)
    a.label("clone")  # a namespace flag denies; without fork, so does a clone that is not a thread
    a.op(LD_W_ABS, _arg(0))
    a.op(JSET_K, CLONE_NEW, jt="deny")
    if not fork:
        a.op(JSET_K, CLONE_THREAD, jf="deny")
    a.op(RET_K, RET_ALLOW)
    a.label("preadv2")
    a.op(LD_W_ABS, _arg(5))
    a.op(JSET_K, RWF_NOWAIT, jt="notsup")
    a.op(RET_K, RET_ALLOW)
    a.label("madvise")
    a.op(LD_W_ABS, _arg(2))
    a.op(JEQ_K, MADV_COLD, jt="deny")
    a.op(JEQ_K, MADV_PAGEOUT, jt="deny")
    a.op(RET_K, RET_ALLOW)
    a.label("deny")
    a.op(RET_K, RET_ERRNO | errno.EPERM)
    a.label("nosys")
    a.op(RET_K, RET_ERRNO | errno.ENOSYS)
    a.label("notsup")
    a.op(RET_K, RET_ERRNO | errno.EOPNOTSUPP)
    return a.pack()


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(fork: bool = True) -> str:
    """Install the filter in this process (PR_SET_NO_NEW_PRIVS must be set already); what was
    done, in words: 'installed', or why not."""
    machine = platform.machine()
    if machine not in ARCHES:
        return f"not installed: no system call numbers for {machine}"
    code = program(machine, fork)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        return f"not installed: {os.strerror(err)}"
    return "installed"
