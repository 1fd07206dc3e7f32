"""Score collapse (THREATS #20): no shape is faster than the hardware allows."""

from __future__ import annotations

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.ROOFLINE, (20,),
    facts="the trusted time per call against the task's roofline (bytes and FLOPs) at the measured ceilings",
    trusted=True,
    rationale="A time below the floor that the bytes and FLOPs need at this GPU's measured bandwidth and matrix "
              "rate is impossible, whatever else the checks said.",
    remedy="Compute the full result on every call; no kernel beats the memory or compute roofline."))


def below(time_us: float, floor_us: float, nbytes: float, flops: float, ctx: str) -> Rejected | None:
    if time_us < floor_us:
        return DEFENCE.reject(Status.CHEAT, f"{time_us:.2f} us is faster than the hardware allows for this shape (floor {floor_us:.2f} us "
                              f"from {nbytes / 1e6:.2f} MB and {flops / 1e9:.3f} GFLOP) ({ctx})", threat=20,
                              evidence={"time_us": time_us, "floor_us": floor_us})
    return None
