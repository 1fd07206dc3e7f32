"""The third baseline: a production kernel library's op (FlashInfer's or Liger-Kernel's RMSNorm,
SiLU-and-mul...), timed beside eager and torch.compile where a task names one (meta.py
``LIBRARY_BASELINE``, one entry or a list in the order preferred) and the library is installed.
Trusted code, run by the reference worker: the library's function lives in the task's meta.py,
which no candidate's process ever sees.

A library's figure is a claim about the same op: before it is timed, its output on one call's
inputs must agree with the reference's within the tolerance a candidate is held to
(``agreement``). A library that computes something else (another casting mode, the weight
applied after the cast back, an op not done in place where the task's is and left undone) would
otherwise be a baseline for a different op; it is passed over with the reason said, and the next
library in the task's list is tried. So is one that is not installed or whose call fails: the
entry names the library that was timed and why the ones before it were not. A failure of them
all is reported, never a failed verdict.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from kernforge.tasks import runtime
from kernforge.tasks.spec import LibraryBaseline, Task


@dataclass(frozen=True)
class Library:
    """What one of a task's library baselines resolved to in this process."""

    #: the pip distribution ("liger-kernel"); None when the task names no library
    package: str | None
    version: str | None = None
    fn: Callable[..., Any] | None = None
    #: why there is nothing to time (not covered, not installed)
    missing: str | None = None

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}" if self.version else str(self.package)

    def report(self, **measured: Any) -> dict[str, Any]:
        """The baseline message's ``library`` entry (what the judge reads)."""
        if self.missing is not None:
            return {"library": self.package, "missing": self.missing}
        return {"library": self.package, "version": self.version, **measured}


def _one(task: Task, spec: LibraryBaseline) -> Library:
    try:
        version = importlib.metadata.version(spec.package)
    except importlib.metadata.PackageNotFoundError:
        return Library(spec.package, missing=f"{spec.package} is not installed")
    return Library(spec.package, version, getattr(runtime.meta_module(task), spec.call))


def resolve_all(task: Task) -> list[Library]:
    """Every library the task names, in its order, installed or not."""
    return [_one(task, spec) for spec in task.libraries]


def _none_installed(libs: Sequence[Library]) -> Library:
    """What stands for a task's libraries when none of them is installed: each one's reason."""
    return Library(", ".join(str(lib.package) for lib in libs), missing="; ".join(str(lib.missing) for lib in libs))


def resolve(task: Task) -> Library:
    """The first installed library the task names, else why none is (not covered, not installed)."""
    libs = resolve_all(task)
    if not libs:
        return Library(None, missing="no library baseline covers this task")
    return next((lib for lib in libs if lib.fn is not None), None) or _none_installed(libs)


def listing(task: Task) -> list[dict[str, Any]]:
    """The task's libraries in the order tried, each with the version installed here or None
    (``tasks show``: for the operator, never the model)."""
    return [{"package": lib.package, "call": spec.call, "installed": lib.version}
            for spec, lib in zip(task.libraries, resolve_all(task))]


def listing_text(task: Task) -> str:
    rows = listing(task)
    if not rows:
        return "Library baseline: none covers this task."
    named = ", ".join(f"{r['package']} {r['installed']}" if r["installed"] else f"{r['package']} (not installed)" for r in rows)
    return (f"Library baselines, in the order tried (the first installed one whose output agrees with the "
            f"reference is timed): {named}.")


def outputs_of(result: Any, inputs: Sequence[Any], mutated: Sequence[int], want: int) -> list[Any]:
    """A library call's outputs in the reference's order (``want`` of them): collected as a
    candidate's are (what it returns, then the inputs the task writes in place), or, where that
    is not ``want`` outputs, what it returns alone: a library may hand back new tensors in place
    of the ones a task's op writes, as Liger's fused add-RMSNorm does (x's, then the residual's)."""
    collected = runtime.collect_outputs(result, inputs, mutated)
    if len(collected) != want and result is not None and mutated:
        returned = runtime.collect_outputs(result, inputs, ())
        if len(returned) == want:
            return returned
    return collected


def agreement(task: Task, fn: Callable[..., Any], model: Any, inputs: Sequence[Any]) -> str | None:
    """None when ``fn``'s outputs on (copies of) ``inputs`` agree with the reference's within the
    task's tolerances, judged as a candidate's are (compare.compare against the wider reference,
    the task-dtype one beside it); else why not, in words. ``inputs`` are left as they were."""
    import torch

    from . import reference

    try:
        with torch.no_grad():
            high, low = reference.run_reference(model, inputs, task.mutated_inputs)
            copies = reference.clone_inputs(inputs)
            got = outputs_of(fn(*copies), copies, task.mutated_inputs, len(high))
            return _differs(task, got, high, low)
    except Exception as err:  # the library's own failure at this shape: said, the next one tried, never fatal
        return f"{type(err).__name__}: {str(err)[:300]}"


