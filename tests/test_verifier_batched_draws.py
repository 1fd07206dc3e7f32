"""A timed batch's fresh inputs drawn for all its calls at once (``runtime.make_many`` under vmap,
``refworker._fill_batched``), on the CPU: the same distribution as one call at a time, inputs of
their own for every call and every window, and a fall back to one call at a time wherever the
task's draw cannot be batched or would lose its randomness under vmap."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier import refworker as W
from kernforge.verifier.messages import TensorRef
from refworker_helpers import refworker_arena  # noqa: E402

TASKS = Path(__file__).parent / "tasks"
BUILTIN = sorted(p.name for p in (Path(__file__).parent.parent / "tasks" / "builtin").iterdir()
                 if (p / "meta.py").exists())
CALLS = 32


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov distance of two tensors' values."""
    a, b = a.flatten().double().sort().values, b.flatten().double().sort().values
    both = torch.cat([a, b])
    return float((torch.searchsorted(a, both, right=True) / a.numel() - torch.searchsorted(b, both, right=True) / b.numel()).abs().max())


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_task_draws_a_batch_like_its_calls_one_at_a_time(name):
    """Each input comes back for every call with the call's shape and dtype; no two calls of an
    input that varies with the seed are the same; its values are as far (Kolmogorov-Smirnov)
    from as many calls drawn one at a time as two sets of calls drawn one at a time are from
    each other, within sampling noise; the reference runs on a batched call and is finite where
    it is on a call drawn alone."""
    task = load_task(name)
    shape = max(task.cpu_public_shapes, key=lambda s: sum(v for _, v in s.params))
    model = W._model(task.ref, shape, 3, "cpu")
    for dist in task.distributions:
        alone, twin = ([runtime.make_inputs(task, shape, dist, seed, "cpu") for seed in seeds]
                       for seeds in (range(1, CALLS + 1), range(CALLS + 1, 2 * CALLS + 1)))
        many = runtime.make_many(task, shape, dist, 1234, CALLS, "cpu")
        assert many is not None, f"{name} {dist}: the draw does not batch"

        def stacked(calls: list[list[object]], j: int) -> torch.Tensor:
            return torch.stack([[x for x in call if isinstance(x, torch.Tensor)][j] for call in calls])

        assert len(many) == len([x for x in alone[0] if isinstance(x, torch.Tensor)])
        for j, batched in enumerate(many):
            one, other = stacked(alone, j), stacked(twin, j)
            where = f"{name} {dist} input {j}"
            assert batched.shape == one.shape and batched.dtype == one.dtype, where
            if not torch.equal(one[0], one[1]):  # it varies with the seed: it varies across calls
                rows = batched.reshape(CALLS, -1)
                assert all(not torch.equal(rows[0], rows[k]) for k in range(1, CALLS)), where
            noise = (2 / one.numel()) ** 0.5
            assert _ks(one, batched) <= 2 * _ks(one, other) + 2 * noise, where
        values = [x for x in alone[0] if not isinstance(x, torch.Tensor)]
        batched_call = iter(x[5] for x in many)
        call = [next(batched_call) if isinstance(x, torch.Tensor) else x for x in alone[0]]
        assert values == [x for x in call if not isinstance(x, torch.Tensor)]
        with torch.no_grad():
            want, got = model(*alone[0]), model(*call)
        for w, g in zip(*(r if isinstance(r, (tuple, list)) else [r] for r in (want, got))):
            if isinstance(w, torch.Tensor) and w.is_floating_point():
                w, g = w.float(), g.float()
                assert bool(torch.isfinite(g).all()) or not bool(torch.isfinite(w).all()), f"{name} {dist}"


def test_a_kernelbench_file_draws_a_batch_from_get_inputs():
    task = load_task(str(TASKS / "kb_relu.py"))
    shape = task.cpu_public_shapes[0] if task.cpu_public_shapes else task.public_shapes[0]
    many = runtime.make_many(task, shape, task.distributions[0], 7, 5, "cpu")
    one = runtime.make_inputs(task, shape, task.distributions[0], 7, "cpu")
    assert many is not None and many[0].shape == (5, *one[0].shape)
    assert len({float(x.flatten()[0]) for x in many[0]}) == 5


