"""Whether a task fits the GPU (or the CPU interpreter) at all, decided before any candidate runs.

A call's inputs and outputs are held several times over while it is judged: the arena holds
the inputs the reference worker wrote and the candidate's outputs (checked calls alternate two
halves of it), the reference worker keeps a pristine copy of the inputs and its own answer, and
snapshots the outputs it compares. A task whose largest call needs more than the GPU has, even
with nothing else on it, gets a clear "task too large for this GPU" for the task, never a
runtime error blamed on a candidate.

On the CPU the arena is a file in memory, whose size the sandbox caps (``Limits.file_bytes``): a
plain KernelBench file judged on the CPU at its own sizes (``Task.cpu_call_bytes``; 19_ReLU
moves 12.9 GB a call) is refused for the task with what to do, before the reference's worker
fails on it ("File too large", which the run blamed on the judge).
"""

from __future__ import annotations

from typing import Any, Mapping

#: copies of one call's inputs and of its outputs the judge holds at the least (no pipelining,
#: the reference at the task's own precision)
INPUT_COPIES = 4
OUTPUT_COPIES = 4
#: what the candidate's process and the two CUDA contexts take besides (bytes)
OVERHEAD = 4 << 30


#: copies of the model's weights: the reference worker's model and the candidate's ModelNew
PARAM_COPIES = 2


def reference_bytes(check_in: int, check_out: int, batch_in: int = 0) -> int:
    """What the reference worker holds beside the arena at its peak, for calls of ``check_in``
    and ``check_out`` bytes: in the checks, two calls prepared (the candidate computes one while
    the other is compared), each with its inputs and its answer, and the outputs it compares
    snapshotted, with a comparison's working copy; in a timed phase, the pristine copy of a batch's
    inputs (``batch_in``), one call's answer and its comparison's working copy."""
    return max(2 * (check_in + check_out) + 2 * check_out, batch_in + 2 * check_out)


def need_bytes(input_bytes: int, output_bytes: int, param_bytes: int = 0) -> int:
    return INPUT_COPIES * input_bytes + OUTPUT_COPIES * output_bytes + PARAM_COPIES * param_bytes + OVERHEAD


def need(entry: Mapping[str, Any]) -> int:
    """``need_bytes`` of one shape's entry of the reference worker's ``sizes``."""
    return need_bytes(entry["input_bytes"], entry["output_bytes"], entry.get("param_bytes", 0))


def too_large(sizes: Mapping[Any, Mapping[str, Any]], labels: Mapping[Any, str], memory_bytes: int) -> str | None:
    """Why the task cannot be judged on a GPU of ``memory_bytes``, or None. ``sizes``: per shape,
    the bytes of one call's inputs, outputs and weights (the reference worker's ``sizes``)."""
    worst = max(sizes, key=lambda k: need(sizes[k]), default=None)
    if worst is None:
        return None
    entry = sizes[worst]
    need_all = need(entry)
    if need_all <= memory_bytes:
        return None
    gib = 1 << 30
    weights = (f" and {entry.get('param_bytes', 0) / gib:.1f} GiB of weights ({PARAM_COPIES} copies: the reference's and "
               "the candidate's)" if entry.get("param_bytes") else "")
    return (f"task too large for this GPU: the shape {labels[worst]} moves {entry['input_bytes'] / gib:.1f} GiB of inputs "
            f"and {entry['output_bytes'] / gib:.1f} GiB of outputs per call, and judging a call holds them "
            f"{INPUT_COPIES} and {OUTPUT_COPIES} times over (the arena, the reference's copy and answer){weights}, "
            f"{need_all / gib:.0f} GiB in all, more than this GPU's {memory_bytes / gib:.0f} GiB; choose smaller shapes "
            "(a side file NAME.meta.py with PUBLIC_SHAPES and HIDDEN_SHAPES)")


#: calls the CPU interpreter's arena holds at once (checked calls alternate two halves of it)
CPU_ARENA_CALLS = 2


def too_large_for_cpu(call_bytes: int | None, label: str, file_bytes: int) -> str | None:
    """Why a task whose one call at ``label`` moves ``call_bytes`` (inputs, outputs and weights)
    cannot be judged by the CPU interpreter, whose arena may be ``file_bytes`` at most; or None."""
    if not call_bytes or CPU_ARENA_CALLS * call_bytes <= file_bytes:
        return None
    gib = 1 << 30
    return (f"task too large for the CPU interpreter: at its own sizes ({label}) one call moves "
            f"{call_bytes / gib:.1f} GiB of inputs, outputs and weights, and the interpreter's arena holds "
            f"{CPU_ARENA_CALLS} calls in at most {file_bytes / gib:.0f} GiB; give it CPU-sized shapes in a side file "
            "NAME.meta.py (CPU_PUBLIC_SHAPES and CPU_HIDDEN_SHAPES, as in tests/kernelbench/), or judge it on a GPU")
