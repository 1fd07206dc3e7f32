"""Hidden shapes drawn for each verdict (tasks/draws.py): every built-in task's space stays within
its declared shapes' memory and keeps the relations its reference needs; a broken drawer is
found when the task loads; a KernelBench file draws its batch."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest
from kernforge.tasks import draws, runtime
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import builtin_names, load_task

TASKS = Path(__file__).parent / "tasks"
DRAWS = 300

#: what each built-in reference needs of a shape, beyond positive sizes
RELATIONS = {
    "fp8_quant_per_group": lambda s: s["H"] % s["GROUP_SIZE"] == 0,
    "fused_moe": lambda s: s["TOPK"] <= s["E"],
    "moe_topk_softmax": lambda s: s["K"] <= s["E"],
    "paged_decode_attention": lambda s: s["NQ"] % s["NKV"] == 0 and s["D"] % 2 == 0,
    "reshape_and_cache": lambda s: s["T"] <= s["NUM_BLOCKS"] * s["BLOCK_SIZE"],
    "rotary_embedding": lambda s: s["T"] <= s["MAX_POS"] and s["D"] % 2 == 0,
}


def _bytes(task, shape, device):
    """What one call moves (its roofline), and what its inputs hold (drawn as fake tensors:
    shapes and dtypes, no memory), in the CPU's dtypes for either kind: a ratio is what counts."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    moved = runtime.roofline(task, shape, task.dtype(device)).bytes
    try:
        with FakeTensorMode():
            inputs = runtime.make_inputs(task, shape, task.distributions[0], 0, "cpu")
    except DataDependentOutputException:  # a value read back while drawing (rotary's rope base): by its moves alone
        return moved, 0
    return moved, sum(x.numel() * x.element_size() for x in inputs if hasattr(x, "numel"))


def _twos(n: int) -> int:
    """The largest power of two dividing ``n``."""
    return n & -n


@pytest.mark.parametrize("name", builtin_names())
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_builtin_task_draws_new_shapes_within_its_declared_ones(name, device):
    """Each draw is a shape none of the declared ones is, with the same sizes named, that the
    reference can run, moving no more bytes than the largest declared shape (the judge's memory
    plan rests on those), no less aligned than every declared shape is (an honest kernel's
    vectorised loads were never asked for less), and the draws differ from one another: a
    space, not a list."""
    task = load_task(name)
    every = [*task.public_shapes, *task.hidden_shapes, *task.cpu_public_shapes, *task.cpu_hidden_shapes]
    align = {k: min(_twos(s.as_dict()[k]) for s in every) for k in every[0].as_dict()}
    assert draws.describe(task), "every built-in task draws its hidden shapes"
    declared = [*task.shapes(device, hidden=False), *task.shapes(device, hidden=True)]
    sized = [_bytes(task, s, device) for s in declared]
    most = (max(moved for moved, _ in sized), max(held for _, held in sized))
    rng = random.Random(name + device)
    seen = set()
    for _ in range(DRAWS):
        (shape,) = draws.draw(task, device, 1, rng)
        values = shape.as_dict()
        assert shape not in declared and list(values) == list(declared[0].as_dict())
        assert all(isinstance(v, int) and v >= 1 for v in values.values())
        assert RELATIONS.get(name, lambda s: True)(values), shape.label
        assert all(v % align[k] == 0 for k, v in values.items()), f"{shape.label} is less aligned than {align}"
        moved, held = _bytes(task, shape, device)
        assert moved <= most[0] and held <= most[1], f"{shape.label} moves or holds more than any declared shape"
        seen.add(shape)
    assert len(seen) >= 40, "a handful of shapes drawn again and again: a space a model could learn"


@pytest.mark.parametrize("name", builtin_names())
def test_a_drawn_cpu_shape_runs_the_reference_at_every_distribution(name):
    """The relations the test above names are the ones known; running the reference finds the rest."""
    import torch

    task = load_task(name)
    rng = random.Random(name)
    for shape in draws.draw(task, "cpu", 3, rng):
        runtime.set_shape(runtime.reference_module(task), shape)
        for dist in task.distributions:
            inputs = runtime.make_inputs(task, shape, dist, 7, "cpu")
            model = runtime.reference_module(task).Model(*runtime.reference_module(task).get_init_inputs())
            with torch.no_grad():
                out = model(*inputs)
            outs = out if isinstance(out, (tuple, list)) else [out] if out is not None else []
            assert all(torch.isfinite(o.float()).all() for o in outs if o.is_floating_point()), (shape.label, dist)


def test_the_sizes_are_log_uniform_odd_sometimes_and_within_bounds():
    rng = random.Random(3)
    values = [draws.log_int(rng, 1, 16384) for _ in range(4000)]
    assert min(values) == 1 and max(values) <= 16384
    # log-uniform: about as many below 128 as from 128 up
    assert 0.35 < sum(v < 128 for v in values) / len(values) < 0.65
    sizes = [draws.size(rng, 16, 8192, 128) for _ in range(4000)]
    assert all(16 <= v <= 8192 for v in sizes)
    odd = sum(v % 128 != 0 for v in sizes) / len(sizes)
    assert 0.2 < odd < 0.4, "about three in ten are any integer at all"
    assert sum(v % 2 for v in sizes) > 300, "odd sizes among them"
    aligned = [draws.size(rng, 16, 8192, 128, align=8) for _ in range(2000)]
    assert all(v % 8 == 0 and 16 <= v <= 8192 for v in aligned) and sum(v % 128 != 0 for v in aligned) > 400
    assert draws.log_int(rng, 5, 5) == 5 and draws.size(rng, 3, 3, 128) == 3


