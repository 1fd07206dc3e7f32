"""Nsight Compute's record of a candidate's calls: the audit's trusted kernel list.

An audited candidate runs once more in a worker whose parent is ``ncu`` (``WorkerSpec.profiler``;
started as the audit's second verdict begins, verifier/profiled.py):
the profiler sits outside the sandbox and writes its log where the worker cannot reach it. The
harness makes a few calls at one shape inside an NVTX range (``RANGE``) and ncu records every
kernel launched inside it, with the duration the GPU measured (caches flushed before each).
Three facts come from that list, none of them from the candidate's Python:

* kernels that are neither the candidate's own nor torch's bookkeeping (fills, copies, RNG)
  are torch or library compute (THREATS #16) when the task forbids it;
* none of the candidate's own kernels ran: its kernels are ghosts (#17);
* the kernels' device time per call is far above the trusted time of record: the trusted clock
  missed work (the audit fails; nobody is accused).

Holes, stated: the range is pushed in the candidate's process, which could pop it inside
``forward`` and run work outside it (the judge's own checks still see that work's effects); a
candidate can tell that it runs under ncu (its environment) and behave differently there, so
this list adds to the judge's verdict and never replaces it.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

from .checks import Check
from .kernels import is_own
from .defences import Defence, reference_call, register

#: the NVTX range the harness wraps each profiled call in
RANGE = "kernforge-profile"
#: calls profiled (after one warm call outside the range)
CALLS = 5
#: ncu's device time per call may be this many times the trusted time of record (it flushes
#: the caches before every kernel; the trusted clock flushes once per batch)
TIME_RATIO = 1.5

DEFENCE = register(Defence(
    Check.NCU, (16, 17), facts="Nsight Compute's list of the kernels the GPU ran inside the profiled calls, with their durations",
    trusted=True,
    rationale="The driver's own list of launches cannot be rewritten from the candidate's Python: torch compute "
              "there is torch compute, a candidate whose kernels never appear did its work elsewhere, and kernels "
              "that took longer than the trusted clock's time of record mean the clock missed work.",
    remedy="Do the work in your own kernels, launched from forward, and let the timed calls do all of it."))


def lock_path() -> Path:
    return Path(tempfile.gettempdir()) / f"kernforge-ncu-{os.getuid()}.lock"


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """One Nsight Compute session of ours per host at a time (a lock file in the temp folder): two
    judges profiling at once, on one GPU or two, would wait on each other inside ncu, where
    neither can tell that from a worker that died. A judge takes it before its GPU's gate, as a
    worker started ahead holds it (``try_lock``) before its record takes the gate."""
    handle = _lock(fcntl.LOCK_EX)
    try:
        yield
    finally:
        unlock(handle)


def try_lock() -> IO[str] | None:
    """The host's lock (``exclusive``) if it is free now, held until ``unlock``; else None."""
    try:
        return _lock(fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another judge's session or worker started ahead
        return None


def _lock(how: int) -> IO[str]:
    handle = open(lock_path(), "a")
    try:
        fcntl.flock(handle, how)
    except BaseException:
        handle.close()
        raise
    return handle


def unlock(handle: IO[str]) -> None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def available() -> str | None:
    """The ``ncu`` executable, or None."""
    return shutil.which("ncu")


def command(exe: str, log: Path) -> tuple[str, ...]:
    """The profiler prefix of a worker: durations of the kernels inside ``RANGE``, to ``log``."""
    return (exe, "--csv", "--log-file", str(log), "--metrics", "gpu__time_duration.sum", "--cache-control", "all",
            "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", f"{RANGE}/")


@dataclass(frozen=True)
class Launch:
    name: str
    us: float


_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def parse(text: str) -> list[Launch]:
    """The launches of an ncu ``--csv`` log (other lines, ncu's own ``==PROF==`` notes, skipped)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows or "Kernel Name" not in rows[0]:
        return []
    header = rows[0]
    name, value, unit = header.index("Kernel Name"), header.index("Metric Value"), header.index("Metric Unit")
    out = []
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        try:
            out.append(Launch(row[name], float(row[value].replace(",", "")) * _UNITS[row[unit].strip()]))
        except (ValueError, KeyError):
            continue
    return out




@dataclass(frozen=True)
class Profile:
    """What ncu recorded for the profiled calls, and the audit's reading of it."""

    ran: bool
    #: why there is no record (ncu missing or unable to profile here), or ""
    note: str = ""
    launches: tuple[Launch, ...] = ()
    calls: int = 0
    shape: Mapping[str, int] = field(default_factory=dict)
    #: where the profiled run's seconds went (``ncu.wait`` for the GPU and the lock, ``ncu.start``,
    #: ``ncu.attach``, ``ncu.load``, ``ncu.calls``, ``ncu.close``), summed over its tries
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def per_call_us(self) -> float | None:
        return sum(x.us for x in self.launches) / self.calls if self.calls and self.launches else None

    def to_dict(self) -> dict[str, Any]:
        kernels: dict[str, list[float]] = {}
        for x in self.launches:
            entry = kernels.setdefault(x.name[:200], [0, 0.0])
            entry[0] += 1
            entry[1] += x.us
        return {"ran": self.ran, "note": self.note, "calls": self.calls, "shape": dict(self.shape), "per_call_us": self.per_call_us,
                "kernels": {k: {"launches": n, "us": round(t, 3)} for k, (n, t) in kernels.items()},
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


def judge(profile: Profile, own: Sequence[str], allow_torch_ops: bool, trusted_us: float | None) -> str | None:
    """Why the record fails the audit, or None (pure). A record that could not be made fails
    nothing: it is a note."""
    if not profile.ran:
        return None
    if not profile.launches:
        return f"Nsight Compute saw no kernel inside the {profile.calls} profiled calls: the work ran elsewhere"
    mine = [x for x in profile.launches if is_own(x.name, own)]
    if own and not mine:
        names = sorted({x.name[:80] for x in profile.launches})[:4]
        return (f"none of the candidate's kernels ({', '.join(own[:4])}) ran in the profiled calls; the GPU ran "
                f"{', '.join(names)} (THREATS #17)")
    if not allow_torch_ops:
        other = sorted({x.name[:100] for x in profile.launches if not is_own(x.name, own) and not reference_call.is_bookkeeping_kernel(x.name)})
        if other:
            return f"torch or library kernels computed inside the profiled calls: {'; '.join(other[:3])} (THREATS #16)"
    per_call = profile.per_call_us
    if trusted_us and per_call and per_call > TIME_RATIO * trusted_us:
        return (f"Nsight Compute measured {per_call:.2f} us of kernels per call, {per_call / trusted_us:.1f} times the "
                f"trusted time of record ({trusted_us:.2f} us): the trusted clock missed work")
    return None
