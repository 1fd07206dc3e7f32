"""The stacked reference's answers under torch.compile (trusted side only): one fused graph per
task, shape and dtype in place of an eager op at a time (reference_batched.py).

Why: at the large shapes a timed window's verification is bound by memory traffic. A float32
reference over bf16 inputs, run eagerly, reads and writes every intermediate: silu_and_mul's
upcasts both halves, then its sigmoid, two products and the rounding each make a pass, about
seven times the bytes the kernel itself moves, before the comparison reads the answer again.
Compiled, the reference reads its inputs once and writes its high answer once (the low one is
that rounded, by PyTorch, as before).

Where it stands in: only where the stacked reference derives its low answers (``low_dtypes``:
the task's low answer is its high one rounded) and, on the calls the stacked reference was
checked on, the compiled answers lie within that check's own bound of the eager ones
(``reference_batched._close``: a sixteenth of the tolerance, or one step of the dtype). It then
decides nothing alone: a window where any call falls outside the tighter allowance is verified
again with the eager reference's low answers run (refworker._failing_stacked, ``exact``), as
before, so it cannot reject an honest kernel, and it accepts only what lies within the
tolerance of an answer that agreed with eager's on this batch's own inputs.

Cost: a compile per task, shape and dtype (the calls' dimension is dynamic, so a window's long
and short batches and the parts of either share it), kept for the worker's life; a baseline's
``torch._dynamo.reset()`` drops them, and Inductor's cache on disk makes the next one quick.
Off unless ``KERNFORGE_COMPILED_REFERENCE=1`` (bench/h200.sh ``routinecomp`` measures it). On an
H100 (session 51) a window's high answer at the largest shapes took 7-8 ms compiled against 46-51
ms eagerly (bench/compiled_reference.py), yet routine verdicts were no shorter: in a verdict those
shapes' calls are too large to stack (``reference_batched.part_bytes`` reckons eager's peak, and a
part of one call runs call by call, from the captured graph), so the compiled graph met only the
small and middle shapes, where the eager reference was already cheap. Sizing parts by the compiled
graph's own peak, or compiling the call-by-call reference, is what would reach them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

import torch

#: set to 1 to verify timed windows with the compiled reference where it stands in
ENV = "KERNFORGE_COMPILED_REFERENCE"
#: graphs one process may keep for the one compiled function (a task, shape and dtype each)
RECOMPILE_LIMIT = 512

_COMPILED: list[Callable[..., Any]] = []


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def _stacked(hi_model: Any, values: list[Any], positions: list[int], mutated: list[int], *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each call's high answer, under vmap (what ``StackedReference.run(exact=False)`` computes
    eagerly; uncompiled, it is that)."""
    from .reference_batched import _one_call

    one = _one_call(None, hi_model, values, positions, mutated, high_only=True)
    high = torch.func.vmap(one, randomness="error")(*tensors)
    return list(high) if isinstance(high, (tuple, list)) else [high]


def _function() -> Callable[..., Any]:
    if not _COMPILED:
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT)
        _COMPILED.append(torch.compile(_stacked))
    return _COMPILED[0]


def run(model: Any, hi_model: Any, values: list[Any], positions: list[int], mutated: list[int], dtypes: Sequence[torch.dtype],
        tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(highs, lows) of the stacked calls ``tensors`` ([calls, *shape] each, at least two calls):
    the compiled graph's high answers, and each rounded to its low dtype eagerly (PyTorch's own
    rounding, as the eager stacked reference derives them: the nearest value of the dtype to the
    answer the candidate is compared with). Raises where it cannot compile or run."""
    name = type(model).__module__
    if name not in sys.modules:  # a task's reference is imported anonymously (tasks/runtime.py); dynamo looks it up by name
        from kernforge.tasks import runtime

        found = runtime.loaded_module(name)
        if found is not None:
            sys.modules[name] = found
    for t in tensors:  # where a reference specializes it (rotary_embedding's), a graph per number of calls
        torch._dynamo.maybe_mark_dynamic(t, 0)
    with torch.no_grad():
        high = _function()(hi_model, list(values), list(positions), list(mutated), *tensors)
        return high, [h.to(d) for h, d in zip(high, dtypes)]
