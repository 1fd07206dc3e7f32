"""Where a piece of work's time went, stage by stage: diagnostics for people (a verdict's
phase_seconds, an audit's Nsight Compute stages), never evidence."""

from __future__ import annotations

import time


class Laps:
    """Seconds per named stage, each lap measured from the previous one (a stage met twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._since
        self._since = now
