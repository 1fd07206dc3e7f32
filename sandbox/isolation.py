"""Which isolation this machine offers, and the command line that applies it to a worker.

Mechanisms, strongest first:

* ``bwrap`` (bubblewrap): new network, pid, ipc and uts namespaces; a read-only view of the
  whole file system in which only the worker's private directory is writable, with private
  /tmp, /var/tmp and /dev/shm, and a private /dev holding the basic device nodes and the GPUs'
  (``BASIC_DEVICES``, ``GPU_DEVICES``), never the host's whole /dev.
* ``namespaces`` (util-linux ``unshare``, e.g. the H200 host, which has no bwrap): new network,
  pid and mount namespaces and a fresh /proc; the worker's supervisor then builds the same view
  itself (see mounts.py): private temp dirs, hidden folders, every other mount remounted
  read-only. Where a container refuses part of that, the strongest variant that works is used
  (down to a network namespace alone) and ``describe_isolation`` says what is missing.
* ``none``: environment scrub, resource limits and process-group kill only.

Under both namespace mechanisms a root parent also drops each worker to a uid of its own (see
uids.py). The file-system plan is the same for both: ``mount_plan`` computes it once and either
bwrap arguments or the supervisor carry it out.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .protocol import SandboxError

#: Private, writable in-memory folders every strict worker gets, and their size cap. tmpfs pages
#: are not in any process's resident set, so they are capped here rather than by the RSS monitor.
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
TMPFS_BYTES = 512 * 1024**2
#: Never covered, whatever a spec or $HOME says.
NEVER_COVER = frozenset({"/", "/proc", "/dev", "/sys", "/usr", "/bin", "/lib", "/lib64", "/etc"})
#: A strict worker's /dev is a private tmpfs holding only these of the host's device nodes, and
#: its GPUs' (``device_nodes``). The host's /dev is shared state: a pty master's timestamps
#: (/dev/ptmx, 0666, set in 8-second steps on every read and write) carried a hidden size from one
#: worker to the next (red team), /dev/kmsg is the kernel's log, and /dev/fuse opens to anyone.
BASIC_DEVICES = ("null", "zero", "full", "random", "urandom")
#: the prefixes of the GPU's nodes: NVIDIA's (nvidiactl, nvidia0.., nvidia-uvm, nvidia-caps/ for
#: MIG), and AMD's compute and render nodes where they are
GPU_DEVICES = ("nvidia", "kfd", "dri")
#: the links a /dev holds for programs that open a descriptor by name
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"))


@dataclass(frozen=True)
class Mechanism:
    name: str  # "bwrap", "namespaces" or "none"
    detail: str
    netns: bool = False
    pidns: bool = False
    mountns: bool = False
    #: command prefix for "namespaces" (the strongest unshare variant that works here)
    command: tuple[str, ...] = ()
    #: bwrap supports --perms/--size (bubblewrap >= 0.5)
    bwrap_perms: bool = False


@dataclass(frozen=True)
class MountOp:
    """One step of a worker's file-system view, applied in order.

    ``tmpfs``: an empty in-memory folder over ``path`` (``mode``; writable when it is a private
    temp dir). ``bind``: ``path`` bound onto itself again after a tmpfs above it hid it (a device
    node too, writable). ``hide_file``: /dev/null bound over a file. ``link``: a symbolic link at
    ``path`` to ``target`` (in the private /dev)."""

    kind: str
    path: str
    writable: bool = False
    mode: int = 0o755
    target: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _run(cmd: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{cmd[0]}: {e}"
    return done.returncode == 0, (done.stderr or done.stdout).strip()[-300:]


@functools.lru_cache(maxsize=None)
def probe_bwrap() -> tuple[bool, str, bool]:
    exe = shutil.which("bwrap")
    if not exe:
        return False, "bwrap not installed", False
    ok, err = _run([exe, "--die-with-parent", "--unshare-net", "--unshare-pid", "--ro-bind", "/", "/",
                    "--dev-bind", "/dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "true"])
    if not ok:
        return False, f"bwrap cannot create namespaces here: {err}", False
    version = _run([exe, "--version"])[1]
    perms = _run([exe, "--ro-bind", "/", "/", "--perms", "1777", "--size", "4096", "--tmpfs", "/tmp", "true"])[0]
    return True, version or "bwrap", perms


#: unshare variants, strongest first: a container may refuse a fresh /proc or a mount namespace
#: yet still allow a network namespace.
UNSHARE_VARIANTS = (
    # IPC and UTS of its own too: System V and POSIX IPC objects outlive the worker otherwise, and
    # a message queue carried a value from one worker to the next (red team)
    ("--net", "--pid", "--ipc", "--uts", "--mount", "--fork", "--kill-child", "--mount-proc"),
    ("--net", "--pid", "--ipc", "--uts", "--mount", "--fork", "--kill-child"),
    ("--net", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc"),
    ("--net", "--pid", "--mount", "--fork", "--kill-child"),
    ("--net", "--pid", "--fork", "--kill-child"),
    ("--net",),
)


@functools.lru_cache(maxsize=None)
def probe_unshare() -> tuple[bool, str, tuple[str, ...]]:
    if not shutil.which("unshare"):
        return False, "unshare (util-linux) not installed", ()
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    error = ""
    for flags in UNSHARE_VARIANTS:
        command = ("unshare",) + user + flags
        ok, error = _run(list(command) + ["true"])
        if ok:
            return True, " ".join(command), command
    return False, f"unshare cannot create namespaces here: {error}", ()


def mechanism(level: str) -> Mechanism:
    """The mechanism for a WorkerSpec.isolation level (SandboxError if a demanded one is missing).
    KERNFORGE_SANDBOX_MECHANISM (bwrap, namespaces, none) overrides "strict" for comparisons."""
    if level == "none":
        return Mechanism("none", "trusted worker: environment scrub and process-group kill")
    if level == "strict":
        level = os.environ.get("KERNFORGE_SANDBOX_MECHANISM", "strict")
    bwrap_ok, bwrap_detail, perms = probe_bwrap()
    if level in ("strict", "bwrap") and bwrap_ok:
        return Mechanism("bwrap", bwrap_detail, netns=True, pidns=True, mountns=True, bwrap_perms=perms)
    if level == "bwrap":
        raise SandboxError(f"isolation 'bwrap' demanded but unavailable: {bwrap_detail}")
    unshare_ok, unshare_detail, command = probe_unshare()
    if level in ("strict", "namespaces") and unshare_ok:
        return Mechanism("namespaces", unshare_detail, netns=True, pidns="--pid" in command,
                         mountns="--mount" in command, command=command)
    if level == "namespaces":
        raise SandboxError(f"isolation 'namespaces' demanded but unavailable: {unshare_detail}")
    return Mechanism("none", f"no namespaces: {bwrap_detail}; {unshare_detail}")


#: unshare's flags that a profiler above the worker cannot cross: Nsight Compute talks to the
#: process it profiles over loopback TCP and follows it by pid (measured on the H200: under
#: ``--net`` or ``--pid`` its target never starts; under ``--mount`` alone it is profiled)
_PROFILER_BLOCKERS = ("--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc")


def for_profiler(mech: Mechanism) -> Mechanism:
    """``mech`` as a worker under a profiler gets it: the file-system view, the private uid and
    everything else, but the host's network and pid namespaces (the profiler's link to it). Used
    only for the audit's profiled run of a kernel the judge already accepted."""
    if mech.name == "namespaces":
        command = tuple(flag for flag in mech.command if flag not in _PROFILER_BLOCKERS)
        if "--mount" not in command:  # nothing left to unshare: no prefix at all
            return Mechanism("none", f"{mech.detail}, less the network and pid namespaces (a profiler above it)")
        return Mechanism("namespaces", " ".join(command), netns=False, pidns=False, mountns=True, command=command)
    if mech.name == "bwrap":
        return Mechanism("bwrap", mech.detail, netns=False, pidns=False, mountns=True, bwrap_perms=mech.bwrap_perms)
    return mech


