"""Malformed replies (THREATS #9): every message from a worker must fit its schema."""

from __future__ import annotations

from ..checks import Check
from ..messages import Malformed
from ..verdict import Rejected, Status
from . import Defence, register

DEFENCE = register(Defence(
    Check.REPLY, (9,),
    facts="each message from the candidate's worker, parsed by messages.py in the judge",
    trusted=True,
    rationale="The candidate shares its worker's process and can put anything on the channel. A reply "
              "that does not fit its schema (a list where a number belongs, a missing field, a forged "
              "verdict) was broken or forged; believing any part of it would let the candidate pick its "
              "own verdict, and an exception in the judge would end the whole run.",
    remedy="Never write to the worker's channel or replace the harness's functions: "
           "return your outputs from forward and let the harness report them.",
))


def malformed(error: Malformed | str, what: str) -> Rejected:
    return DEFENCE.reject(Status.CHEAT, f"the worker's reply to {what} is malformed ({error}): results were forged "
                          "or the harness was tampered with", threat=9, evidence={"problem": str(error)[:500]})
