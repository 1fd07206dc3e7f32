"""Reading and killing process trees through /proc (Linux).

The parent polices its workers from outside: it sums the resident memory of a worker's whole
tree (RLIMIT_AS would break CUDA, which maps far more address space than it uses) and, when a
session ends, kills every descendant it can find and every process left under the worker's
private uid. Everything here tolerates processes vanishing between two reads.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Sequence

from .protocol import SandboxError

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    rss_bytes: int
    state: str = "R"


def snapshot() -> dict[int, Proc]:
    """Every process visible now, by pid."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        rest = _stat(int(name))
        if len(rest) < 22:
            continue
        procs[int(name)] = Proc(int(name), int(rest[1]), int(rest[21]) * PAGE, rest[0].decode())
    return procs


def descendants(root: int, procs: dict[int, Proc]) -> list[int]:
    """``root`` and everything below it, parents before children."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    order, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in procs or pid == root:
            order.append(pid)
            stack.extend(children.get(pid, ()))
    return order


def stop_trusted_tree(root: int) -> set[int]:
    """SIGSTOP ``root`` and, parents first, every descendant the children files of its main
    threads name (/proc/<pid>/task/<pid>/children); where the kernel keeps no such file, the tree
    of one walk of /proc. The pids stopped, for ``thaw``. For a tree of trusted code only (a
    sandbox worker warming up, before any job: verifier/gate.py ``warming``): no check that each
    member stopped and no second look for a child forked meanwhile, so no walk of /proc per
    stop. That walk, two of them per stop, made the stops of a run's warming workers 0.35 s of
    each verdict on an H100 (session 62: hundreds of processes, a stop before every timed window)."""
    _signal(root, signal.SIGSTOP)
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        found = descendants(root, snapshot())
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        return set(found) | {root}
    stopped, stack = {root}, [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            if kid not in stopped:
                _signal(kid, signal.SIGSTOP)
                stopped.add(kid)
                stack.append(kid)
    return stopped


def threads(pid: int) -> int:
    """How many threads ``pid`` has (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_rss(root: int, procs: dict[int, Proc] | None = None) -> int:
    """Resident bytes of ``root``'s tree. Pages shared after fork are counted once per process,
    which over-estimates: a conservative bound for a limit."""
    procs = snapshot() if procs is None else procs
    return sum(procs[pid].rss_bytes for pid in descendants(root, procs) if pid in procs)


def pids_of_uid(uid: int) -> list[int]:
    """Processes whose real, effective, saved or file-system uid is ``uid``. Read from
    /proc/<pid>/status, not the owner of /proc/<pid>, which a process can turn to root by making
    itself non-dumpable."""
    return list(uid_states(uid))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(root: int, pgid: int | None = None) -> None:
    """SIGKILL ``root``'s process group and its whole tree, and wait until they have died. The tree
    is frozen first (``freeze``), so nothing can fork or be re-parented out of reach between being
    found and being killed."""
    stopped = freeze(root)
    if pgid is not None:
        kill_group(pgid)
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    _wait_dead(stopped)


def _wait_dead(pids: set[int], patience: float = 5.0) -> None:
    """Wait (at most ``patience`` seconds) until each of ``pids`` has died: gone, or a zombie. A
    process killed while stopped still has to be scheduled to run its exit, and until it has, it
    holds its memory, its files and its GPU context; on a loaded machine that takes a while."""
    deadline = time.monotonic() + patience
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {pid for pid in left if _state(pid) not in ("", "Z", "X")}
        if left:
            time.sleep(0.002)


def _state(pid: int) -> str:
    """``pid``'s state letter, or "" when it is gone."""
    rest = _stat(pid)
    return rest[0].decode() if rest else ""


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state first); [] when it is gone.
    The command name sits in parentheses and may itself contain spaces or ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return raw[raw.rfind(b")") + 2 :].split()


def freeze(root: int, uid: int | None = None) -> set[int]:
    """SIGSTOP every process of ``uid`` (a worker's own uid, which everything the candidate's code
    runs as has, a process re-parented out of the tree too), or without one ``root``'s tree,
    re-reading /proc until no new member shows up and every member has actually stopped (a fork
    in flight when SIGSTOP arrived can still complete); the pids stopped (``thaw`` them, or kill
    them: ``kill_tree``). A stopped process launches no GPU work while another lane times
    (verifier/gate.py); with a uid, one pass over /proc per round finds members and states."""
    return freeze_many([(root, uid)])[0][0]


class NotStopped(SandboxError):
    """Some process of a job was still running after every round of ``freeze_many``."""