def _task_with(tmp_path, drawer: str) -> Path:
    folder = tmp_path / "norm"
    shutil.copytree(TASKS / "tiny_norm", folder)
    (folder / "meta.py").write_text((folder / "meta.py").read_text() + "\n\n" + drawer)
    return folder


@pytest.mark.parametrize("drawer, words", [
    ("def draw_hidden_shape(rng, device):\n    return {'T': 1 // 0}", "draw_hidden_shape(rng, 'cuda') failed: ZeroDivisionError"),
    ("def draw_hidden_shape(rng, device):\n    return {'T': 3, 'W': 4}", "set ['W'], which are not sizes"),
    ("def draw_hidden_shape(rng, device):\n    return {'T': 0, 'H': 64}", "not positive integers for ['T']"),
    ("def draw_hidden_shape(rng, device):\n    return [3, 64]", "must return a dict"),
    ("draw_hidden_shape = 3", "`draw_hidden_shape` must be a function"),
])
def test_a_broken_drawer_is_said_when_the_task_loads(tmp_path, drawer, words):
    with pytest.raises(TaskError) as err:
        load_task(_task_with(tmp_path, drawer))
    assert words in str(err.value) and "meta.py" in str(err.value)


def test_a_drawer_is_called_per_device_kind(tmp_path):
    task = load_task(_task_with(tmp_path, "def draw_hidden_shape(rng, device):\n"
                                          "    return {'T': rng.randint(1, 9), 'H': 4096 if device == 'cuda' else 33}"))
    rng = random.Random(0)
    assert {s.as_dict()["H"] for s in draws.draw(task, "cuda", 3, rng)} == {4096}
    assert {s.as_dict()["H"] for s in draws.draw(task, "cpu", 3, rng)} == {33}
    assert len(draws.draw(task, "cpu", 3, rng)) == 3 and draws.draw(task, "cpu", 0, rng) == ()


def test_a_space_that_keeps_giving_declared_shapes_gives_fewer(tmp_path):
    """A drawer whose every draw is a declared shape draws none: checking a fixed hidden shape
    twice is not a drawn one."""
    task = load_task(_task_with(tmp_path, "def draw_hidden_shape(rng, device):\n    return {'T': 3, 'H': 96}"))
    assert draws.draw(task, "cpu", 1, random.Random(0)) == ()


def test_a_kernelbench_file_draws_its_batch_and_a_task_without_either_draws_none():
    kb = load_task(TASKS / "kb_relu.py")
    declared = [*kb.shapes("cuda", hidden=False), *kb.shapes("cuda", hidden=True)]
    assert "batch_size" in declared[0].as_dict() and "batch_size drawn" in draws.describe(kb)
    most = max(s.as_dict()["batch_size"] for s in declared)
    rng = random.Random(1)
    for _ in range(50):
        for shape in draws.draw(kb, "cuda", 1, rng):
            values = shape.as_dict()
            assert 1 <= values["batch_size"] <= most and shape not in declared
            # every other size is one declared shape's
            assert any({k: v for k, v in s.as_dict().items() if k != "batch_size"}
                       == {k: v for k, v in values.items() if k != "batch_size"} for s in declared)
    plain = load_task(TASKS / "tiny_norm")
    assert draws.describe(plain) is None and draws.draw(plain, "cpu", 2, rng) == ()


def test_log_int_covers_its_range_evenly_in_log():
    rng = random.Random(9)
    buckets = [0] * 4
    for _ in range(8000):
        buckets[min(3, int(math.log(draws.log_int(rng, 1, 65535), 16)))] += 1
    assert all(1500 < b < 2500 for b in buckets), buckets


def test_tasks_show_says_how_many_hidden_shapes_are_fixed_and_how_more_are_drawn(tmp_path):
    """The operator's view, never a size: the counts and the source of the draws."""
    import json

    from kernforge.cli import app
    from typer.testing import CliRunner

    cli, db = CliRunner(), str(tmp_path / "none.db")
    text = cli.invoke(app, ["tasks", "show", "rms_norm", "--db", db]).output
    assert "Hidden shapes (never shown to the model): 4 fixed; drawn: one shape per verdict from meta.py's draw_hidden_shape" in text
    assert "8191" not in text and "3584" not in text, "no hidden size"
    plain = cli.invoke(app, ["tasks", "show", str(TASKS / "tiny_norm"), "--db", db, "--json"])
    assert plain.exit_code == 0, plain.output
    hidden = json.loads(plain.output)["hidden"]
    assert hidden["fixed"] == 2 and hidden["drawn"].startswith("none: the task's meta.py has no draw_hidden_shape")


def test_a_drawer_is_tried_once_per_process_not_per_load(tmp_path):
    """The reference worker loads its task for every request: 128 draws per load made each load
    9 ms where it was 1."""
    from kernforge.tasks import runtime as R

    folder = _task_with(tmp_path, "_calls = []\n\n\ndef draw_hidden_shape(rng, device):\n"
                                  "    _calls.append(device)\n    return {'T': rng.randint(6, 9), 'H': 64}")
    first = load_task(folder)
    load_task(folder)
    calls = R.meta_module(first)._calls
    assert len(calls) == 2 * draws.CHECK_DRAWS and set(calls) == {"cuda", "cpu"}
