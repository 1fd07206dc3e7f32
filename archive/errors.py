"""Errors raised by the archive. Each message names the file and says what to do about it."""

from __future__ import annotations


class ArchiveError(Exception):
    """The archive is missing, not a kernforge archive, corrupt, busy, or was asked something invalid."""


class ReadOnlyError(ArchiveError):
    """A read-only connection (``kernforge archive sql``) was asked to change something."""


class ConflictError(ArchiveError):
    """An idempotency key (run, seq) is already taken by a different attempt."""


class RunBusyError(ArchiveError):
    """A run another live process is running was asked to be resumed."""


class ReportError(ArchiveError):
    """``kernforge report`` cannot write its page or screenshot (a missing folder, no permission, no browser)."""
