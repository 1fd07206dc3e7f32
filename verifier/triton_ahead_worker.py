"""A candidate's Triton kernels compiled ahead of its verdict: the sandboxed side (the judge's
side, and why this is safe: triton_ahead.py).

Runs in a sandbox worker of the candidates' pool, warmed up like any other (harness.warm_up), on
the next candidate while the GPU judges the current one. It imports the candidate, turns every
Triton launch into Triton's own warm-up (compile and build the kernel's launcher, launch
nothing), and calls ``ModelNew`` once at each public shape on meta tensors the judge described
(no data, no GPU memory): Triton compiles what those calls launch into this worker's cache folder
(``TRITON_CACHE_DIR``), and the worker answers with that folder's files. An autotuner compiles every config and times none of them.
Then it does the same at each decoy shape the judge drew (triton_ahead.py), one at a time, and
answers after each with the files it added: a verdict that begins and ends the decoys keeps those
that came.

Anything the candidate does here is worth nothing but speed: whatever fails is left out, and the
verdict's worker compiles what is missing itself.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from .harness import import_candidate
from .triton_files import whole_keys
from .triton_warmup import compile_only

#: how much nicer the decoys' compiles run than the public shapes' (which a verdict may wait for):
#: the pool's worker was given the normal priority with its job (sandbox/spawn.py ``boost``), and
#: a compile ahead's 32 decoys compile beside the verdict being judged
DECOY_NICE = 10


def run(channel: Any, payload: dict[str, Any]) -> None:
    """Compile at each of ``payload["calls"]`` (the public shapes, within ``payload["budget_s"]``),
    then answer ``{"op": "ahead", "ok": True, "stage": "public", "shapes": <calls made>, "files":
    {<path>: <base64>}}``; then, where ``payload["decoys"]`` has calls (shapes drawn from the
    task's space, none of them a verdict's), compile at those too, within what is left of the
    budget, answering after each with ``"stage": "decoys"``, the files that are new and ``"last"``
    (the last decoy, or the budget spent)."""
    started = time.perf_counter()
    import torch

    from kernforge.tasks import runtime
    from kernforge.tasks.loader import unbundle
    from kernforge.tasks.spec import Shape

    task = unbundle(payload["task"], Path(os.getcwd()) / "task", derive_hidden=False)
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    before = set(os.listdir(cache)) if cache and os.path.isdir(cache) else set()  # the warm-up's own
    model_new = import_candidate(payload["source"]).ModelNew
    launchers: set[str] = set()  # kernels whose launchers are built, across every call

    def call_all(calls: list[dict[str, Any]]) -> tuple[int, str]:
        made, failed = 0, ""
        for call in calls:
            if time.perf_counter() - started > float(payload["budget_s"]):
                return made, failed or "out of time"
            try:
                shape = Shape.of(call["shape"])
                with compile_only(launchers), torch.device("meta"), torch.no_grad():
                    model = runtime.build_model(model_new, runtime.make_init_inputs(task, shape), 0, "meta")
                    model(*[_arg(a) for a in call["args"]])
                made += 1
            except Exception as error:  # noqa: BLE001 - a shape that cannot be called on meta tensors compiles in the verdict
                failed = failed or f"{type(error).__name__}: {error}"[:200]
        return made, failed

    made, failed = call_all(payload["calls"])
    files = cache_files(cache, int(payload["max_bytes"]), int(payload["max_files"]), before)
    channel.send({"op": "ahead", "ok": True, "stage": "public", "shapes": made, "files": files, "failed": failed})
    decoys = payload.get("decoys") or []
    if decoys:  # nobody waits for them: the host's cores go to the verdict being judged first
        with contextlib.suppress(OSError):
            os.nice(DECOY_NICE)
    sent, room, count = before | _keys(files), int(payload["max_bytes"]) - _size(files), len(files)
    for i, call in enumerate(decoys):
        made, failed = call_all([call])
        more = cache_files(cache, max(room, 0), int(payload["max_files"]) - count, sent)
        sent, room, count = sent | _keys(more), room - _size(more), count + len(more)
        last = i == len(decoys) - 1 or failed == "out of time"
        channel.send({"op": "ahead", "ok": True, "stage": "decoys", "shapes": made, "files": more, "failed": failed,
                      "last": last})
        if last:
            return


def _keys(files: dict[str, str]) -> set[str]:
    """The cache keys (folders) of ``files``."""
    return {name.split("/")[0] for name in files}


def _size(files: dict[str, str]) -> int:
    """The bytes ``files`` hold (their base64 decoded)."""
    return sum(len(base64.b64decode(data)) for data in files.values())


def _arg(described: dict[str, Any]) -> Any:
    """One input: a meta tensor of the shape, strides and dtype described, or a plain value."""
    import torch

    if "meta" not in described:
        return described.get("value")
    m = described["meta"]
    return torch.empty_strided(m["shape"], m["strides"], dtype=getattr(torch, m["dtype"]), device="meta")


def cache_files(folder: str, max_bytes: int, max_files: int, before: set[str] = frozenset()) -> dict[str, str]:
    """The kernels and their launchers in a Triton cache folder (``<key>/<name>``: a key of a
    kernel's files, triton_files.KERNEL_SUFFIXES, or a launcher alone), base64, whole keys only,
    none of the keys in ``before`` (the worker's warm-up built them: the verdict's worker has
    them loaded): a key with any other file (Triton's driver module, another shared object) or
    whose files would pass ``max_bytes`` or ``max_files`` is left out (Triton builds it again)."""
    files: dict[str, str] = {}
    total = 0
    root = Path(folder)
    if not folder or not root.is_dir():
        return files
    for key in sorted(root.iterdir()):
        if key.name in before or key.is_symlink() or not key.is_dir():
            continue
        members = sorted(key.iterdir())
        if not members or not all(f.is_file() and not f.is_symlink() for f in members) or \
                not whole_keys(f"{key.name}/{f.name}" for f in members):
            continue
        group = {f"{key.name}/{f.name}": f.read_bytes() for f in members}
        size = sum(len(b) for b in group.values())
        if total + size > max_bytes or len(files) + len(group) > max_files:
            continue
        total += size
        files.update({name: base64.b64encode(data).decode("ascii") for name, data in group.items()})
    return files
