"""Which task gets the next turn on the devices, so that no task starves the rest.

A night run judges many tasks on few GPUs. Plain round robin gives every task the same number of
turns, so a task whose verdicts take minutes (a slow seed, a reference that compiles for long)
takes most of the device time, and tasks behind it may never get a verdict. Two rules instead:

* **First verdicts first.** A task that has no verdict yet and nothing in flight goes before any
  task that has one: every task gets its first verdict before any gets a second (while a task's
  first proposal is in flight the others go on, so no device waits for it).
* **Fair device time.** After that the next turn goes to the task that has been charged the
  least device time: the seconds its verdicts and audits held a device, plus an estimate for
  each of its proposals still in flight (its mean verdict so far, else the run's). A task whose
  verdicts take ten times longer than the others' gets about a tenth of their turns, so its
  share of the run's device time stays near one task's share. Ties go round robin.

**One verdict is time-boxed** too (``verdict_limit_s``): a candidate's worker on a GPU is killed
once it has run longer than its task can need (start, compile and autotune, then a few seconds
per checked or timed shape, more per GB its calls move), never above the sandbox's general limit:
the judge caps its candidate sessions' limits by these (``Judge.time_box``) and reports a worker
that ran out as a timeout, like any other. On the CPU the interpreter's own per-call timeouts apply unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from kernforge.sandbox.protocol import Limits
from kernforge.tasks import runtime
from kernforge.tasks.spec import Task

#: a GPU verdict's allowance before any shape: a worker's start, the candidate's import (a CUDA
#: C++ extension builds there) and the first Triton compiles and autotuning
VERDICT_BASE_S = 120.0
#: and per shape checked or timed: the checks, the batches, a first call's compile, and (the
#: task's first verdict on a GPU, inside the same worker's wall time) the baselines' static
#: torch.compile at that shape. Guesses from the H200's 11-33 s first verdicts: to be checked there.
VERDICT_PER_SHAPE_S = 10.0
#: and per GB one call moves at each shape (inputs and outputs, from the task's roofline): at
#: KernelBench's default sizes (6-8 GB per call) the H200 took 55-155 s before its verdicts' last
#: step, the reference's float64 work and the compares of every checked call growing with the bytes
VERDICT_PER_GB_S = 20.0


def verdict_limit_s(task: Task, *, cap_s: float | None = Limits().wall_seconds) -> float:
    """The longest one GPU verdict of ``task`` may hold its device (the candidate worker's wall
    limit): a base allowance, a few seconds per shape and more per GB its calls move, never above
    the sandbox's ``cap_s``. A task whose sizes are unknown (no roofline) gets the cap itself."""
    shapes = task.shapes("cuda", hidden=False) + task.shapes("cuda", hidden=True)
    dtype = task.dtype("cuda")
    lines = [runtime.roofline(task, s, dtype) for s in shapes]
    if any(line is None for line in lines):
        limit = float("inf")
    else:
        gigabytes = sum(line.bytes for line in lines if line is not None) / 1e9
        limit = VERDICT_BASE_S + VERDICT_PER_SHAPE_S * len(shapes) + VERDICT_PER_GB_S * gigabytes
    return min(limit, cap_s) if cap_s is not None else limit


@dataclass
class Share:
    """What one task has had of the devices in this session."""

    verdicts: int = 0
    device_s: float = 0.0
    #: verdicts of earlier sessions (a resumed run): they count as verdicts, their device time is unknown
    earlier: int = 0

    @property
    def timed(self) -> int:
        """Verdicts whose device time is in ``device_s``."""
        return self.verdicts - self.earlier


class FairShare:
    """The turn order over a run's tasks (see the module's docstring)."""

    def __init__(self, names: Iterable[str], earlier: Mapping[str, int] | None = None) -> None:
        """``earlier``: verdicts each task had in the sessions before this one (a resumed run), so
        a task that has never had one still goes first. Their device time is not stored, so the
        fair share of device time starts afresh."""
        earlier = earlier or {}
        self.shares = {name: Share(verdicts=earlier.get(name, 0), earlier=earlier.get(name, 0)) for name in names}

    def judged(self, name: str, device_s: float) -> None:
        """A verdict of ``name`` came back after ``device_s`` seconds on a device (0 for a reuse)."""
        share = self.shares.setdefault(name, Share())
        share.verdicts += 1
        share.device_s += max(0.0, device_s)

    def charge(self, name: str, device_s: float) -> None:
        """Device time spent for ``name`` besides a verdict (an audit of a would-be best)."""
        self.shares.setdefault(name, Share()).device_s += max(0.0, device_s)

    def mean_verdict_s(self, name: str) -> float:
        """``name``'s mean device time per verdict; the run's mean before its first; 0 before any."""
        share = self.shares.get(name, Share())
        if share.timed:
            return share.device_s / share.timed
        done = [s for s in self.shares.values() if s.timed]
        return sum(s.device_s for s in done) / sum(s.timed for s in done) if done else 0.0

    def charged_s(self, name: str, pending: int) -> float:
        """Device time ``name`` has had, and is expected to take for its ``pending`` proposals."""
        return self.shares.get(name, Share()).device_s + pending * self.mean_verdict_s(name)

    def order(self, candidates: Sequence[tuple[str, int]]) -> list[str]:
        """``candidates`` (name, proposals in flight), in round-robin order, sorted into the order
        their turns should be offered: first verdicts first, then the least device time charged."""

        def key(item: tuple[int, tuple[str, int]]) -> tuple[int, float, int]:
            index, (name, pending) = item
            waiting_first = self.shares.get(name, Share()).verdicts == 0 and pending == 0
            return (0 if waiting_first else 1, self.charged_s(name, pending), index)

        return [name for _, (name, _) in sorted(enumerate(candidates), key=key)]
