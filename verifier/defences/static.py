"""The static screen: cheap, early feedback from the source alone; never a reason to accept."""

from __future__ import annotations

from typing import Any

from .. import encoding
from ..checks import Check
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.STATIC_SCREEN, tuple(range(1, 23)),
    facts="the candidate's source (screen.py's rules), before it runs",
    trusted=True,
    rationale="Some cheats are visible in the source (torch compute, threads, timer names, harness imports); "
              "refusing them early saves a worker and names the line. Passing says nothing: every runtime check "
              "still runs.",
    remedy="Write kernels and a launcher; import only torch, triton and the standard math you need."))


def findings(found: Any) -> Rejected | None:
    if found.ok:
        return None
    first = found.findings[0]
    return Rejected(Status.STATIC_REJECTED, found.reason, threat=first.threat, check=Check.STATIC_SCREEN,
                    evidence={"findings": [f.to_dict() for f in found.findings[:20]]})


def unreadable(source: str) -> Rejected | None:
    """A source no interpreter could read as a module: not text that encodes as UTF-8 (a lone
    surrogate), or nested past what the parser can hold; or one that declares another encoding
    than UTF-8, which Python would read as other code than this text (encoding.py). A compile
    error, before anything runs, whether the screen is on or not."""
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as err:
        return Rejected(Status.COMPILE_ERROR, f"the source is not valid UTF-8 text: {err.reason} at character {err.start}",
                        check=Check.STATIC_SCREEN, evidence={"position": err.start})
    name = encoding.foreign(source)
    if name is not None:  # the import would read other code than the text every check and reader sees
        return Rejected(Status.COMPILE_ERROR, f"the source declares its encoding as {name[:40]!r} (a `coding:` comment "
                                              "in its first two lines), under which Python would not read this very text "
                                              "from its UTF-8 bytes: declare UTF-8, or no encoding",
                        check=Check.STATIC_SCREEN, evidence={"encoding": name[:40]})
    return None
