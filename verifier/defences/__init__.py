"""Every defence of the judge, one module each, in a registry with its reasons.

A defence reads some facts, decides with a pure function, and says what the candidate should do
instead. Each module declares one ``Defence``: the check it makes (the ``check`` of the
rejections it gives), the THREATS.md classes it guards against, which facts it reads and whether
trusted code measured them, why the rule is sound, and the remedy text that lessons and prompts
quote. Facts the candidate's own worker reports (``trusted=False``) can only reject: code in
that process can forge them, so no candidate is ever accepted because such a check passed.

``REGISTRY`` maps each check to its defence; ``docs()`` renders the table ``kernforge`` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..checks import Check
from ..verdict import Rejected, Status


@dataclass(frozen=True)
class Defence:
    check: Check
    threats: tuple[int, ...]
    #: what it reads, and who produced it
    facts: str
    #: True when every fact it reads was measured or read by trusted code
    trusted: bool
    rationale: str
    #: what a candidate rejected by it should do instead (shown to the model)
    remedy: str

    def reject(self, status: Status, reason: str, threat: int | None = None,
               evidence: Mapping[str, Any] | None = None) -> Rejected:
        if threat is not None and threat not in self.threats:
            raise ValueError(f"{self.check.value} does not guard against THREATS #{threat}")
        return Rejected(status, reason, threat=threat, evidence=dict(evidence or {}), check=self.check)


REGISTRY: dict[Check, Defence] = {}


def register(defence: Defence) -> Defence:
    if defence.check in REGISTRY:
        raise ValueError(f"two defences for {defence.check.value}")
    REGISTRY[defence.check] = defence
    return defence


def remedy(check: Check) -> str:
    """What to do about a rejection by ``check`` ('' for checks that are not defences)."""
    _load_all()
    found = REGISTRY.get(check)
    return found.remedy if found else ""


def docs() -> list[dict[str, Any]]:
    """One row per defence: check, THREATS classes, facts, trusted, rationale, remedy."""
    _load_all()
    return [{"check": d.check.value, "threats": list(d.threats), "facts": d.facts, "trusted": d.trusted,
             "rationale": d.rationale, "remedy": d.remedy} for d in REGISTRY.values()]


def _load_all() -> None:
    from . import (batch, capture, clock, failures, ghost, input_mutation, integrity, l2, late_writes,  # noqa: F401
                   memory, output_type, processes, reference_call, repeat, reply, roofline, static, threads, values)
    from .. import audit, ncu  # noqa: F401  (the audit's checks are registered there)
