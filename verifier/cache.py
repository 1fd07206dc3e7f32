"""A small JSON cache for measurements that are expensive and stable: baselines and ceilings.

Keyed by everything that changes the number (task source hash, shape, GPU, driver, torch and
Triton versions), so a stale entry can never be read for another setup. Writes are atomic
(temp file + rename) and re-read the file first, so two judges sharing it lose nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

_LOCK = threading.Lock()


def default_dir() -> Path:
    base = os.environ.get("KERNFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernforge"
    )
    return Path(base)


def compiled_dir(base: Path | None = None) -> Path:
    """The trusted reference workers' compiler caches (Triton, Inductor): ``compiled/`` of the
    judge's cache folder, made private to this user. torch.compile's baselines and the judge's
    own kernels compile there once, not once per worker; no candidate's worker sees it
    (WorkerSpec.trusted_cache, hidden from candidates by loop/evaluate.open_judge)."""
    folder = (base or default_dir()) / "compiled"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def key_of(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class JsonCache:
    def __init__(self, path: Path):
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Any:
        return self._read().get(key)

    def entries(self) -> dict[str, Any]:
        """Every entry, by key."""
        return self._read()

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        self.put_many({key: value})

    def put_many(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        """Add ``entries`` (one write of the file; an entry already there is replaced)."""
        if not entries:
            return
        with _LOCK:
            data = self._read()
            data.update(entries)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".cache-")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
