"""The next candidate's Triton kernels, compiled ahead while the GPU judges the current one
(verifier/triton_ahead.py says what is compiled and why it cannot change a verdict).

The runner starts one as a proposal is made, before it waits for room in the lanes' queue
(``Devices.kernels_ahead``): with a fast proposer it compiles while the verdict in flight and the
one queued before it are made, two verdicts' time, not one. The lane that takes the proposal
waits for its public shapes' files at most ``WAIT_S`` as its verdict begins, never for its
decoys' (those done by then come too), and a compile ahead not done by then is ended: the
verdict's worker compiles what it lacks, as it did before.
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
        """The files compiled ahead: those of the public shapes, waited for at most ``WAIT_S``,
        and the decoys' where they are done already (what is left of them is ended, never waited
        for); none where the public shapes' are not done in time (it is ended) or failed."""
        try:
            if not self._running.done():
                staged = await asyncio.to_thread(self.ahead.staged.wait, WAIT_S)
                if not self._running.done():
                    if not staged:
                        self._late = f"not done within {WAIT_S:.0f} s"
                    self.cancel()  # run then gives the public shapes' files where they came
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
