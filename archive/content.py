"""Content addressing: what makes two candidates "the same code" and two machines "the same environment".

The same normalised code for the same task in the same environment is evaluated once; every later
proposal of it reuses the first verdict (see ``Archive.lookup``).
"""

from __future__ import annotations

import ast
import hashlib
import json
from functools import lru_cache
from typing import Any, Mapping

from kernforge.verifier import encoding

#: What an environment key is made of: the things that change what a kernel does or how fast it
#: runs, and which judge measured it (verifier/revision.py). Other facts (SM count, memory, L2)
#: follow from the GPU name and are stored, not keyed.
ENV_FIELDS = ("gpu", "driver", "cuda", "torch", "triton", "python", "judge", "sandbox", "judged_with")
#: fields keyed only where present: a verdict from before they were recorded keeps its key
_NEWER_FIELDS = ("python", "judge", "sandbox", "judged_with")


def normalize_code(code: str) -> str:
    """Code with comments and formatting removed, so cosmetic edits hash alike (a declared
    encoding is not cosmetic: it stays).

    Python is parsed and unparsed (comments, blank lines, quote style and spacing vanish; string
    literals, and so CUDA sources inside them, are kept verbatim). Text that does not parse (a
    proposal with a syntax error is still archived, with its compile error) falls back to
    whitespace normalisation: trailing spaces and blank lines dropped, line endings unified.
    ``ast.unparse`` may print differently on another Python version; that costs at most one
    re-evaluation, never a wrong reuse.
    """
    # the one comment Python reads (encoding.py): codes that declare different encodings are
    # different code, whatever their text says
    declared = encoding.declared(code)
    head = f"# coding: {declared}\n" if declared is not None else ""
    try:
        return head + ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        lines = (line.rstrip() for line in code.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
        return "\n".join(line for line in lines if line)


@lru_cache(maxsize=4096)
def code_hash(code: str) -> str:
    """sha256 of the normalised code, hex.

    Parsing and unparsing costs milliseconds; the cache makes the loop's ``lookup`` before an
    evaluation and its ``record_attempt`` after it hash each proposal once.
    """
    return hashlib.sha256(normalize_code(code).encode("utf-8", "surrogatepass")).hexdigest()


def environment_fields(environment: Mapping[str, Any], columns: bool = False) -> dict[str, Any]:
    """The keyed fields of an environment (``verifier.environment.describe`` output), None when
    absent; ``columns``: those the archive's environments table has a column for (the newer ones,
    the judge and how it judged among them, are in its ``info``)."""
    return {name: environment.get(name) for name in ENV_FIELDS if not (columns and name in _NEWER_FIELDS)}


def environment_key(environment: Mapping[str, Any]) -> str:
    """A short stable hash of GPU name, driver, CUDA, torch and Triton versions, and the judge's
    fingerprint (verifier/revision.py: the same code under another judge is judged again).

    The Triton interpreter has no GPU and no driver; its key differs from every GPU's, so
    interpreter results are never reused for, or compared with, a GPU.
    """
    fields = environment_fields(environment)
    for name in _NEWER_FIELDS:  # a verdict from before they were recorded keeps its key
        if fields[name] is None:
            del fields[name]
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
