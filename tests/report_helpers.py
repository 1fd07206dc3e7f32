"""Archives for the report's tests, written through the real store API with archive/synthetic.py."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from kernforge.archive import synthetic
from kernforge.archive.store import Archive

TASKS = ("rms_norm", "softmax")


def make_archive(path: Path, *, runs: int = 2, per_run: int = 40, environment=synthetic.H200, seed: int = 5) -> Path:
    """``runs`` finished runs over ``TASKS``, each attempt the child of the one before it in its task.
    Accepted GPU attempts are audited two in three (one of those fails: demoted); every seventh
    attempt re-proposes an earlier one's code (a reuse row); one in ten attempts runs on an A100."""
    rng = random.Random(seed)
    with Archive.create(path) as archive:
        ids = {name: archive.register_task(synthetic.task_record(name)) for name in TASKS}
        last: dict[str, int] = {}
        evaluated: list[tuple[int, str, object]] = []  # (attempt id, task, NewAttempt)
        salt = 0
        for r in range(runs):
            run = archive.start_run({"model": "minimax-m3", "n": r})
            for seq in range(per_run):
                name = TASKS[seq % len(TASKS)]
                env = synthetic.A100 if environment is synthetic.H200 and seq % 10 == 9 else environment
                if seq % 7 == 6 and evaluated:
                    original_id, task, original = next(e for e in reversed(evaluated) if e[1] == name)
                    item = replace(original, run_id=run, seq=seq, reuse_of=original_id, parent_id=last.get(name))
                    last[name] = archive.record_attempt(item)
                    continue
                salt += 1
                item = synthetic.attempt(rng, run, seq, ids[name], name, salt, environment=env,
                                         parent_id=last.get(name))
                attempt_id = archive.record_attempt(item)
                last[name] = attempt_id
                evaluated.append((attempt_id, name, item))
                if item.verdict.accepted and env.get("device") != "cpu" and salt % 3:
                    archive.record_audit(attempt_id, synthetic.audit(item.verdict, ratio=1.0 if salt % 3 == 1 else 1.5),
                                         run_id=run)
            archive.finish_run(run)
    return path