def freeze_many(targets: Sequence[tuple[int, int | None]]) -> list[tuple[set[int], bool]]:
    """``freeze`` of several jobs at once, each a (root, uid) pair: one pass over /proc per round
    for all of them (a lane that times stops every other lane's job before each window, and a
    pass reads every process's status); per job, the pids stopped and whether every member was
    seen stopped (False: it gave up after the last round)."""
    stopped: list[set[int]] = [set() for _ in targets]
    settled = [False] * len(targets)
    done = [False] * len(targets)
    uids = {uid for _, uid in targets if uid is not None}
    for _ in range(500):
        by_uid = uids_states(uids) if uids else {}
        procs = snapshot() if any(uid is None for _, uid in targets) else {}
        for i, (root, uid) in enumerate(targets):
            if done[i]:
                continue
            if uid is not None:  # the candidate's code runs as the uid; the tree's others are the sandbox's own
                states = by_uid.get(uid, {})
            else:
                states = {pid: procs[pid].state for pid in descendants(root, procs) if pid in procs} if root in procs else {}
            fresh = [pid for pid in states if pid not in stopped[i]]
            # Stopped again: a member not yet stopped may have sent SIGCONT to one that was, and a
            # zombie's state hides threads of its process still running.
            awake = [pid for pid, state in states.items() if state not in "tT"]
            if fresh or awake:
                _stop_all(list(states))
            stopped[i].update(fresh)
            calm = not fresh and all(state in "tTZX" for state in states.values())
            # The states are read after the listing: a member forking in between shows up stopped
            # with its child missing. Once a round saw every member stopped, the next listing holds
            # every child they made; it must find nobody new.
            done[i] = calm and settled[i]
            settled[i] = calm
        if all(done):
            break
        time.sleep(0.001)
    return list(zip(stopped, done))


def _stop_all(pids: list[int], passes: int = 50) -> None:
    """SIGSTOP each of ``pids`` (members of one listing), again while one is seen awake. Members
    that keep sending SIGCONT to each other wake one another faster than /proc can be listed: a
    member woken between two listings ran until the next, waking the others, and a freeze that
    stopped only the members a listing saw awake took hundreds of listings to find them all still
    at once (CI ran out of rounds). Stopping every member again within microseconds of a wake
    leaves the woken one no time to run: it stops before its code goes on. A member in the kernel's
    uninterruptible sleep (D) runs none of its code before it leaves it, and then it stops, so it
    ends the passes too (passes would only spin); the next rounds of ``freeze_many`` see it stopped."""
    for _ in range(passes):
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        if all(_state(pid) in ("", "t", "T", "Z", "X", "D") for pid in pids):
            return


def uid_states(uid: int) -> dict[int, str]:
    """Every process whose real, effective, saved or file-system uid is ``uid`` (``pids_of_uid``),
    with its state letter, from one reading of each /proc/<pid>/status."""
    return uids_states({uid}).get(uid, {})


def uids_states(uids: set[int]) -> dict[int, dict[int, str]]:
    """``uid_states`` of each of ``uids``, from one reading of each /proc/<pid>/status."""
    found: dict[int, dict[int, str]] = {}
    wanted = {str(uid).encode(): uid for uid in uids}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        start = status.find(b"\nUid:")
        if start < 0:
            continue
        owners = {wanted[field] for field in status[start + 5 : status.find(b"\n", start + 1)].split() if field in wanted}
        if owners:
            at = status.find(b"\nState:")
            state = status[at + 7: at + 16].decode(errors="replace").strip()[:1] if at >= 0 else "R"
            for uid in owners:
                found.setdefault(uid, {})[int(name)] = state
    return found


def thaw(pids: set[int]) -> None:
    """SIGCONT what ``freeze`` stopped."""
    for pid in pids:
        _signal(pid, signal.SIGCONT)


def renice_tree(root: int, value: int) -> None:
    """Set the nice value of every thread of ``root``'s tree (nice is per thread on Linux)."""
    for pid in descendants(root, snapshot()):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, value)
            except OSError:
                pass


def sweep_uid(uid: int, patience: float = 10.0) -> bool:
    """Kill every process running as ``uid`` until none is left; False if some survive
    ``patience`` seconds (a process stuck in the kernel, e.g. tearing down a GPU context)."""
    deadline = time.monotonic() + patience
    while True:
        pids = pids_of_uid(uid)
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.01)


# ---- owners: a process named uniquely on this machine, across pid reuse ----------------------------
def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[19].decode()


def owner_id(pid: int | None = None) -> str:
    """``boot/pid/start time`` of a process: names it uniquely on this machine, across pid reuse."""
    pid = os.getpid() if pid is None else pid
    return f"{boot_id()}/{pid}/{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    try:
        boot, pid, start = owner.split("/")
    except ValueError:
        return False
    return boot == boot_id() and pid.isdigit() and _start_time(int(pid)) == start
