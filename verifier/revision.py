"""Which judge made a verdict or an audit: a fingerprint of the trusted code that decides one.

A defence added today rejects what yesterday's judge accepted (in a week of red-teaming, a forked
helper, a kernel keyring, a declared encoding, ...); a false rejection fixed today accepts what it
refused. A verdict is only as good as the judge that made it, so every verdict records this
fingerprint in its environment (``environment.describe``), and the archive

* reuses a verdict only for the same fingerprint (it is one of the environment's keyed fields,
  ``archive/content.ENV_FIELDS``): the same code under a changed judge is judged again;
* counts an audit only when this judge made it (``archive/queries.py``): a best, a per-shape
  best and an export rest on an audit by the judge that is installed, and a best audited by an
  earlier one waits for an audit again (the loop audits it as it does any leftover;
  ``kernforge archive audit`` does it by hand).

The fingerprint is computed, not declared: a revision number that a change to the judge had to
remember to raise would be forgotten by the change that matters. It hashes the source of the
packages that decide a verdict (``verifier/``, ``sandbox/``, and the task machinery that draws
inputs and loads references; not the built-in tasks, whose versions are keyed by their own
source). A change of a comment there costs an audit per task best, which is cheap next to a
verdict believed on the word of a judge that is no longer the one installed.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

#: the packages, and the files of ``tasks/``, whose source decides a verdict
_PACKAGES = ("verifier", "sandbox")
_TASK_FILES = ("loader.py", "runtime.py", "shapes.py", "spec.py")
#: what a fingerprint looks like (it is also written into SQL as a literal: hex only)
FORMAT = re.compile(r"[0-9a-f]{16}")


def _sources(root: Path) -> list[Path]:
    files = [p for package in _PACKAGES for p in (root / package).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", "") and not p.name.startswith(".")]
    files += [root / "tasks" / name for name in _TASK_FILES if (root / "tasks" / name).is_file()]
    return sorted(files)


def fingerprint_of(root: Path) -> str:
    """16 hex digits of sha256 over the judge's source files under the package folder ``root``
    (their paths and bytes)."""
    digest = hashlib.sha256()
    for path in _sources(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """The installed judge's fingerprint."""
    return fingerprint_of(Path(__file__).resolve().parents[1])
