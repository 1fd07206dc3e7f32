"""The third baseline: a production kernel library's op (Liger-Kernel's RMSNorm, SiLU-and-mul...),
timed beside eager and torch.compile where a task names one (meta.py ``LIBRARY_BASELINE``) and
the library is installed. Trusted code, run by the reference worker: the library's function
lives in the task's meta.py, which no candidate's process ever sees.

``resolve`` says what can be timed: the function and the library's name and version, or why
nothing is (the task names no library; the library is not installed here). A library whose
import or call fails at a shape is reported with its error, never a failed verdict.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kernforge.tasks import runtime
from kernforge.tasks.spec import Task


@dataclass(frozen=True)
class Library:
    """What a task's library baseline resolved to in this process."""

    #: the pip distribution ("liger-kernel"); None when the task names no library
    package: str | None
    version: str | None = None
    fn: Callable[..., Any] | None = None
    #: why there is nothing to time (not covered, not installed)
    missing: str | None = None

    def report(self, **measured: Any) -> dict[str, Any]:
        """The baseline message's ``library`` entry (what the judge reads)."""
        if self.missing is not None:
            return {"library": self.package, "missing": self.missing}
        return {"library": self.package, "version": self.version, **measured}


def resolve(task: Task) -> Library:
    spec = task.library
    if spec is None:
        return Library(None, missing="no library baseline covers this task")
    try:
        version = importlib.metadata.version(spec.package)
    except importlib.metadata.PackageNotFoundError:
        return Library(spec.package, missing=f"{spec.package} is not installed")
    meta = runtime.meta_module(task)
    return Library(spec.package, version, getattr(meta, spec.call))


def measure(task: Task, time_fn: Callable[[Callable[..., Any]], dict[str, Any]]) -> dict[str, Any] | None:
    """The ``library`` entry of a baseline: ``time_fn(fn)`` (timed like eager and compile) with
    the library's name and version, why it is missing, or its error; None when the task names
    no library (nothing to say)."""
    lib = resolve(task)
    if lib.package is None:
        return None
    if lib.fn is None:
        return lib.report()
    try:
        return lib.report(**time_fn(lib.fn))
    except Exception as err:  # the library's own failure (no kernel for this GPU, a shape it refuses): said, not fatal
        return lib.report(error=f"{type(err).__name__}: {str(err)[:300]}")


def warm(task: Task, args: Sequence[Any]) -> None:
    """Call the task's library function once on ``args`` (one call's inputs), where it names one
    and it is installed: its Triton kernels compile and autotune now, outside the baseline's
    timing, which holds the GPU alone (Liger-Kernel's first call compiled for seconds there).
    A failure is the baseline's to report, not this."""
    lib = resolve(task)
    if lib.fn is None:
        return
    try:
        lib.fn(*args)
    except Exception:  # noqa: BLE001 - measure() calls it again and reports why
        pass


def library_baseline(entry: Any) -> dict[str, Any]:
    """The judge's reading of a baseline message's ``library`` entry: ``library`` (name and
    version) and ``library_us`` where it was timed, else ``library_note`` (why not); nothing
    when the task names no library."""
    if not isinstance(entry, dict):
        return {}
    label = f"{entry.get('library')} {entry['version']}" if entry.get("version") else str(entry.get("library"))
    if isinstance(entry.get("median_us"), (int, float)) and entry["median_us"] > 0:
        return {"library": label, "library_us": float(entry["median_us"]), "library_spread_pct": entry.get("spread_pct")}
    return {"library": label, "library_note": str(entry.get("missing") or entry.get("error") or "not timed")}
