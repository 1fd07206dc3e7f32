"""Errors raised while finding or loading tasks."""

from __future__ import annotations


class TaskError(Exception):
    """A task could not be found or is malformed; the message names the file and the fault."""
