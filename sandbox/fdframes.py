"""Descriptor messages: framing and reading for the descriptor channel (SCM_RIGHTS over a Unix
stream socket) between the trusted parent and a worker.

A message is one frame, a 4-byte big-endian length then that many bytes of UTF-8 (the *tag*, at
most MAX_TAG_CHARS characters, telling the receiver what the descriptors are), with
0..MAX_FDS_PER_MESSAGE descriptors attached to the frame's first byte. The frame keeps messages
from running together on the stream; the descriptors ride on its first byte because that is
where the kernel hands them over: with the read that takes the first byte of the ``sendmsg``
that carried them.

Only the standard library is imported here (the worker imports this before any job).
"""

from __future__ import annotations

import array
import operator
import os
import socket
import struct
from typing import NoReturn, Sequence

TAG_HEADER = struct.Struct(">I")  # the tag's length, as the JSON frames' header
MAX_FDS_PER_MESSAGE = 16
MAX_TAG_CHARS = 200
MAX_TAG_BYTES = 4 * MAX_TAG_CHARS  # UTF-8 needs at most 4 bytes a character
#: Room for exactly MAX_FDS_PER_MESSAGE descriptors: the kernel closes any beyond it itself (they
#: never enter the receiver's descriptor table) and says so with MSG_CTRUNC.
_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * array.array("i").itemsize)


def encode_fd_frame(tag: str) -> bytes:
    """The frame of one descriptor message; ValueError for a tag that is not a short string."""
    if not isinstance(tag, str) or len(tag) > MAX_TAG_CHARS:
        raise ValueError(f"a descriptor tag must be a string of at most {MAX_TAG_CHARS} characters")
    body = tag.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError, a ValueError
    return TAG_HEADER.pack(len(body)) + body


def fd_list(fds: Sequence[int]) -> list[int]:
    """``fds`` as descriptor numbers; ValueError for more than one message may carry."""
    numbers = [operator.index(fd) for fd in fds]
    if len(numbers) > MAX_FDS_PER_MESSAGE:
        raise ValueError(f"{len(numbers)} descriptors in one message (limit {MAX_FDS_PER_MESSAGE})")
    if any(fd < 0 for fd in numbers):
        raise ValueError(f"not descriptors: {numbers}")
    return numbers


def send_fd_frame(sock: socket.socket, frame: bytes | memoryview, fds: list[int]) -> int:
    """One ``sendmsg`` of ``frame`` with ``fds`` attached to its first byte; the bytes sent (the
    rest goes with plain sends: the descriptors are attached once bytes of the frame went)."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    return sock.sendmsg([frame], ancillary, socket.MSG_NOSIGNAL)


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


class FdReader:
    """Assembles descriptor messages read from a Unix stream socket whose peer may be hostile.

    Reads never go past the end of the frame being assembled, so messages sent early wait with
    their descriptors in the socket's kernel queue, in order and in no process's descriptor table,
    until they are asked for (their number is bounded by the socket's buffer). Descriptors ride on
    a frame's first byte: the kernel hands them over with the read that takes that byte, and ends
    that read at their message. Descriptors with any other read, more than MAX_FDS_PER_MESSAGE
    (MSG_CTRUNC: the kernel closed the rest itself), a tag header over MAX_TAG_BYTES, or a tag
    that is not UTF-8 or is too long raise ValueError, after every descriptor of the frame was
    closed. The reader owns the descriptors of the frame in progress until ``pop`` hands them
    out; ``close`` closes them.
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._fds: list[int] = []

    def wanted(self) -> int:
        """Bytes still missing for the frame being assembled (0: ``pop`` it)."""
        if len(self._data) < TAG_HEADER.size:
            return TAG_HEADER.size - len(self._data)
        (length,) = TAG_HEADER.unpack_from(self._data)
        return TAG_HEADER.size + length - len(self._data)

    def receive(self, sock: socket.socket) -> bool:
        """One read (``sock`` must be readable or blocking); False at the end of the stream."""
        wanted = self.wanted()
        if wanted == 0:
            raise RuntimeError("pop the complete frame before reading on")
        data, ancillary, flags, _ = sock.recvmsg(wanted, _ANCILLARY_BYTES, socket.MSG_CMSG_CLOEXEC)
        fds = _fds_of(ancillary)
        self._fds += fds  # owned from here: every failure below closes them
        if flags & socket.MSG_CTRUNC:
            self._fail(f"more than {MAX_FDS_PER_MESSAGE} descriptors in one message")
        if fds and self._data:
            # Only the first read of a frame may carry descriptors, so a frame has at most one
            # batch of them, which the ancillary buffer holds to MAX_FDS_PER_MESSAGE.
            self._fail("descriptors attached to the middle of a frame")
        if not data:
            self.close()  # no frame can complete now
            return False
        self._data += data
        if len(self._data) >= TAG_HEADER.size:
            (length,) = TAG_HEADER.unpack_from(self._data)
            if length > MAX_TAG_BYTES:
                self._fail(f"descriptor frame announces a {length}-byte tag (limit {MAX_TAG_BYTES})")
        return True

    def pop(self) -> tuple[str, list[int]] | None:
        """The next complete message, ``(tag, descriptors)``, or None."""
        if len(self._data) < TAG_HEADER.size or self.wanted() > 0:
            return None
        body = bytes(self._data[TAG_HEADER.size :])
        try:
            tag = body.decode("utf-8")
        except UnicodeDecodeError as e:
            self._fail(f"descriptor tag is not UTF-8: {e}")
        if len(tag) > MAX_TAG_CHARS:
            self._fail(f"descriptor tag of {len(tag)} characters (limit {MAX_TAG_CHARS})")
        fds, self._fds, self._data = self._fds, [], bytearray()
        return tag, fds

    def close(self) -> None:
        """Close the descriptors of the frame in progress and forget it (idempotent)."""
        fds, self._fds, self._data = self._fds, [], bytearray()
        close_fds(fds)

    def _fail(self, reason: str) -> NoReturn:
        self.close()
        raise ValueError(reason)