def make_undumpable() -> None:
    """Make this process non-dumpable: a job that runs under the same uid and can see it (a parent
    without a pid namespace between them, or a container's supervisor) then cannot ptrace it or
    read its /proc/<pid>/environ (API keys) or memory."""
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# ---- the file-system view ------------------------------------------------------------------------
def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def under(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or inside it (by name; no links are resolved)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.lru_cache(maxsize=None)
def python_paths() -> tuple[str, ...]:
    """Folders a worker must be able to read: the interpreter, its libraries, kernforge."""
    package_root = Path(__file__).resolve().parents[1]
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)),
                  str(package_root)}
    candidates.update(p for p in sys.path if p and os.path.isabs(p))
    return outermost(p for c in candidates if os.path.exists(c) for p in {os.path.abspath(c), os.path.realpath(c)})


#: the top-level folders of a Linux system that hold its programs, libraries and configuration
#: (the CUDA toolkit and driver included): a worker sees these, what it needs (the interpreter,
#: its packages, kernforge's worker packages) and nothing else of the top level
SYSTEM_ROOTS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "run", "var",
                          "dev", "proc", "sys", "tmp", "nix", "gnu"})


def other_roots(root: str = "/") -> tuple[str, ...]:
    """The top-level folders outside ``SYSTEM_ROOTS``: where users keep checkouts, data and homes.
    A copy of kernforge there (a clone, a colleague's checkout, a mirror) holds the built-in
    tasks' metadata, which hiding this copy's files by path does not reach (red team: a worker
    read the hidden shapes from another clone on the host). Folders a worker needs inside one
    are bound back in (mount_plan)."""
    try:
        return tuple(os.path.join(root, e.name) for e in sorted(os.scandir(root), key=lambda e: e.name)
                     if e.name not in SYSTEM_ROOTS and e.is_dir(follow_symlinks=False))
    except OSError:
        return ()


