"""``kernforge archive browse``: Datasette on the archive, when the ``datasette`` extra is installed."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

from .errors import ArchiveError
from .store import Archive


def datasette_argv(path: Path, port: int, open_browser: bool) -> list[str]:
    """The Datasette command for this archive, after checking both exist and the file is readable."""
    Archive.open(path, readonly=True).close()  # a missing or corrupt file fails here, clearly
    if importlib.util.find_spec("datasette") is None:
        raise ArchiveError(
            "Datasette is not installed: pip install 'kernforge[datasette]' "
            "(meanwhile: `kernforge archive sql \"SELECT ...\"` or `sqlite-utils` work on the file)"
        )
    argv = [sys.executable, "-m", "datasette", "serve", str(path), "--port", str(port)]
    return argv + (["--open"] if open_browser else [])


def browse(path: Path, port: int = 8001, open_browser: bool = True) -> int:
    """Serve the archive with Datasette until interrupted; Datasette's exit code.

    Datasette never outlives this process: SIGTERM and SIGHUP are passed on to it and waited for,
    Ctrl-C reaches it through the terminal, and if this process is killed outright the kernel
    sends it SIGTERM (PR_SET_PDEATHSIG)."""
    child = subprocess.Popen(datasette_argv(path, port, open_browser), preexec_fn=_die_with_parent)

    def forward(signum: int, _frame) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                return _exit_code(child.wait())
            except KeyboardInterrupt:  # the terminal sent SIGINT to Datasette too: wait for it to stop
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _exit_code(code: int) -> int:
    """Datasette's exit code; 0 when it was stopped by a signal we or the terminal sent."""
    return 0 if code in (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP) else code


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
