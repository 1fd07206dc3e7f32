"""Honest kernels in styles a model or a person writes (red team G), each once refused by a rule
too broad for it: an encoding check that read a comment Python ignores (line 2 under a docstring), or a UTF-8 spelling it
did not know; the static screen on a lock around a cache, a CPU-affinity query, a device query
at import inside ``try``, and a custom op named after vLLM's (called a cheat). Each file names
its task on its last line (``# task: NAME``); all are accepted with the screen on."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from kernel_checks import check_kernel
from kernforge.tasks import draws
from kernforge.tasks.loader import load_task

HONEST = sorted((Path(__file__).parent / "honest").glob("*.py"))


def _task(path: Path) -> str:
    return re.search(r"^# task: (\S+)", path.read_text(encoding="utf-8"), re.M).group(1)


@pytest.mark.parametrize("path", HONEST, ids=[p.stem for p in HONEST])
def test_an_honest_kernel_is_right_at_its_tasks_drawn_shapes(path):
    """Every verdict also checks a shape drawn for it (tasks/draws.py): the same shapes here every
    run, so that a corpus kernel wrong somewhere in its task's space fails here, not by chance."""
    task = load_task(_task(path))
    check_kernel(task, "cpu", draws.draw(task, "cpu", 6, random.Random(path.stem)), path)


@pytest.mark.parametrize("path", HONEST, ids=[p.stem for p in HONEST])
def test_an_honest_kernel_in_an_unusual_style_is_accepted(cpu_judge, path):
    verdict = cpu_judge.verify(path.read_text(encoding="utf-8"), load_task(_task(path)))
    assert verdict.accepted, f"{verdict.status.value} #{verdict.threat}: {verdict.reason}"
