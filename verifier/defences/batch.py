"""What the trusted batch shows about timed calls (THREATS #8, #13).

Every call of a timed batch has fresh inputs and outputs of its own, and every output is checked
afterwards. Right after the worker says the batch is done, the reference worker reads random
elements of every output (the probe): a call whose probed elements later turn out different
from its final output was still being computed when the worker said done, so the clock would
have stopped early (#8). A batch whose outputs are wrong although the same code was right in
every eager check is wrong under CUDA-graph replay: a host-side decision made at capture time and
baked into the graph. That is a real defect (serving engines replay decode steps as graphs) but
not by itself evidence of cheating, so it is ``incorrect``; it is a cheat (#13) only when the
worker also saw forward ask whether it was being captured.
"""

from __future__ import annotations

from typing import Sequence

from ..checks import Check
from ..messages import OutputResult
from ..verdict import Rejected, Status
from . import Defence, register
from .values import describe

PROBE = register(Defence(
    Check.BATCH_PROBE, (8,),
    facts="random elements of every output of a timed batch, read by the reference worker right after the worker "
          "said done, against the outputs' final values",
    trusted=True,
    rationale="The trusted clock stops when the worker says the batch is done; a worker that says so while its "
              "kernels still run would be timed short. The probe makes that visible.",
    remedy="Return from forward only when its work is queued on the calling stream; never signal completion yourself."))
REPLAY = register(Defence(
    Check.GRAPH_REPLAY, (13,),
    facts="every output of the timed batch (CUDA-graph replays on fresh inputs), compared by the reference worker",
    trusted=True,
    rationale="Timed calls are checked calls. Outputs that are wrong only when the call is replayed from a CUDA "
              "graph come from host-side decisions (a size, a branch, a .item()) frozen at capture time.",
    remedy="Make forward graph-safe: no host-side decisions that depend on input values (no .item(), .tolist(), "
           "nonzero() sizes or Python branches on data); compute such choices on the device."))


def incomplete(calls: Sequence[int], total: int, ctx: str) -> Rejected | None:
    if calls:
        return PROBE.reject(Status.CHEAT, f"{len(calls)} of {total} timed calls were still being computed when the worker said the "
                            f"batch was done ({ctx}): the clock would have stopped early", threat=8,
                            evidence={"calls": list(calls)[:20], "total": total})
    return None


def replay_wrong(call: int, results: Sequence[OutputResult], ctx: str, mode: str, queried: bool) -> Rejected | None:
    bad = next((r for r in results if not r.ok), None)
    if bad is None:
        return None
    detail = bad.problem or describe(bad.details)
    if mode == "graph":
        if queried:
            return REPLAY.reject(Status.CHEAT, f"timed call {call} (a CUDA-graph replay) returned wrong output {bad.output} although "
                                 f"every checked call was right, and forward asked whether it was being captured ({ctx}): {detail}",
                                 threat=13, evidence={"call": call, "output": bad.output})
        return REPLAY.reject(Status.INCORRECT, f"timed call {call} (a CUDA-graph replay) returned wrong output {bad.output} although "
                             f"every eager check was right ({ctx}): {detail}. A host-side decision made while the graph was "
                             "captured was baked into it", evidence={"call": call, "output": bad.output, **bad.details})
    return REPLAY.reject(Status.INCORRECT, f"timed call {call} returned wrong output {bad.output} although every checked call was "
                         f"right ({ctx}): {detail}", evidence={"call": call, "output": bad.output, **bad.details})
