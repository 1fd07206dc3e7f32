"""Running the reference: the high-precision answer and PyTorch eager's own answer.

Runs only in trusted processes (the judge's reference worker, tests), never in a candidate's.
``high`` is the reference on inputs upcast one step (bf16/fp16 -> fp32, fp32 -> fp64) with TF32
off (a reference that computes in float32 itself, as the built-in ones do, stays float32 there); ``low`` is the reference on the inputs as given, whose distance from ``high`` is the
rounding error the tolerance allows for (see compare.py).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from kernforge.tasks.runtime import collect_outputs

_UPCAST = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


def strict_precision() -> None:
    """No TF32 anywhere in this process: the reference must not lower precision itself (#15)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def upcast(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in _UPCAST:
        return x.to(_UPCAST[x.dtype])
    return x


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def wide_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Copies of ``inputs`` one step wider: each tensor upcast (a copy already; cloned first, it
    was copied twice) or, where it has no wider dtype, cloned: the reference never gets the
    calls' own tensors."""
    return [(upcast(x) if x.dtype in _UPCAST else x.clone()) if isinstance(x, torch.Tensor) else x for x in inputs]


def upcast_model(model: Any) -> Any:
    """A copy of ``model`` whose floating parameters and buffers are one step wider, so upcast
    inputs meet weights of the same dtype (KernelBench models own their weights)."""
    if not isinstance(model, torch.nn.Module):
        return model
    dtypes = {t.dtype for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()}
    if not dtypes:
        return model
    if len(dtypes) != 1 or next(iter(dtypes)) not in _UPCAST:
        return None
    return copy.deepcopy(model).to(_UPCAST[next(iter(dtypes))])


def nbytes(xs: Sequence[Any], widen: bool) -> int:
    total = 0
    for x in xs:
        if isinstance(x, torch.Tensor):
            size = x.element_size() * x.numel()
            total += size * (_UPCAST[x.dtype].itemsize // x.element_size() if widen and x.dtype in _UPCAST else 1)
    return total


def wider_bytes(inputs: Sequence[Any], low: Sequence[Any], model: Any = None) -> int:
    """Device memory the one-step-wider run needs at its peak: a clone of the inputs, their wider
    copies, the wider weights and the wider outputs."""
    params = list(model.parameters()) + list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    return nbytes(inputs, False) + nbytes(inputs, True) + nbytes(params, True) + nbytes(low, True)


def _room(device: torch.device) -> int | None:
    """Device memory (bytes) this process can still take on a GPU; None on the CPU (host memory is
    not the limit)."""
    return room(device) if device.type == "cuda" else None


def room(device: torch.device) -> int:
    """What this process can still allocate on a GPU: the driver's free memory and what its own
    caching allocator holds unused (a stacked reference's part leaves that behind, and it is this
    process's to reuse, not gone)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + max(0, torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


#: memory the wider run must leave free for everything else this process does next, besides
#: twice the call's own inputs and outputs (the next call's copies, this one's snapshot)
ROOM_RESERVE = 2 << 30


@torch.no_grad()
def run_reference(model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(high, low) output lists for one call; ``inputs`` are left untouched. Where the model
    cannot run one step wider (mixed-dtype weights, dtype-strict ops), ``high`` is ``low``; so
    too where the wider run would not fit in the GPU's free memory (KernelBench's default sizes
    move several GB per call: a float64 copy of it all does not fit beside the arena), where the
    tolerance then rests on the task's own precision alone."""
    return decide_wider(model, inputs, mutated)[1:]


@torch.no_grad()
def decide_wider(model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
    """``run_reference`` with its decision: (the wider model, high, low), the wider model None
    where there is none (high is then low). A batch's captured or stacked reference takes the
    decision of one eager call for all its calls."""
    low = run_low(model, inputs, mutated)
    hi_model = wider_model(model, inputs, low)
    high, low = run_high(hi_model, inputs, low, mutated)
    return (hi_model if high is not low else None), high, low


def run_decided(model: Any, hi_model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``run_reference`` with ``decide_wider``'s decision taken: the wider model, or None for none."""
    return run_high(hi_model, inputs, run_low(model, inputs, mutated), mutated)


def run_low(model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> list[torch.Tensor]:
    """The reference's outputs on (a copy of) ``inputs`` as given."""
    lo_inputs = clone_inputs(inputs)
    return collect_outputs(model(*lo_inputs), lo_inputs, mutated)


def wider_model(model: Any, inputs: Sequence[Any], low: Sequence[Any]) -> Any:
    """The one-step-wider copy of ``model`` for a call of ``inputs`` (whose outputs were ``low``),
    or None where there is none or its run would not fit in the device's free memory."""
    hi_model = upcast_model(model)
    if hi_model is None:
        return None
    tensors = [x for x in list(inputs) + list(low) if isinstance(x, torch.Tensor)]
    room = _room(tensors[0].device) if tensors else None
    # room left after it for the next call's copies and a snapshot of this one's outputs
    after = ROOM_RESERVE + 2 * (nbytes(inputs, False) + nbytes(low, False))
    if room is not None and wider_bytes(inputs, low, model) + after > room:
        return None
    return hi_model


def run_high(hi_model: Any, inputs: Sequence[Any], low: list[torch.Tensor], mutated: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(high, low): ``hi_model`` on upcast copies of ``inputs``; ``low`` twice where there is no
    wider model, it raises, or its outputs are shaped otherwise."""
    if hi_model is None:
        return low, low
    try:
        high = run_wide(hi_model, inputs, mutated)
    except (RuntimeError, TypeError):  # an op with no wider kernel, or a dtype check in forward
        return low, low
    if [h.shape for h in high] != [l.shape for l in low]:
        return low, low
    return high, low


def run_wide(hi_model: Any, inputs: Sequence[Any], mutated: Sequence[int]) -> list[torch.Tensor]:
    """The one-step-wider model's outputs on upcast copies of ``inputs``."""
    hi_inputs = wide_inputs(inputs)
    return collect_outputs(hi_model(*hi_inputs), hi_inputs, mutated)
