"""Who is running a run: the process that holds it in the archive, and its heartbeat.

A run is held by the process running it (``runs.owner``): ``host|boot/pid/start time``. That
process writes a heartbeat (and the run's wall time so far) every ``HEARTBEAT_S`` seconds from a
thread of its own, on a connection of its own, so a busy event loop or a long verification never
delays it. ``--resume`` of a held run is refused while the holder is alive (archive
``resume_run``): on this machine, alive means that very process exists (pid and start time, so
a reused pid is not mistaken for it); on another machine sharing the archive, that its heartbeat
is younger than ``STALE_S``. A holder killed outright leaves its name behind, but is not alive,
so the run is taken over: a dead owner never blocks a resume.
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path
from typing import Callable

from kernforge.archive.errors import ArchiveError
from kernforge.archive.store import Archive
from kernforge.sandbox import procs

#: How often the holder of a run says it is alive.
HEARTBEAT_S = 5.0
#: A holder on another machine whose heartbeat is older than this is taken for dead.
STALE_S = 120.0

log = logging.getLogger(__name__)


def this_process() -> str:
    return f"{socket.gethostname()}|{procs.owner_id()}"


def holder_alive(owner: str, heartbeat_age_s: float) -> bool:
    """Whether the process named ``owner`` still runs (see the module docstring)."""
    host, _, ident = owner.partition("|")
    if host == socket.gethostname() and ident.split("/", 1)[0] == procs.boot_id():
        return procs.owner_alive(ident)
    return heartbeat_age_s < STALE_S


class Heartbeat:
    """Writes ``owner``'s heartbeat on run ``run_id`` until ``stop()``; ``seconds()`` is the run's
    wall time so far, recorded with each beat."""

    def __init__(self, db: Path, run_id: int, owner: str, seconds: Callable[[], float],
                 interval_s: float = HEARTBEAT_S) -> None:
        self.db, self.run_id, self.owner, self.seconds, self.interval_s = db, run_id, owner, seconds, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kernforge-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            archive = Archive.open(self.db)
        except ArchiveError as error:
            log.warning("no heartbeat for run %s: %s", self.run_id, error)
            return
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    if not archive.heartbeat(self.run_id, self.owner, self.seconds()):
                        log.warning("run %s is held by another process now", self.run_id)
                        return
                except ArchiveError as error:  # busy past the timeout: the next beat tries again
                    log.warning("heartbeat of run %s: %s", self.run_id, error)
        finally:
            archive.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