#: variables naming a toolkit a worker's builds and kernels use (a cluster's module system may put
#: CUDA in a top-level folder of its own)
TOOLKIT_VARS = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDNN_HOME", "ROCM_PATH", "HIP_PATH")


def toolkit_paths(env: Mapping[str, str]) -> tuple[str, ...]:
    """Folders of the toolkits ``env`` names, its library path's entries and nvcc's toolkit, where
    they exist: a worker needs them even where they lie outside ``SYSTEM_ROOTS``. Never the home
    folder or one holding it (its secrets stay hidden)."""
    found = [env.get(name, "") for name in TOOLKIT_VARS]
    found += env.get("LD_LIBRARY_PATH", "").split(":")
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        found.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    home = os.path.realpath(os.path.expanduser("~"))
    kept = [os.path.realpath(p) for p in found if p and os.path.isabs(p) and os.path.isdir(p)]
    return tuple(p for p in dict.fromkeys(kept) if not under(home, p))


#: what a worker needs of kernforge's own folder: the package's top and the three packages its
#: worker side runs (tasks/builtin inside is hidden with the tasks' metadata)
WORKER_PARTS = frozenset({"__init__.py", "__pycache__", "sandbox", "verifier", "tasks"})


def package_extras() -> tuple[str, ...]:
    """Everything else in kernforge's folder: run from a checkout, that folder is the checkout's
    root, and its docs, tests and benches quote hidden shapes of the built-in tasks (an example
    report's tables, a test's expected prompt), beside the loop, the prompts and the archive code
    no worker imports (red team: a worker read them)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return tuple(str(p) for p in sorted(root.iterdir()) if p.name not in WORKER_PARTS)
    except OSError:
        return ()


#: a version-control checkout's metadata: its history holds every file it ever held
VCS_FOLDERS = (".git", ".hg", ".svn", ".jj", ".bzr")


def checkout_metadata(paths) -> tuple[str, ...]:
    """The version-control metadata of every checkout that ``paths`` (folders a worker is shown)
    lie in or hold at their top: kernforge run from a checkout shows its package folder, the
    checkout's root, and the history in ``.git`` holds the built-in tasks' metadata (their hidden
    shapes), which the sandbox hides by path only. A ``.git`` file (a worktree, a submodule)
    names the folder that holds the history: that one too."""
    found: list[str] = []
    for path in paths:
        folder = Path(os.path.realpath(path))
        for where in (folder, *folder.parents):
            for name in VCS_FOLDERS:
                meta = where / name
                if meta.is_dir():
                    found.append(str(meta))
                elif meta.is_file():
                    found += [str(meta)] + _git_dirs_named_by(meta)
    return tuple(dict.fromkeys(found))


def _git_dirs_named_by(link: Path) -> list[str]:
    """The git folders a ``.git`` file points at (``gitdir:``), and their common folder."""
    try:
        text = link.read_text(errors="replace")[:4096]
    except OSError:
        return []
    named = []
    for line in text.splitlines():
        if line.startswith("gitdir:"):
            gitdir = (link.parent / line.split(":", 1)[1].strip()).resolve()
            named.append(str(gitdir))
            try:
                common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
                named.append(str(common))
            except OSError:
                pass
    return [n for n in named if os.path.isdir(n)]


def outermost(paths) -> tuple[str, ...]:
    """``paths`` without those inside another of them, sorted."""
    kept: list[str] = []
    for p in sorted(set(paths), key=_depth):
        if not any(under(p, k) for k in kept):
            kept.append(p)
    return tuple(sorted(kept))


def closed_ancestors(path: str) -> list[str]:
    """Ancestors of ``path`` that users other than their owner cannot traverse."""
    closed, current = [], "/"
    for part in Path(path).parts[1:-1]:
        current = os.path.join(current, part)
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                closed.append(current)
        except OSError:
            break
    return closed


def unreadable_for_others(paths) -> list[str]:
    """Paths another uid could not read even once every closed ancestor is covered."""
    bad = []
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        need = (stat.S_IROTH | stat.S_IXOTH) if stat.S_ISDIR(mode) else stat.S_IROTH
        if mode & need != need:
            bad.append(p)
    return bad


def device_nodes(dev: str = "/dev") -> tuple[str, ...]:
    """The host's device nodes a strict worker keeps in its private /dev (``BASIC_DEVICES`` and
    the GPUs' ``GPU_DEVICES``), those that exist here."""
    try:
        names = os.listdir(dev)
    except OSError:
        return ()
    kept = [n for n in BASIC_DEVICES if n in names] + sorted(n for n in names if n.startswith(GPU_DEVICES))
    return tuple(f"{dev}/{n}" for n in kept)


