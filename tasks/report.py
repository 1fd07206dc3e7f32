"""Tasks for people: the rows of ``kernforge tasks list`` and the text of ``tasks show``.

``show_text`` is exactly what the model is shown about a task (the prompt uses the same
``public_spec``): reference code, public shapes, dtype, tolerance, roofline. Never hidden shapes.
"""

from __future__ import annotations

from typing import Any

from . import runtime
from .spec import Task, Tolerance

#: Ceilings used to call a task memory- or compute-bound before anything is measured; the
#: verifier replaces them with ceilings measured on the GPU at hand. H200 figures from
#: shared/BASELINES.md: device-to-device copy 4242 GB/s, bf16 dense matmul 691 TFLOP/s.
NOMINAL_BANDWIDTH = 4242e9
NOMINAL_FLOPS = 691e12


def bound(task: Task, device_kind: str = "cuda") -> str:
    """'memory' or 'compute' at the largest public shape, or 'unknown' without a roofline."""
    shapes = task.shapes(device_kind, hidden=False)
    dtype = task.dtype(device_kind)
    best = None
    for shape in shapes:
        line = runtime.roofline(task, shape, dtype)
        if line is not None and (best is None or line.bytes > best.bytes):
            best = line
    if best is None:
        return "unknown"
    return "compute" if best.intensity() > NOMINAL_FLOPS / NOMINAL_BANDWIDTH else "memory"


def list_row(task: Task) -> dict[str, Any]:
    return {
        "name": task.name,
        "public_shapes": [s.label for s in task.public_shapes],
        "dtype": task.dtype("cuda"),
        "bound": bound(task),
        "seed": task.seed_path is not None,
        "interpreter": task.interpreter_unsupported is None,
    }


def roofline_rows(task: Task, device_kind: str = "cuda") -> list[dict[str, Any]]:
    dtype = task.dtype(device_kind)
    rows = []
    for shape in task.shapes(device_kind, hidden=False):
        line = runtime.roofline(task, shape, dtype)
        if line is None:
            continue
        floor = line.floor_seconds(NOMINAL_BANDWIDTH, NOMINAL_FLOPS)
        rows.append(
            {"shape": shape.label, "bytes": line.bytes, "flops": line.flops, "floor_us": floor * 1e6}
        )
    return rows


def output_tolerances(task: Task, device_kind: str = "cuda") -> list[tuple[int, str, Tolerance]]:
    """Each output's dtype on ``device_kind`` and the tolerance it is judged by (outputs are
    judged by their own dtype: an fp8 quantiser's scales are float32, its values fp8). Found by
    running the reference once, on the CPU, on the smallest CPU shape in the device's dtype."""
    import torch

    shape = runtime.smallest_shape(task)
    inputs = runtime.sample_inputs(task, shape, task.dtype(device_kind))
    model = runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 0, "cpu")
    with torch.no_grad():
        outs = runtime.collect_outputs(model(*inputs), inputs, task.mutated_inputs)
    names = [str(o.dtype).removeprefix("torch.") for o in outs]
    return [(i, name, task.tolerance(name)) for i, name in enumerate(names)]


_TOLERANCE_LINES: dict[tuple[str, str, str], list[str]] = {}


def tolerance_lines(task: Task, device_kind: str = "cuda") -> list[str]:
    """One line per output; computed once per task version (every prompt shows them)."""
    key = (task.ref, task.reference_source, device_kind)
    if key not in _TOLERANCE_LINES:
        _TOLERANCE_LINES[key] = _tolerance_lines(task, device_kind)
    return _TOLERANCE_LINES[key]


def _tolerance_lines(task: Task, device_kind: str) -> list[str]:
    try:
        found = output_tolerances(task, device_kind)
    except Exception as err:  # a reference that cannot run on the CPU: show the dtype's tolerance
        dtype = task.dtype(device_kind)
        tol = task.tolerance(dtype)
        return [f"outputs ({dtype}): rtol {tol.rtol:g}, atol {tol.atol:g} (output dtypes not determined: {type(err).__name__})"]
    return [
        f"output {i} ({name}): " + ("exact" if tol.rtol == 0 and tol.atol == 0 else f"rtol {tol.rtol:g}, atol {tol.atol:g}")
        for i, name, tol in found
    ]


def show_text(task: Task, device_kind: str = "cuda") -> str:
    """The public spec as the model reads it."""
    dtype = task.dtype(device_kind)
    lines = [f"# Task: {task.name}", ""]
    if task.description:
        lines += [task.description, ""]
    lines += ["## Reference (KernelBench form)", "```python", task.reference_source.rstrip(), "```", ""]
    lines += ["## Public shapes"]
    lines += [f"- {s.label}" for s in task.shapes(device_kind, hidden=False)]
    lines += ["", f"## Dtype: {dtype}"]
    lines += [
        "## Tolerance: |out - ref| <= rtol*|ref| + atol*rms(ref) + 2*|eager - ref| per element, "
        "ref computed in float32 or better, by output:",
        *(f"- {line}" for line in tolerance_lines(task, device_kind)),
    ]
    if task.mutated_inputs:
        lines += [f"## In place: inputs {list(task.mutated_inputs)} are written by the op and checked"]
    lines += [
        "## Torch compute ops inside ModelNew.forward: " + ("allowed" if task.allow_torch_ops else "forbidden"),
        "",
        "## Roofline (H200 nominal: 4242 GB/s copy, 691 TFLOP/s bf16)",
    ]
    for row in roofline_rows(task, device_kind):
        lines.append(
            f"- {row['shape']}: {row['bytes'] / 1e6:.3f} MB, {row['flops'] / 1e9:.3f} GFLOP, "
            f"floor {row['floor_us']:.2f} us"
        )
    return "\n".join(lines) + "\n"


def hidden_summary(task: Task, device_kind: str = "cuda") -> dict[str, Any]:
    """What the operator may know of the hidden shapes, never a size: how many are fixed, and
    how each verdict draws more (tasks/draws.py), or why none are drawn."""
    from . import draws

    drawn = draws.describe(task)
    return {"fixed": len(task.shapes(device_kind, hidden=True)),
            "drawn": drawn or f"none: the task's meta.py has no {draws.DRAWER}(rng, device) and the reference no "
                              "batch_size; its fixed hidden shapes are then all a leak could tell a later candidate"}


def hidden_text(task: Task, device_kind: str = "cuda") -> str:
    summary = hidden_summary(task, device_kind)
    return f"Hidden shapes (never shown to the model): {summary['fixed']} fixed; drawn: {summary['drawn']}."

