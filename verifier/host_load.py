"""Whether the host's CPUs were free around a sample of the trusted host clock.

``defences/clock.py`` compares what a candidate's worker says a request took with the trusted
host clock around it (go sent to done received). An honest worker's figure is the trusted one
less the two processes' wake-ups: microseconds on a free machine, but milliseconds (and, seen
once, 150 ms) when every core is busy, say with torch.compile's workers compiling the next
tasks' baselines. On an H100 an honest seed's 512-call batch of about 1.5 ms was called a cheat
so: its worker said 1.8, 1.2 and 1.1 ms where the trusted clock, wake-ups included, measured
4.9, 4.7 and 2.4 ms.

No trusted clock sees the candidate's wake-up, so the rule asks what the trusted side can see:

* **runnable tasks**: the kernel's count of tasks running or waiting to run on the whole host
  (``/proc/loadavg``), read by the trusted side as the sample is taken. More runnable tasks than
  CPUs means some wait, the candidate's worker among them perhaps.
* **the trusted side's own stalls**: the reference worker spins while it waits for done; the
  longest pause between two of its polls is time it was not running (preempted, or anything
  else): the machine was not free for it either.

A sample is *quiet* when every reading saw no more runnable tasks than CPUs and no stall above
``STALL_S``; only then may the clock rule use its tight margin. Anything unreadable counts as
busy: the rule then needs a lie larger than any wake-up (``clock.LOADED_MARGIN_S``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

#: a pause of the trusted side's spin longer than this is a stall (a poll takes microseconds;
#: waking an idle core can take a hundred)
STALL_S = 2e-4
LOADAVG = "/proc/loadavg"


def runnable(path: str = LOADAVG) -> int | None:
    """Tasks running or runnable on the host now (the kernel's count, ``/proc/loadavg``'s
    fourth field before its slash), or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.read().split()
        return int(fields[3].split("/", 1)[0])
    except (OSError, IndexError, ValueError):
        return None


def cpus() -> int:
    """CPUs the host's runnable tasks share (the count is host-wide, so are these)."""
    return os.cpu_count() or 1


@dataclass
class Watch:
    """The readings of one sample: the most runnable tasks seen, the longest stall; ``read``
    is the counter (a test's stand-in for ``/proc/loadavg``)."""

    read: Callable[[], int | None] = runnable
    #: the most runnable tasks a reading saw; None before a reading, or after one failed
    most: int | None = None
    unreadable: bool = False
    stall_s: float = 0.0

    def look(self) -> None:
        n = self.read()
        self.unreadable |= n is None
        self.most = None if self.unreadable else max(self.most or 0, n)

    def stalled(self, seconds: float) -> None:
        self.stall_s = max(self.stall_s, seconds)

    def facts(self) -> dict[str, float]:
        """What the judge reads (``quiet``): the readings, as a reply's steps carry them
        (a count that could not be read, or was never read, is left out)."""
        out = {"stall_max": self.stall_s}
        if self.most is not None:
            out["runnable_max"] = float(self.most)
        return out


def quiet(facts: dict[str, float], cpu_count: int | None = None) -> bool:
    """Whether a sample's readings (``Watch.facts``) show a host with a core free for every
    runnable task and the trusted side never stalled."""
    most = facts.get("runnable_max")
    stall = facts.get("stall_max", 0.0)
    return most is not None and most <= (cpu_count or cpus()) and stall <= STALL_S
