"""One command over untrusted code, outside the worker pool: what it may see and reach.

``kernforge export --check`` runs the exported package's tests, and they import every kernel the
archive holds: code a model wrote, judged in a sandbox whose environment never held a key. Run
plainly, a module whose import-time code waits for a key in the environment, or reads the user's
config file, and sends it out would find both (red team: a payload that acted only when an API
key was present passed every verdict and exfiltrated the key during the check). So the command
gets what a worker gets: an environment of allow-listed variables (never a secret), the folder it
works in as its home, and, where bubblewrap is installed, no network, a private /tmp and the
user's home hidden. Where only ``unshare`` works, the network at least; ``confined`` says which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .env import worker_env
from .isolation import bwrap_command, checkout_metadata, mechanism, mount_plan, probe_unshare, python_paths
from .protocol import WorkerSpec


@dataclass(frozen=True)
class Confined:
    argv: list[str]
    env: dict[str, str]
    #: what the command is kept from, in words (for the command's output)
    note: str


def confined(argv: Sequence[str], *, workdir: Path, shown: Sequence[str] = (),
             env: Mapping[str, str] | None = None) -> Confined:
    """``argv`` confined: ``workdir`` (writable, its home and temp dir) and ``shown`` (read-only)
    in sight besides the interpreter and the system; its environment a worker's (``worker_env``),
    on the CPU where ``env`` asks for the Triton interpreter, else on the first GPU."""
    device = "cpu" if (env or {}).get("TRITON_INTERPRET") else "0"
    home = str(Path(workdir).resolve())
    scrubbed = worker_env(WorkerSpec(device=device), Path(home), os.environ)
    mech = mechanism("strict")
    if mech.name == "bwrap":
        needed = python_paths() + tuple(str(Path(p).resolve()) for p in shown)
        hidden = (os.path.expanduser("~"),) + checkout_metadata(needed)
        plan = mount_plan(home, needed, hidden, drop_uid=False)
        return Confined(bwrap_command(mech, plan, home) + list(argv), scrubbed,
                        "no network, home hidden, no secret in its environment (bubblewrap)")
    ok, _, command = probe_unshare()
    if ok and "--net" in command:
        prefix = [c for c in command if c in ("unshare", "--user", "--map-root-user")] + ["--net", "--"]
        return Confined(prefix + list(argv), scrubbed, "no network, no secret in its environment (unshare); "
                                                        "the home folder is NOT hidden: install bubblewrap")
    return Confined(list(argv), scrubbed, "no secret in its environment; the network and the home folder are NOT "
                                          f"closed to it ({mech.detail}): install bubblewrap")


def confine_command(argv: list[str], workdir: Path, shown: Sequence[str],
                    env: Mapping[str, str]) -> tuple[list[str], dict[str, str], str]:
    """``confined`` in the shape ``archive.export_check`` takes it (the command, its environment,
    the note)."""
    done = confined(argv, workdir=workdir, shown=shown, env=env)
    return done.argv, done.env, done.note
