"""Lazy outputs (THREATS #7): forward returns plain tensors, and leaves no dispatch mode behind."""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

EXACT = "torch.Tensor"

TYPES = register(Defence(
    Check.OUTPUT_TYPE, (7,), facts="type() of each value forward returned, read by the harness before touching it",
    trusted=False,
    rationale="A tensor subclass, a proxy or a container subclass runs the candidate's code when the harness "
              "touches it (iterating, cloning, comparing), so work can happen after the call returned. Only "
              "an exact torch.Tensor, or a tuple or list of them, is accepted.",
    remedy="Return plain torch.Tensor objects (a tensor, or a tuple/list of them) that already hold the result."))
MODES = register(Defence(
    Check.DISPATCH_MODE, (7,), facts="the torch function and dispatch mode stacks after forward returned",
    trusted=False,
    rationale="A TorchFunctionMode or TorchDispatchMode left active after forward intercepts what the harness "
              "does next and can compute the answer then.",
    remedy="Do not push torch function or dispatch modes; compute the outputs inside forward."))


def returned(types: Sequence[str], ctx: str) -> Rejected | None:
    bad = [t for t in types if t != EXACT]
    if bad:
        return TYPES.reject(Status.CHEAT, f"forward returned {bad[0]} instead of a plain torch.Tensor ({ctx}): a lazy or proxy output",
                            threat=7, evidence={"types": list(types)[:20]})
    return None


def modes(active: Sequence[str], ctx: str) -> Rejected | None:
    if active:
        return MODES.reject(Status.CHEAT, f"forward left a torch mode active ({', '.join(active[:3])}) ({ctx}): it would run "
                            "code when the results are touched", threat=7, evidence={"modes": list(active)[:20]})
    return None
