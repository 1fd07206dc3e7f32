"""Job entry points for the descriptor channel (tests/test_sandbox.py): honest ones that share
memory with the parent both ways, and hostile ones that abuse fd 6. Each is ``fn(channel, payload)``.
"""

from __future__ import annotations

import array
import mmap
import os
import socket
import struct
import time

from kernforge.sandbox.protocol import WORKER_FDS_FD


def _memfd(content: bytes) -> int:
    fd = os.memfd_create("kf-job")
    os.write(fd, content)
    return fd


def _read(fd: int) -> str:
    return os.pread(fd, os.fstat(fd).st_size, 0).decode()


# ---- honest --------------------------------------------------------------------------------------
def rewrite_shared(channel, payload):
    """Take the parent's memfd, read its first ``payload["length"]`` bytes by ``pread`` and
    through a mapping, write ``payload["write"]`` into it through the mapping, say what it read."""
    tag, fds = channel.recv_fds()
    (fd,) = fds
    length = payload["length"]
    read = os.pread(fd, length, 0).decode()
    with mmap.mmap(fd, os.fstat(fd).st_size) as shared:
        mapped = shared[:length].decode()
        new = payload["write"].encode()
        shared[: len(new)] = new
    os.close(fd)
    channel.send({"tag": tag, "read": read, "mapped": mapped})


def share_own(channel, payload):
    """Send memfds of its own (``payload["messages"]``: a tag and contents per message), keep a
    mapping of the first, and after the parent's go report what the parent wrote into it."""
    first = None
    for message in payload["messages"]:
        fds = [_memfd(text.encode()) for text in message["contents"]]
        channel.send_fds(fds, message["tag"])
        if first is None and fds:
            first = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
        for fd in fds:
            os.close(fd)  # the parent has its own copies; the mapping keeps the memory
    channel.send({"sent": len(payload["messages"])})
    channel.recv()
    channel.send({"first": first[:].decode() if first is not None else None})


def describe_received(channel, payload):
    """For ``payload["messages"]`` descriptor messages: report each one's tag and contents."""
    for _ in range(payload["messages"]):
        tag, fds = channel.recv_fds()
        channel.send({"tag": tag, "contents": [_read(fd) for fd in fds]})
        for fd in fds:
            os.close(fd)


def sleep_forever(channel, payload):
    time.sleep(3600)


# ---- hostile -------------------------------------------------------------------------------------
def _raw(data: bytes, fds: list[int]) -> None:
    """One ``sendmsg`` on fd 6, bypassing Channel's checks (through a copy of fd 6, which the
    socket object closes)."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(WORKER_FDS_FD)) as sock:
        sock.sendmsg([data], ancillary)


def _frame(tag: bytes) -> bytes:
    return struct.pack(">I", len(tag)) + tag


def flood_one_message(channel, payload):
    """A valid frame carrying ``payload["count"]`` descriptors (the kernel allows up to 253)."""
    null = os.open("/dev/null", os.O_RDONLY)
    _raw(_frame(b"flood"), [null] * payload["count"])
    channel.send({"sent": True})
    time.sleep(3600)


def flood_many_messages(channel, payload):
    """Valid messages of MAX_FDS_PER_MESSAGE descriptors each, as many as the socket takes."""
    null = os.open("/dev/null", os.O_RDONLY)
    channel.send({"sending": payload["messages"]})
    for number in range(payload["messages"]):
        channel.send_fds([null] * payload["fds"], f"flood {number}")
    time.sleep(3600)


def bad_fd_frame(channel, payload):
    """Garbage on fd 6, with descriptors attached to it."""
    null = os.open("/dev/null", os.O_RDONLY)
    kind = payload["kind"]
    if kind == "huge_header":
        _raw(struct.pack(">I", 0xFFFFFFF0) + b"x", [null] * 4)
    elif kind == "not_utf8":
        _raw(_frame(b"\xff\xfe\xfd"), [null] * 4)
    elif kind == "too_many_chars":
        _raw(_frame(b"t" * 300), [null] * 4)
    elif kind == "mid_frame":
        # Two sendmsg calls: the parent reads the header alone (it never reads past what the
        # frame still needs), then the body with the descriptors.
        _raw(struct.pack(">I", 8), [])
        _raw(b"body-fds", [null] * 4)
    channel.send({"sent": kind})
    time.sleep(3600)


def partial_frame(channel, payload):
    """Descriptors with the first bytes of a frame that never completes: the parent holds them."""
    null = os.open("/dev/null", os.O_RDONLY)
    _raw(struct.pack(">I", 10) + b"ab", [null] * 16)
    channel.send({"sent": True})
    time.sleep(3600)


def close_fd_channel(channel, payload):
    os.close(WORKER_FDS_FD)
    channel.send({"closed": True})
    time.sleep(3600)
