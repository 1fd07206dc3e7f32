"""``kernforge archive browse``: Datasette on the archive, when the ``datasette`` extra is installed."""

from __future__ import annotations

import importlib.util
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
    """Serve the archive with Datasette until interrupted; Datasette's exit code."""
    try:
        return subprocess.call(datasette_argv(path, port, open_browser))
    except KeyboardInterrupt:
        return 0
