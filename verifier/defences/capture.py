"""What CUDA-graph capture reveals (THREATS #5, #13): streams that never rejoin, and forwards
that ask whether they are being captured."""

from __future__ import annotations

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.GRAPH_CAPTURE, (5, 13),
    facts="the worker's graph-capture outcome and its count of capture-state queries during forward",
    trusted=False,
    rationale="A forward whose work forks onto a stream that never rejoins the calling stream returns before its "
              "output is ready (#5); one that asks whether it is being captured behaves differently when timed (#13).",
    remedy="Keep all work on the current stream (or join side streams back before returning), and never branch on "
           "torch.cuda.is_current_stream_capturing()."))


def unjoined(reason: str, ctx: str) -> Rejected | None:
    if "join" in reason.lower():
        return DEFENCE.reject(Status.CHEAT, f"the call forks work onto another stream that never rejoins the calling stream ({ctx}): "
                              "its output is not ready when the call returns", threat=5, evidence={"error": reason[:500]})
    return None


def queried(count: int, ctx: str) -> Rejected | None:
    if count:
        return DEFENCE.reject(Status.CHEAT, f"forward asked {count} time(s) whether it was being captured into a CUDA graph ({ctx}): "
                              "it behaves differently when timed", threat=13, evidence={"queries": count})
    return None