def _differs(task: Task, got: Sequence[Any], high: Sequence[Any], low: Sequence[Any]) -> str | None:
    import torch

    from . import compare

    if len(got) != len(high):
        return f"it gives {len(got)} outputs where the reference gives {len(high)}"
    for j, (g, h, lo) in enumerate(zip(got, high, low)):
        if not isinstance(g, torch.Tensor) or g.shape != h.shape or g.dtype != lo.dtype:
            what = f"{tuple(g.shape)} {str(g.dtype).removeprefix('torch.')}" if isinstance(g, torch.Tensor) else type(g).__name__
            return f"its output {j} is {what}, the reference's {tuple(lo.shape)} {str(lo.dtype).removeprefix('torch.')}"
        found = compare.compare(g, h, task.tolerance(str(lo.dtype).removeprefix("torch.")), low=lo)
        if not found.ok:
            return f"its output {j} differs from the reference: {found.describe()}"
    return None


def disagreements(task: Task, model: Any, inputs: Sequence[Any]) -> dict[str, str | None]:
    """``agreement`` of each installed library the task names, by package (``measure``'s
    ``disagrees``), on one call's ``inputs`` (left as they were)."""
    return {str(lib.package): agreement(task, lib.fn, model, inputs) for lib in resolve_all(task) if lib.fn is not None}


def measure(task: Task, time_fn: Callable[[Callable[..., Any]], dict[str, Any]],
            disagrees: Mapping[str, str | None] | None = None) -> dict[str, Any] | None:
    """The ``library`` entry of a baseline: the first of the task's libraries that is installed,
    agrees with the reference (``disagrees``: each installed package's ``agreement``, where it
    was checked) and times, timed by ``time_fn(fn)`` like eager and compile, with its name and
    version, and why each installed library before it was passed over (``passed_over``: one not
    installed is no news); where none could be timed, why not, one reason per library. None when
    the task names no library (nothing to say)."""
    libs = resolve_all(task)
    if not libs:
        return None
    passed: list[str] = []
    for lib in libs:
        if lib.fn is None:
            continue
        why = (disagrees or {}).get(str(lib.package))
        if why:
            passed.append(f"{lib.label}: {why}")
            continue
        try:
            figures = time_fn(lib.fn)
        except Exception as err:  # the library's own failure (no kernel for this GPU, a shape it refuses)
            passed.append(f"{lib.label}: {type(err).__name__}: {str(err)[:300]}")
            continue
        return lib.report(**figures, **({"passed_over": passed} if passed else {}))
    installed = [lib for lib in libs if lib.fn is not None]
    if not installed:
        return _none_installed(libs).report()
    only = installed[0] if len(installed) == 1 else None
    return {"library": only.package if only else ", ".join(str(lib.package) for lib in installed),
            **({"version": only.version} if only else {}), "error": "; ".join(passed)}


def warm(task: Task, args: Sequence[Any]) -> None:
    """Call each of the task's installed library functions once on ``args`` (one call's inputs):
    their Triton kernels compile and autotune now, outside the baseline's timing, which holds the
    GPU alone (Liger-Kernel's first call compiled for seconds there). A failure is the baseline's
    to report, not this."""
    for lib in resolve_all(task):
        if lib.fn is None:
            continue
        try:
            lib.fn(*args)
        except Exception:  # noqa: BLE001 - measure() calls it again and reports why
            pass


def compile_ahead(task: Task, args: Sequence[Any]) -> None:
    """``warm``'s Triton compiles without its GPU work: each library function called once on meta
    tensors shaped as ``args``, every Triton launch a compile (triton_warmup.compile_only), so that
    a compile made ahead holds the GPU's gate for ``warm``'s launches only, not for Liger-Kernel's
    compiles (13.6 s at once on an H100, session 57). What fails here compiles in ``warm``, as before."""
    import torch

    from .triton_warmup import compile_only

    meta = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
            for a in args]
    try:
        with compile_only(), torch.no_grad():
            warm(task, meta)  # a library's own failure stays inside warm
    except (ImportError, AttributeError):  # no Triton here, or one without these hooks: warm compiles
        pass


def library_baseline(entry: Any) -> dict[str, Any]:
    """The judge's reading of a baseline message's ``library`` entry: ``library`` (name and
    version) and ``library_us`` where it was timed, with ``library_passed_over`` where libraries
    the task prefers were not (why, each), else ``library_note`` (why not); nothing when the task
    names no library."""
    if not isinstance(entry, dict):
        return {}
    label = f"{entry.get('library')} {entry['version']}" if entry.get("version") else str(entry.get("library"))
    if isinstance(entry.get("median_us"), (int, float)) and entry["median_us"] > 0:
        passed = entry.get("passed_over")
        return {"library": label, "library_us": float(entry["median_us"]), "library_spread_pct": entry.get("spread_pct"),
                **({"library_passed_over": "; ".join(map(str, passed))} if isinstance(passed, list) and passed else {})}
    return {"library": label, "library_note": str(entry.get("missing") or entry.get("error") or "not timed")}


def library_flags(base: Mapping[str, Any]) -> list[str]:
    """What a verdict's shape says of its library baseline (``library_baseline``'s reading): why
    none was timed, or which one was and why those the task prefers were passed over."""
    if base.get("library_note"):
        return [f"library baseline unavailable: {str(base['library_note'])[:120]}"]
    if base.get("library_us") and base.get("library_passed_over"):
        return [f"library baseline {base.get('library')}; passed over: {str(base['library_passed_over'])[:160]}"]
    return []
