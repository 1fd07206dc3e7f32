"""Errors the loop raises for the CLI to print: each names what is wrong and what to do."""

from __future__ import annotations


class LoopError(Exception):
    """A run that cannot start or go on: bad budget, unknown run to resume, a provider that
    refuses every request (bad key, no quota), GPUs of different models, ..."""