def mount_plan(workdir: str, needed: tuple[str, ...], hidden: tuple[str, ...], drop_uid: bool) -> list[MountOp]:
    """The ordered steps that give a worker its view: private temp dirs, hidden folders covered,
    folders it needs bound back in, and (for a dropped uid) closed ancestors opened up. A hidden
    folder that is itself one the worker needs is not covered: what inside it must be hidden is
    named file by file (an archive in the checkout that holds the package)."""
    covers: dict[str, MountOp] = {p: MountOp("tmpfs", p, True, 0o1777) for p in PRIVATE_TMP}
    covers["/dev"] = MountOp("tmpfs", "/dev")  # private: the device nodes are bound back in, no more
    files: list[MountOp] = []
    hidden_dirs: set[str] = set()
    shown = {os.path.realpath(p) for p in (workdir, *needed)}
    for raw in hidden:
        path = os.path.realpath(raw)
        if path in NEVER_COVER or path in covers or not os.path.exists(path):
            continue
        if path in shown:  # a folder the worker needs is never hidden whole: what it holds is, by name
            continue
        if os.path.isdir(path):
            covers[path] = MountOp("tmpfs", path)
            hidden_dirs.add(path)
        else:
            files.append(MountOp("hide_file", path))
    binds = [MountOp("bind", workdir, writable=True)]
    binds += [MountOp("bind", p) for p in needed if p != workdir]
    binds += [MountOp("bind", node, writable=True) for node in device_nodes()]
    if drop_uid:
        for op in binds:
            for folder in closed_ancestors(op.path):
                if folder not in NEVER_COVER:
                    covers.setdefault(folder, MountOp("tmpfs", folder))
    # A bind is needed only where a cover hides the path; covers inside a bind come after it.
    binds = [b for b in binds if any(under(b.path, c) and b.path != c for c in covers)]
    # A hidden folder or file already under a cover (and not bound back) needs nothing more: a
    # second tmpfs there would need a mount point the first one hid (bwrap makes one; mount(2)
    # does not), e.g. a hidden folder under /tmp.
    layers = sorted(list(covers.values()) + binds, key=lambda op: _depth(op.path))
    kept = {p: op for p, op in covers.items()
            if p in PRIVATE_TMP or p not in hidden_dirs or _visible(p, [o for o in layers if o is not op])}
    files = [f for f in files if _visible(f.path, layers)]
    links = [MountOp("link", f"/dev/{name}", target=target) for name, target in DEV_LINKS]
    ops = list(kept.values()) + binds + files + links
    return sorted(ops, key=lambda op: (_depth(op.path), op.kind != "tmpfs"))


