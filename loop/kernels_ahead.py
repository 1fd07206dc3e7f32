"""The next candidate's Triton kernels, compiled ahead while the GPU judges the current one
(verifier/triton_ahead.py says what is compiled and why it cannot change a verdict).

The runner starts one as a proposal is queued for a lane (``Devices.kernels_ahead``); the lane
that takes the proposal waits for it at most ``WAIT_S`` as its verdict begins, and a compile
ahead not done by then is ended: the verdict's worker compiles what it lacks, as it did before.
"""

from __future__ import annotations

import asyncio

from kernforge.verifier.triton_ahead import Ahead

#: how long a verdict waits for its kernels compiled ahead (those of a run's very first
#: candidate, or one queued just before its turn, are still compiling): at most about what its
#: own compiles at the public shapes would take
WAIT_S = 10.0


class KernelsAhead:
    """One candidate's compile ahead, running on a thread (``Ahead.run``)."""

    def __init__(self, ahead: Ahead, running: asyncio.Task) -> None:
        self.ahead = ahead
        self._running = running
        self._late = ""

    @property
    def outcome(self) -> str:
        """What became of it, for the run's log."""
        return self._late or self.ahead.outcome

    async def files(self) -> dict[str, str]:
        """The files compiled ahead; none where the compile ahead is not done within ``WAIT_S``
        (it is ended) or failed."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._running), WAIT_S)
        except asyncio.TimeoutError:
            self._late = f"not done within {WAIT_S:.0f} s"
            self.cancel()
            return {}
        except Exception as error:  # noqa: BLE001 - a compile ahead is worth speed only: its failure costs nothing else
            self._late = f"failed: {type(error).__name__}: {error}"[:200]
            return {}

    def cancel(self) -> None:
        """End it: its worker is killed, and its thread ends on its own."""
        self.ahead.cancel()
