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
packages that decide a verdict (``verifier/``, ``sandbox/``, the task machinery that draws
inputs and loads references, and the loop's assembly of a judge and of an audit's; not the
built-in tasks, whose versions are keyed by their own source). How the judge judges where that
is not in its code (the sandbox it found on this machine, its options, the Python that parses a
candidate) is in every verdict's environment beside it, and keyed too (``Judge.environment``).
A change of a comment in those files costs an audit per task best, which is cheap next to a
verdict believed on the word of a judge that is no longer the one installed.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

#: the packages whose source decides a verdict, and the files elsewhere that do: the task
#: machinery (inputs, references) and the judge's assembly (its workers' specs, an audit's judge)
_PACKAGES = ("verifier", "sandbox")
_FILES = ("tasks/loader.py", "tasks/runtime.py", "tasks/shapes.py", "tasks/spec.py", "loop/evaluate.py",
          "loop/auditing.py", "sandbox/docker/Dockerfile")
#: what a fingerprint looks like (it is also written into SQL as a literal: hex only)
FORMAT = re.compile(r"[0-9a-f]{16}")


def _sources(root: Path) -> list[Path]:
    """The Python files of ``_PACKAGES`` (what an install holds: no cache, no stray core file) and
    ``_FILES``."""
    files = {p for package in _PACKAGES for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts}
    files |= {root / name for name in _FILES if (root / name).is_file()}
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