def _visible(path: str, layers: list[MountOp]) -> bool:
    enclosing = [op for op in layers if under(path, op.path)]
    return not enclosing or enclosing[-1].kind == "bind"


def bwrap_command(mech: Mechanism, plan: list[MountOp], workdir: str) -> list[str]:
    cmd = (["bwrap", "--die-with-parent", "--new-session"] + (["--unshare-net"] if mech.netns else [])
           + (["--unshare-pid"] if mech.pidns else [])
           + ["--unshare-ipc", "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
    covers = [op.path for op in plan if op.kind == "tmpfs"]
    made: set[str] = set()
    for op in plan:
        # bwrap's --dev is the private /dev: the basic nodes, its links and a pty instance of its own
        if op.path == "/dev" or op.kind == "link" or op.path in (f"/dev/{n}" for n in BASIC_DEVICES):
            continue
        if op.kind == "bind" and under(op.path, "/dev") and op.path != "/dev/shm":
            cmd += ["--dev-bind", op.path, op.path]  # a GPU's node: nodev would refuse its open
            continue
        if op.kind == "tmpfs":
            if mech.bwrap_perms:
                cmd += ["--perms", f"{op.mode:04o}", "--size", str(TMPFS_BYTES)]
            cmd += ["--tmpfs", op.path]
        elif op.kind == "bind":
            # bwrap would create the folders leading to a bind inside a tmpfs with mode 0700,
            # closing them to a dropped uid: create them traversable first.
            for folder in map(str, reversed(Path(op.path).parents)):
                if folder not in made and any(under(folder, c) and folder != c for c in covers):
                    made.add(folder)
                    cmd += (["--perms", "0755"] if mech.bwrap_perms else []) + ["--dir", folder]
            cmd += ["--bind" if op.writable else "--ro-bind", op.path, op.path]
        else:
            cmd += ["--ro-bind", "/dev/null", op.path]
    return cmd + ["--chdir", workdir, "--"]


# ---- doctor --------------------------------------------------------------------------------------
def describe_isolation() -> tuple[bool, str]:
    """One line for ``kernforge doctor``: what a strict worker gets here. Never raises."""
    try:
        mech = mechanism("strict")
    except (SandboxError, OSError) as e:
        return False, f"cannot determine: {e}"
    from .uids import uid_drop_status

    drop_ok, drop_detail = uid_drop_status(mech)
    if mech.name == "none":
        return False, (f"NO network isolation ({mech.detail}); workers get environment scrub, rlimits, "
                       f"memory polling and process-group kill only; {drop_detail}")
    parts = ["no network", "pid namespace" if mech.pidns else "NO pid namespace"]
    if mech.mountns:
        parts.append("read-only file system (private workdir, /tmp, /dev/shm), home hidden")
    else:
        parts.append("file system NOT read-only (no mount namespace)")
    text = f"{mech.detail if mech.name == 'bwrap' else 'namespaces via ' + mech.detail}: {', '.join(parts)}"
    import platform

    from .seccomp import ARCHES

    calls = ("keyrings, IPC, new namespaces, io_uring, other processes' memory, file times, the page cache's controls and "
             "the kernel's log refused, and new processes in CPU workers (seccomp)" if platform.machine() in ARCHES
             else f"NO system call filter ({platform.machine()})")
    return True, f"{text}; {drop_detail}; rlimits cpu/fsize/nproc/core; memory polled; {calls}"
