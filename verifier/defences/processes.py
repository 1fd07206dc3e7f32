"""Helper processes (THREATS #6 and #16 by another road), seen from outside the worker: a kernel's
work is done in the worker's own process, on the calling thread.

A process the candidate starts is beyond every in-process signal: its torch ops are in no trace,
its threads in no count, and it can keep a mapping of the shared arena and write outputs when it
likes (red team: a child forked through a library's fork at the first call, computing every
output with torch, was accepted). The parent reads the worker's process tree from /proc after
the module loaded and once every call is done: a process started then and still alive rejects
the candidate. Builds are not touched: a compiler the import runs has exited by the time the
module has loaded.

What this does not see: a process started and ended inside one call. A CPU judge's workers
cannot fork at all (sandbox/seccomp.py), so there such a process is a new program (vfork and
exec), whose result must come back through the worker: on the CPU that stays the documented limit
of an interpreter verdict (correct outputs, checked by trusted code; who computed them, not), and
on a GPU a host-side helper per call is orders of magnitude slower than a kernel, where the
audit's Nsight Compute record lists the kernels that ran.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.PROCESSES, (6, 21), facts="the worker's process tree, read by the parent from /proc after the load and after the calls",
    trusted=True,
    rationale="Work done in another process is in no trace of the worker and can write the shared memory at any time; "
              "a kernel needs no process of its own.",
    remedy="Do all the work inside forward, in the worker's own process: launch kernels, do not start processes "
           "(a build at import is fine: it ends before the module has loaded)."))


def still_running(strays: Sequence[str], when: str) -> Rejected | None:
    """A rejection if the candidate left processes running ``when``."""
    if not strays:
        return None
    shown = "; ".join(strays[:3]) + (f" and {len(strays) - 3} more" if len(strays) > 3 else "")
    return DEFENCE.reject(Status.SANDBOX_VIOLATION, f"processes it started were still running {when}: {shown}",
                          threat=21, evidence={"processes": list(strays)[:20], "when": when})
