"""Torch doing the work (THREATS #16): the work must be the candidate's own kernels.

Three sources: the worker's trace of aten ops during a checked call and the dispatcher's own count
of them (early, forgeable: both in the candidate's process), and, when
a winner is audited, the list of kernels Nsight Compute saw the driver run (trusted): an ATen or
cuBLAS kernel there is torch compute whatever the worker's trace said.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .. import kernels
from ..checks import Check
from ..torch_ops import is_allowed_aten, parse_op_name
from ..verdict import Rejected, Status
from . import Defence, register

#: substrings of kernel names that only PyTorch's own libraries launch
TORCH_KERNELS = ("at::native::", "at_cuda_detail", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel",
                 "reduce_kernel<", "cutlass", "cublas", "sm90_xmma", "nvjet", "gemv", "gemmSN", "cudnn", "triton_poi_",
                 "triton_red_", "triton_per_", "triton_tem_", "softmax_warp", "cunn_")

DEFENCE = register(Defence(
    Check.TORCH_OPS, (16,),
    facts="aten ops the worker's trace saw during each checked call (early); kernels Nsight Compute saw run (audit, trusted)",
    trusted=False,
    rationale="A candidate whose forward calls torch (or the reference) to compute the result has written no "
              "kernel; its speed is PyTorch's. Bookkeeping (allocation, views, copies) is allowed, compute is not, "
              "unless the task allows torch ops.",
    remedy="Compute the result in your own Triton or CUDA kernels; use torch only to allocate outputs, make views "
           "and launch kernels."))


def _compute(ops: Mapping[str, int], own_ops: Sequence[str]) -> list[str]:
    """The ops that are compute: not bookkeeping, and not a custom op the source defines itself
    (whose body's ops are traced one by one)."""
    own = set(own_ops)
    return sorted(op for op in ops if not is_allowed_aten(op) and "::".join(parse_op_name(op)[:2]) not in own)


def traced(ops: Mapping[str, int], ctx: str, allow: bool, evasions: Sequence[str] = (),
           own_ops: Sequence[str] = ()) -> Rejected | None:
    if allow:
        return None
    if evasions:
        return DEFENCE.reject(Status.CHEAT, f"the candidate worked where the op trace cannot see ({', '.join(evasions[:3])}) ({ctx}): "
                              "trace switched off, below the dispatcher's Python key, in numpy or plain Python, through "
                              "ctypes or in another process", threat=16, evidence={"evasions": list(evasions)[:20]})
    used = _compute(ops, own_ops)
    if used:
        return DEFENCE.reject(Status.CHEAT, f"forward ran torch compute ops {used[:5]} ({ctx}); this task requires the work "
                              "to be done by the candidate's own kernels", threat=16, evidence={"torch_ops": used[:50]})
    return None


#: what the dispatcher's count (trace.dispatched) holds when the candidate stopped it
STOPPED = "kernforge::profiler_stopped"
#: ops the Triton interpreter's own launch machinery dispatches (it re-points tensors at host
#: copies), and the no-op views the dispatcher counts where the trace sees nothing; bookkeeping
LAUNCH_BOOKKEEPING = frozenset({"set_", "resolve_conj", "resolve_neg"})


def dispatched(ops: Mapping[str, int], ctx: str, allow: bool, own_ops: Sequence[str] = ()) -> Rejected | None:
    """The dispatcher's own count of the ops a checked call ran (the profiler's hooks, below the
    dispatch modes): compute there that the op trace did not report was hidden from it (a guard
    excluding the Python key, disabled modes, a custom op's body, code run inside a launch)."""
    if STOPPED in ops:  # whatever the task allows: the count itself was switched off
        return DEFENCE.reject(Status.CHEAT, f"the dispatcher's count of the call's ops was stopped during the call ({ctx})",
                              threat=16, evidence={"dispatched_ops": [STOPPED]})
    if allow:
        return None
    used = [op for op in _compute(ops, own_ops) if parse_op_name(op)[1] not in LAUNCH_BOOKKEEPING]
    if used:
        return DEFENCE.reject(Status.CHEAT, f"forward ran torch compute ops {used[:5]} where the op trace does not look "
                              f"(counted by the dispatcher itself) ({ctx}); this task requires the work to be done by the "
                              "candidate's own kernels", threat=16, evidence={"dispatched_ops": used[:50]})
    return None


#: substrings of the kernels that PyTorch's bookkeeping ops launch (allowed ops: fills, copies and
#: casts, random and index-valued allocations): never torch compute, here or in the audit's list
BOOKKEEPING_KERNELS = ("FillFunctor", "fill_kernel", "copy_kernel", "CopyFunctor", "direct_copy", "copy_device_to_device",
                       "_to_copy", "cast_kernel", "memset", "arange", "elementwise_kernel_with_index", "distribution_",
                       "randperm")


def is_bookkeeping_kernel(name: str) -> bool:
    return any(mark in name for mark in BOOKKEEPING_KERNELS)


def torch_kernels(names: Sequence[str], own: Sequence[str] = ()) -> list[str]:
    """Kernels only PyTorch's libraries launch, less those of its bookkeeping ops and those the
    candidate defines itself (``kernels.is_own``): a Triton kernel named as Inductor names its own
    (``triton_poi_fused_relu_0``, as the Inductor start and a prompt's torch.compile listing show
    them) is the candidate's code, not torch.compile's."""
    return [n for n in names if any(t in _readable(n) for t in TORCH_KERNELS) and not is_bookkeeping_kernel(n)
            and not kernels.is_own(n, own)]


def _readable(name: str) -> str:
    """A mangled C++ name (``_ZN2at6native...``) as its qualified name, so the marks find it."""
    return "::".join(kernels.function_name(name)) + "::" if name.startswith("_Z") else name


def ran(names: Sequence[str], ctx: str, allow: bool, own: Sequence[str] = ()) -> Rejected | None:
    """The worker's own list of the CUDA kernels a checked call ran (early, forgeable): PyTorch's
    compute kernels there are torch doing the work, whatever the op counts said."""
    if allow:
        return None
    found = torch_kernels(names, own)
    if found:
        return DEFENCE.reject(Status.CHEAT, f"PyTorch's own kernels ran during the call ({ctx}): {found[0][:120]}; this task "
                              "requires the work to be done by the candidate's own kernels", threat=16,
                              evidence={"gpu_kernels": found[:20]})
    return None
