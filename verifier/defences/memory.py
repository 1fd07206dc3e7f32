"""Where the outputs are (THREATS #9, #12, #17), read from the trusted layout of the shared memory.

The worker says where each output lies; the judge checks that against what it knows itself: the
arena's size, where it wrote the inputs, what the reference returned. An output outside the
arena, in an input's place, or in the same bytes as another call's output is refused before any
value is read.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..messages import OutputMeta, TensorRef
from ..verdict import Rejected, Status
from . import Defence, register

FORMAT = register(Defence(
    Check.OUTPUT_FORMAT, (), facts="the number, dtypes and shapes of the outputs against the trusted reference's",
    trusted=True, rationale="Outputs are compared element by element with the reference; a different count, dtype or "
                            "shape is a wrong answer.",
    remedy="Return exactly what the reference returns: the same number of tensors, in the same order, with the same "
           "dtypes and shapes."))
MEMORY = register(Defence(
    Check.OUTPUT_MEMORY, (9, 12), facts="each output's place in the shared memory (the worker's claim) against the "
                                        "arena's size and the places of other calls' outputs",
    trusted=True,
    rationale="The trusted side reads outputs where they lie. A place outside the shared memory is a forged reply "
              "(#9); two calls whose outputs share bytes are one result reported twice (#12).",
    remedy="Allocate each call's outputs with torch (torch.empty_like and friends) inside forward; never return one "
           "buffer for every call."))


def matches(outputs: Sequence[TensorRef] | Sequence[OutputMeta], expected: Sequence[OutputMeta], ctx: str) -> Rejected | None:
    if len(outputs) != len(expected):
        return FORMAT.reject(Status.INCORRECT, f"forward produced {len(outputs)} outputs, the reference has {len(expected)} ({ctx})",
                             evidence={"outputs": len(outputs), "expected": len(expected)})
    for j, (got, want) in enumerate(zip(outputs, expected)):
        if got.dtype != want.dtype or list(got.shape) != list(want.shape):
            return FORMAT.reject(Status.INCORRECT, f"output {j} is {got.dtype} {list(got.shape)}, the reference's is {want.dtype} "
                                 f"{list(want.shape)} ({ctx})", evidence={"output": j, "dtype": got.dtype, "shape": list(got.shape),
                                                                          "expected_dtype": want.dtype, "expected_shape": list(want.shape)})
    return None


def inside(outputs: Sequence[TensorRef], size: int, ctx: str) -> Rejected | None:
    for j, ref in enumerate(outputs):
        problem = ref.problem(size)
        if problem:
            return MEMORY.reject(Status.CHEAT, f"the worker places output {j} where no output can be ({ctx}): {problem}", threat=9,
                                 evidence={"output": j, "ref": ref.to_dict(), "problem": problem})
    return None


def separate_calls(per_call: Sequence[Sequence[TensorRef]], ctx: str) -> Rejected | None:
    """No byte of one call's outputs is another call's (a batch's calls each compute their own).
    Outputs of one call may share bytes (a view returned twice): a sweep in address order keeps
    the range reaching furthest so far, and any range of another call that starts inside it
    clashes, wherever the first overlap of all lies."""
    live = sorted((r.offset, r.offset + r.span, k, j) for k, refs in enumerate(per_call) for j, r in enumerate(refs) if r.span)
    reach: tuple[int, int, int] | None = None  # (end, call, output) of the range reaching furthest
    for start, end, k, j in live:
        if reach is not None and start < reach[0] and reach[1] != k:
            return reused(f"call {reach[1]} output {reach[2]}", f"call {k} output {j}", ctx)
        if reach is None or end > reach[0]:
            reach = (end, k, j)
    return None


def reused(first: str, second: str, ctx: str) -> Rejected:
    """Two calls' outputs in the same memory: the later call overwrote the earlier result. Not
    called a cheat: a module that returns one persistent buffer does this too."""
    return MEMORY.reject(Status.INCORRECT, f"{first} and {second} lie in the same memory ({ctx}): a later call overwrites an earlier "
                         "call's result; forward must return fresh tensors", evidence={"clash": [first, second]})
