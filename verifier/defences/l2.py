"""L2 pinning (THREATS #18): no persisting-L2 window survives a call."""

from __future__ import annotations

from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.PERSISTING_L2, (18,), facts="the persisting-L2 limit the worker reads after each call (early); the trusted "
                                      "side also resets persisting lines and flushes L2 before each timed batch",
    trusted=False,
    rationale="Data pinned in a persisting-L2 window survives the cache flush that makes every timed call start "
              "cold, so the call would be timed on warm data.",
    remedy="Do not set cudaLimitPersistingL2CacheSize or access-policy windows; let the cache behave as it does in "
           "a serving engine."))


def pinned(limit: int | None, ctx: str) -> Rejected | None:
    if limit:
        return DEFENCE.reject(Status.CHEAT, f"the call reserved {limit} bytes of persisting L2 ({ctx}): pinned data would survive "
                              "the cache flush between timed calls", threat=18, evidence={"limit": limit})
    return None