@pytest.fixture
def arena():
    with refworker_arena(8 << 20, 4 << 20) as made:
        yield made


def _plan(task_ref: str, seeds: list[int], shape: dict[str, int]) -> W._Batch:
    W._plan_batch("cpu", {"key": "b", "task_ref": task_ref, "shape": shape, "dist": "normal", "seeds": seeds, "init_seed": 3})
    return W._STATE["batches"]["b"]


def _calls(batch: W._Batch) -> list[list[torch.Tensor]]:
    return [[v.clone() for v in views if v is not None] for views in batch.views]


def test_every_window_gives_every_call_new_inputs_drawn_at_once(arena):
    shape = {"T": 5, "H": 200}
    batch = _plan(str(TASKS / "tiny_norm"), list(range(10, 26)), shape)
    assert batch.stacked is not None and batch.stacked_checked, "a new batch's calls are drawn together too"
    first = _calls(batch)
    assert all(not torch.equal(first[0][0], other[0]) for other in first[1:])
    _plan(str(TASKS / "tiny_norm"), list(range(40, 56)), shape)
    second = _calls(batch)
    for k, call in enumerate(second):
        assert all(not torch.equal(a, b) for a, b in zip(call, first[k])), f"call {k} kept a window's input"
        assert all(not torch.equal(call[0], other[0]) for other in second[k + 1:]), f"call {k} repeats another"
    # the stacked views are the per-call views the reference reads
    assert torch.equal(batch.stacked[0][3], batch.views[3][0])
    assert batch.inputs == [[None, None]] * 16


def _variant(tmp_path: Path, make_inputs: str) -> str:
    """tiny_norm with another make_inputs."""
    root = tmp_path / "variant"
    shutil.copytree(TASKS / "tiny_norm", root)
    meta = (root / "meta.py").read_text()
    start = meta.index("def make_inputs")
    end = meta.index("def roofline")
    (root / "meta.py").write_text(meta[:start] + make_inputs + "\n\n" + meta[end:])
    return str(root)


HOST_READ = '''def make_inputs(shape, dist, dtype, device, generator):
    t, h = shape["T"], shape["H"]
    scale = float(torch.rand((), generator=generator))  # read on the host: vmap cannot batch it
    x = scale * torch.randn(t, h, device=device, generator=generator)
    return [x.to(dtype), torch.ones(h, device=device).to(dtype)]
'''

# the seed itself on the host: each call differs when drawn alone, every call is the same under
# vmap (one generator for all): a window of identical calls, which a caching kernel could pass
SEED_ON_HOST = '''def make_inputs(shape, dist, dtype, device, generator):
    t, h = shape["T"], shape["H"]
    x = torch.full((t, h), float(generator.initial_seed() % 997), device=device)
    return [x.to(dtype), torch.ones(h, device=device).to(dtype)]
'''


@pytest.mark.parametrize("code", [HOST_READ, SEED_ON_HOST], ids=["host_read", "seed_on_host"])
def test_a_draw_that_cannot_batch_is_drawn_one_call_at_a_time(arena, tmp_path, code):
    ref = _variant(tmp_path, code)
    shape = {"T": 5, "H": 200}
    batch = _plan(ref, list(range(10, 18)), shape)
    seeds = list(range(60, 68))
    _plan(ref, seeds, shape)
    assert batch.stacked is None
    task = load_task(ref)
    for k, seed in enumerate(seeds):
        want = runtime.make_inputs(task, task.cpu_hidden_shapes[1], "normal", seed, "cpu")
        assert all(torch.equal(v, w) for v, w in zip(batch.views[k], want)), f"call {k}"


