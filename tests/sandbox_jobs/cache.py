"""A warm-up that builds a Triton-like cache in its worker's home, as the harness's does, and a job
that reports what the cache holds (tests/test_verifier_triton_seed.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

LAUNCHER = "k1/__triton_launcher.so"
KERNEL = "k2/warm.cubin"
GROUP = "k2/__grp__warm.json"


def warm():
    """Build what is missing, like Triton: a launcher and a kernel with its group file, each saying
    which worker built it (its home: pids repeat across pid namespaces); return where the time went."""
    started = time.monotonic()
    root = Path(os.environ["TRITON_CACHE_DIR"])
    for name in (LAUNCHER, KERNEL):
        path = root / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"built in {root}")
    group = root / GROUP
    if not group.exists():
        group.write_text(json.dumps({"child_paths": {"warm.cubin": str(root / KERNEL)}}))
    return {"cache": time.monotonic() - started}


def report(channel, payload):
    """What the cache holds: each file's text and owner, the group's member paths, and whether
    each member can be read where the group says it is."""
    root = Path(os.environ["TRITON_CACHE_DIR"])
    group = json.loads((root / GROUP).read_text())
    channel.send({"uid": os.getuid(), "root": str(root),
                  "files": {name: (root / name).read_text() for name in (LAUNCHER, KERNEL)},
                  "owners": {name: (root / name).stat().st_uid for name in (LAUNCHER, KERNEL, GROUP)},
                  "members": {child: Path(path).read_text() for child, path in group["child_paths"].items()},
                  "paths": group["child_paths"]})
