"""Ghost kernels (THREATS #17): at least one of the candidate's own kernels runs per call, and
no output is one of its inputs."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..checks import Check
from ..kernels import is_own
from ..verdict import Rejected, Status
from . import Defence, register

OWN = register(Defence(
    Check.OWN_KERNELS, (17,),
    facts="Triton launches and CUDA kernels the worker saw per checked call (early); kernels Nsight Compute saw "
          "run (audit, trusted)",
    trusted=False,
    rationale="A module that defines a kernel and never runs it returns a passthrough or a torch result: no kernel "
              "of the candidate's did the work.",
    remedy="Launch your kernel on every call, for every shape; do not return an input or a copy of it."))
ALIASING = register(Defence(
    Check.ALIASING, (17,), facts="where each output lies against the inputs (the worker's storage spans on the CPU; "
                                 "the trusted layout of the shared memory on a GPU)",
    trusted=False,
    rationale="An output that is an input's memory is a passthrough, not a computed result (unless the task "
              "writes that input in place).",
    remedy="Write each output into a tensor of its own (torch.empty_like and a kernel that fills it)."))


def launched(launches: Mapping[str, int], gpu_kernels: Sequence[str], own: Sequence[str], ctx: str, on_gpu: bool) -> Rejected | None:
    if on_gpu:
        if any(is_own(kernel, name) for kernel in gpu_kernels for name in own):
            return None
        return OWN.reject(Status.CHEAT, f"none of the candidate's kernels ({', '.join(own) or 'none defined'}) ran on the GPU during "
                          f"the call ({ctx})", threat=17, evidence={"gpu_kernels": list(gpu_kernels)[:20], "own_kernels": list(own)})
    ran = set(launches)
    if ran & set(own) or (ran and not own):
        return None
    return OWN.reject(Status.CHEAT, f"no kernel of the candidate's was launched during the call ({ctx}); a result without a kernel "
                      "is a passthrough or a torch computation", threat=17,
                      evidence={"launches": sorted(ran)[:20], "own_kernels": list(own)})


def aliased(aliases: Sequence[Sequence[int]], ctx: str) -> Rejected | None:
    for j, hits in enumerate(aliases):
        if hits:
            return ALIASING.reject(Status.CHEAT, f"returned output {j} shares memory with input {hits[0]} ({ctx}): a passthrough, "
                                   "not a computed result", threat=17, evidence={"output": j, "inputs": list(hits)})
    return None
