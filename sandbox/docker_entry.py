"""Inside a worker container: join the parent's channel, then become the generic worker.

``python -m kernforge.sandbox.docker_entry CONFIG`` is the container's command and its pid 1
(started by docker_worker.py, never by hand). A container cannot inherit descriptors, so the
channel is rebuilt from the worker's private folder, which the parent binds into the container
at the same path:

1. stdout and stderr go to the files the parent made in ``io/`` (the candidate's output never
   touches the channel; the parent reads them through descriptors it opened itself);
2. this process becomes non-dumpable: the job process that will share its uid can then neither
   ptrace it nor read its memory, and as pid 1 of the container's pid namespace it ignores every
   signal sent from inside that it has no handler for (SIGKILL included);
3. the job channel: two FIFOs in ``chan/`` (``to_worker``, ``from_worker``), which behave exactly
   like the process backend's pipes; the descriptor channel, a connection to the Unix socket
   ``chan/fds``; then the control socket ``chan/control``. On each socket it sends the parent's
   one-time token, so the parent knows the connection is this entry point's and, once the
   control socket's token came, that the FIFOs are open at this end;
4. ``worker.main`` runs in this same process with those descriptors: the supervisor forks the
   job process (which alone keeps the job and descriptor channels), reports its end on the
   control socket, and kills everything when the parent closes it (pid 1: everything in the
   container).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from .isolation import make_undumpable


def _redirect_output(folder: str) -> None:
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.dup2(target, fd)
        os.close(target)


def join(config: dict) -> list[int]:
    """Open the channels the parent prepared; the four descriptors the worker expects."""
    folder = config["chan"]
    from_worker = os.open(os.path.join(folder, "from_worker"), os.O_WRONLY | os.O_NOFOLLOW)
    # The parent holds a placeholder writer until it has seen the token, so this neither blocks
    # nor sees end-of-file in between.
    to_worker = os.open(os.path.join(folder, "to_worker"), os.O_RDONLY | os.O_NOFOLLOW)
    # The descriptor channel first: the parent takes it before the control connection, which
    # tells it the entry point has joined.
    fds, control = _connect(os.path.join(folder, "fds"), config), _connect(os.path.join(folder, "control"), config)
    return [to_worker, from_worker, control, fds]


def _connect(path: str, config: dict) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(config["token"].encode())
    return sock.detach()


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    _redirect_output(config["io"])
    make_undumpable()
    worker_config = dict(config["worker"], fds=join(config))
    from .worker import main as worker_main

    worker_main([argv[0], json.dumps(worker_config)])


if __name__ == "__main__":
    main(sys.argv)