def test_calls_laid_out_unevenly_are_not_stacked(arena):
    batch = _plan(str(TASKS / "tiny_norm"), [1, 2, 3], {"T": 5, "H": 200})
    refs = [[dict(a) for a in args] for args in batch.sets]
    moved = dict(refs[2][0]["ref"])
    moved["offset"] += 512
    batch.sets = [refs[0], refs[1], [{"ref": moved}, refs[2][1]]]
    assert W._stacked_views(batch) is None
    batch.sets = refs
    assert W._stacked_views(batch) is not None


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "per_call"])
def test_a_written_input_is_found_among_inputs_written_in_place(arena, stacked):
    """fused_add_rms_norm writes x and the residual in place: written there, nothing is said;
    its weight written in one call of many is found, compared input by input over every call at
    once (or call by call where the calls are not stacked)."""
    task = load_task("fused_add_rms_norm")
    shape = task.cpu_public_shapes[0].as_dict()
    batch = _plan(task.ref, list(range(1, 9)), shape)
    if not stacked:
        batch.stacked = None
    batch.region.copy_(batch.pristine)
    written = W._stacked_views(batch, batch.region) if stacked else None
    views = [[arena.view(TensorRef(**a["ref"])) for a in args] for args in batch.sets]
    for i in task.mutated_inputs:
        views[1][i].add_(1.0)
    assert W._batch_mutations(batch, arena, task) == []
    weight = next(i for i in range(len(views[0])) if i not in task.mutated_inputs)
    views[5][weight].view(-1)[-1] += 1.0
    assert W._batch_mutations(batch, arena, task) == [weight]
    if written is not None:
        assert written[weight].data_ptr() == views[0][weight].data_ptr()


def test_the_padding_between_a_new_batchs_inputs_is_zero(arena):
    """No draw writes the padding between inputs, and the region the candidate reads is written
    from the pristine bytes: they start as zeros, never as this worker's earlier memory."""
    arena.data.fill_(0xFF)
    batch = _plan(str(TASKS / "tiny_norm"), list(range(1, 9)), {"T": 5, "H": 200})
    assert batch.stacked_checked
    used = torch.zeros(batch.region.numel(), dtype=torch.bool)
    for args in batch.sets:
        for a in args:
            ref = TensorRef(**a["ref"])
            used[ref.offset: ref.offset + ref.span] = True
    assert not bool(used.all()), "tiny_norm's inputs leave padding"
    assert int(batch.pristine[~used].count_nonzero()) == 0
    assert int(batch.region[~used].count_nonzero()) == 0


def test_a_batched_draw_that_fails_after_its_check_draws_that_window_call_by_call(arena, monkeypatch):
    """Say the draw runs out of memory on a later window: that window is drawn one call at a time,
    every call written again, and the next window tries a batched draw again."""
    shape = {"T": 5, "H": 200}
    batch = _plan(str(TASKS / "tiny_norm"), list(range(1, 9)), shape)
    assert batch.stacked_checked
    real = runtime.make_many
    monkeypatch.setattr(runtime, "make_many", lambda *args: None)
    seeds = list(range(20, 28))
    _plan(str(TASKS / "tiny_norm"), seeds, shape)
    task = load_task(str(TASKS / "tiny_norm"))
    for k, seed in enumerate(seeds):
        want = runtime.make_inputs(task, task.cpu_hidden_shapes[1], "normal", seed, "cpu")
        assert all(torch.equal(v, w) for v, w in zip(batch.views[k], want)), f"call {k}"
    assert batch.stacked is not None
    monkeypatch.setattr(runtime, "make_many", real)
    before = _calls(batch)
    _plan(str(TASKS / "tiny_norm"), list(range(40, 48)), shape)
    assert all(not torch.equal(a[0], b[0]) for a, b in zip(_calls(batch), before))


def test_a_batch_of_large_calls_never_holds_two_calls_drawn_alone(arena, monkeypatch):
    """Calls too large to draw two at once are drawn and laid out one at a time, as before
    batched draws: the memory this worker's allocator keeps is memory the candidate lacks (a
    pair of 3 GB fused_moe calls held through the layout left an honest audit out of memory)."""
    import weakref

    monkeypatch.setattr(W, "MANY_BYTES", 1)
    monkeypatch.setattr(W, "DRAWN_KEEP_BYTES", 0)
    real, alive, most = runtime.make_inputs, [], [0]

    def counting(*args):
        most[0] = max(most[0], sum(1 for r in alive if r() is not None))
        got = real(*args)
        alive.append(weakref.ref(got[0]))
        return got

    monkeypatch.setattr(runtime, "make_inputs", counting)
    batch = _plan(str(TASKS / "tiny_norm"), list(range(1, 7)), {"T": 5, "H": 200})
    assert batch.stacked is None or not batch.stacked_checked
    assert len(alive) == 12, "laid out, then drawn again, one call at a time"
    assert most[0] <= 1, f"{most[0]} calls' inputs held while another was drawn"
