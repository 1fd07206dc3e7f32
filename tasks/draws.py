"""Hidden shapes drawn anew for every verdict, so that a hidden shape that leaks is worth nothing.

A task's fixed hidden shapes (``HIDDEN_SHAPES``, or those probed from a KernelBench file) are
the same in every verdict. A candidate's process cannot name them to the model (a rejection
made after a hidden call is withheld from prompts), but it can tell a later candidate's process
through whatever the machine shares: session 36's red team carried them from one worker to the
next by timing reads of the page cache, and no sandbox closes every such channel. A later
candidate that knows the checked shapes can be right at exactly those.

So each verdict also checks shapes drawn at that moment from the task's space of shapes, by the
trusted judge, from the operating system's random source: what one candidate saw tells the next
nothing about what it will be checked at. The space comes from, in order:

* ``draw_hidden_shape(rng, device)`` in the task's meta.py: one shape as a dict of the
  reference's integer globals, from ``rng`` (a ``random.Random``) alone, for ``device`` "cuda"
  or "cpu" (the interpreter's sizes are small). It must stay within the memory and time of the
  task's declared shapes; the helpers below draw sizes the way hidden shapes should look: tiny
  to large, odd and non-power-of-two among them.
* a ``batch_size`` global (KernelBench): a declared shape with its batch drawn between 1 and
  its own, the size always safe to vary (shapes.py), and never larger than declared.
* neither: no shape is drawn (``describe`` says so, and ``kernforge tasks show``).
"""

from __future__ import annotations

import math
import random
import weakref
from typing import Any, Callable, Mapping

from .errors import TaskError
from .spec import Shape, Task

#: the meta.py function that draws one hidden shape
DRAWER = "draw_hidden_shape"
#: draws the loader makes from a new task's drawer, per device kind, to find a broken one at once
CHECK_DRAWS = 64


# ---- helpers for a task's drawer -----------------------------------------------------------------
def log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniform: a decode's 1-3 tokens as often as a prefill's thousands."""
    if hi <= lo:
        return lo
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def size(rng: random.Random, lo: int, hi: int, multiple: int = 1, odd: float = 0.3, align: int = 1) -> int:
    """A size in [lo, hi], log-uniform: a multiple of ``multiple`` (a model's widths are), or with
    chance ``odd`` any multiple of ``align`` (the odd, non-power-of-two sizes masks must handle;
    ``align`` where the task's fixed hidden shapes never go below it, as vectorised loads need)."""
    if multiple > 1 and multiple <= hi and rng.random() >= odd:
        return multiple * log_int(rng, max(1, -(-lo // multiple)), hi // multiple)
    return align * log_int(rng, max(1, -(-lo // align)), hi // align)


def rows(rng: random.Random, width: int, most: int, elements: int) -> int:
    """A count of rows of ``width`` (tokens, sequences), log-uniform from 1 to ``most``, and no
    more than ``elements`` in all (the declared shapes' largest call: a drawn call costs no more)."""
    return log_int(rng, 1, max(1, min(most, elements // max(width, 1))))


# ---- drawing ---------------------------------------------------------------------------------------
def describe(task: Task) -> str | None:
    """How this task's verdicts draw hidden shapes, in words; None where they draw none."""
    if _meta_drawer(task) is not None:
        return f"one shape per verdict from meta.py's {DRAWER}"
    if _batches(task, "cuda") or _batches(task, "cpu"):
        return "one shape per verdict: a declared shape with its batch_size drawn between 1 and its own"
    return None


def draw(task: Task, device: str, count: int, rng: random.Random) -> tuple[Shape, ...]:
    """``count`` shapes for one verdict on ``device`` ("cuda" or "cpu"), each differing from
    every declared shape; none where the task has no space to draw from (``describe``)."""
    fn = _drawer(task, device)
    if fn is None or count <= 0:
        return ()
    declared = {*task.shapes(device, hidden=False), *task.shapes(device, hidden=True)}
    out: list[Shape] = []
    for _ in range(count * 8):  # a space that keeps giving declared shapes gives fewer
        if len(out) == count:
            break
        shape = fn(rng)
        if shape not in declared and shape not in out:
            out.append(shape)
    return tuple(out)


def check(task: Task) -> None:
    """TaskError if the task's meta.py drawer fails, or draws what is no shape of it (the loader
    calls this with a seeded generator, so a broken drawer is found when the task loads, not in a
    verdict at night). Once per drawer and process: the reference worker loads its task for every
    request, and 128 draws per load made each load 9 ms where it was 1."""
    fn = _meta_drawer(task)
    if fn is None or fn in _CHECKED:
        return
    for device in ("cuda", "cpu"):
        drawer, rng = _drawer(task, device), random.Random(0)
        for _ in range(CHECK_DRAWS if drawer is not None else 0):
            drawer(rng)
    _CHECKED.add(fn)


#: the meta.py drawers already tried in this process (a file changed on disk is a new module)
_CHECKED: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()


def _drawer(task: Task, device: str) -> Callable[[random.Random], Shape] | None:
    meta = _meta_drawer(task)
    template = (task.shapes(device, hidden=False) or task.public_shapes)[:1]
    if meta is not None and template:
        names = template[0].as_dict()

        def drawn(rng: random.Random) -> Shape:
            return _checked(task, names, _call(task, meta, rng, device))

        return drawn
    batches = _batches(task, device)
    if batches:
        def batch(rng: random.Random) -> Shape:
            shape = rng.choice(batches).as_dict()
            return Shape.of({**shape, "batch_size": log_int(rng, 1, shape["batch_size"])})

        return batch
    return None


def _meta_drawer(task: Task) -> Callable[..., Any] | None:
    from .runtime import meta_module

    meta = meta_module(task)
    fn = getattr(meta, DRAWER, None) if meta is not None else None
    return fn if callable(fn) else None


def _batches(task: Task, device: str) -> list[Shape]:
    """The declared shapes with a batch_size of at least 2 (one of 1 has nothing to draw)."""
    return [s for s in (*task.shapes(device, hidden=False), *task.shapes(device, hidden=True))
            if s.as_dict().get("batch_size", 0) >= 2]


def _call(task: Task, fn: Callable[..., Any], rng: random.Random, device: str) -> Any:
    try:
        return fn(rng, device)
    except Exception as err:  # the task's own bug: named with its file
        raise TaskError(f"{task.meta_path}: {DRAWER}(rng, {device!r}) failed: {type(err).__name__}: {err}") from err


def _checked(task: Task, names: Mapping[str, int], got: Any) -> Shape:
    """``got`` as a shape of the task: a dict of some of its size globals, positive integers."""
    where = f"{task.meta_path}: {DRAWER}"
    if not isinstance(got, Mapping) or not got:
        raise TaskError(f"{where} must return a dict such as {{'T': 16, 'H': 4096}}, not {got!r}")
    unknown = sorted(str(k) for k in got if k not in names)
    if unknown:
        raise TaskError(f"{where} set {unknown}, which are not sizes of the task's shapes (those are: {sorted(names)})")
    bad = sorted(str(k) for k, v in got.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1)
    if bad:
        raise TaskError(f"{where} drew sizes that are not positive integers for {bad}: {dict(got)!r}")
    return Shape.of({**names, **got})
