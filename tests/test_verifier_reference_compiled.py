"""A timed batch's stacked reference compiled (reference_compiled.py), on the CPU: off unless
asked for; where asked, it stands in only once it agreed with the eager answers on the batch's
checked calls, and a window it verifies still finds the wrong call (and judges it by the eager
low answers, as the eager stacked reference does); a compiled answer that disagrees with eager,
or a compile that fails, leaves the batch on the eager reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernforge.tasks.loader import load_task
from kernforge.verifier import reference_batched, reference_compiled
from kernforge.verifier import refworker as W
from refworker_helpers import gpu_batch, refworker_arena  # noqa: E402
from test_verifier_reference_batched import _honest_outputs, _plan, each_call_close

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture
def arena():
    with refworker_arena(64 << 20, 32 << 20) as made:
        yield made


def _verify(task: object) -> dict:
    return W._verify_batch("cpu", {"key": "b", "tolerances": task.tolerance_table()})


def _honest_batch(arena, calls: int = 8) -> tuple[object, W._Batch]:
    """tiny_norm's timed batch of ``calls`` calls, its outputs an honest kernel's."""
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, calls + 1)), {"T": 5, "H": 200})
    _honest_outputs(arena, batch, task)
    return task, batch


def test_it_is_off_unless_asked_for(arena, monkeypatch):
    monkeypatch.delenv(reference_compiled.ENV, raising=False)
    task, batch = _honest_batch(arena)
    assert _verify(task)["failed_call"] == -1
    assert batch.ref_stacked and batch.ref_stacked.low_dtypes is not None and not batch.ref_stacked.compiled


def test_a_compiled_reference_verifies_a_window_and_finds_the_wrong_call(arena, monkeypatch):
    monkeypatch.setenv(reference_compiled.ENV, "1")
    task, batch = _honest_batch(arena, 9)
    assert _verify(task)["failed_call"] == -1
    assert batch.ref_stacked.compiled, "it agreed with eager on the checked calls"
    runs = []
    run = reference_compiled.run
    monkeypatch.setattr(reference_compiled, "run", lambda *a: runs.append(1) or run(*a))
    got = _verify(task)
    assert got["failed_call"] == -1 and got["max_abs_err"] < 1e-3 and runs, "the window verified by the compiled graph"
    arena.view(batch.outputs[4][0])[2, 9] += 1.0
    got = _verify(task)
    assert got["failed_call"] == 4 and "derived_out" in got["steps"], "a call out: judged by the eager low answers"
    assert got["results"][0]["details"]["bad"] == 1


def test_a_compiled_answer_that_disagrees_with_eager_is_not_used(arena, monkeypatch):
    monkeypatch.setenv(reference_compiled.ENV, "1")
    run = reference_compiled.run

    def off(*args):
        highs, lows = run(*args)
        return [h * 1.01 for h in highs], lows  # a hundredth off: far more than a sixteenth of the tolerance

    monkeypatch.setattr(reference_compiled, "run", off)
    task, batch = _honest_batch(arena)
    assert _verify(task)["failed_call"] == -1
    assert batch.ref_stacked and batch.ref_stacked.low_dtypes is not None and not batch.ref_stacked.compiled


def test_a_compile_that_fails_leaves_the_eager_reference(arena, monkeypatch):
    monkeypatch.setenv(reference_compiled.ENV, "1")

    def fails(*args):
        raise RuntimeError("Inductor could not lower this")

    monkeypatch.setattr(reference_compiled, "run", fails)
    task, batch = _honest_batch(arena)
    assert _verify(task)["failed_call"] == -1 and batch.ref_stacked and not batch.ref_stacked.compiled


def test_the_compiled_answers_are_the_stacked_references_within_its_bound(monkeypatch):
    """Every built-in task whose stacked reference derives its low answers: the compiled graph's
    answers at a CPU shape lie within the stacked reference's own bound of the eager vmap's."""
    monkeypatch.setenv(reference_compiled.ENV, "1")
    task = load_task("rms_norm")
    shape = task.cpu_public_shapes[-1]
    from kernforge.tasks import runtime

    stacked = runtime.make_many(task, shape, task.distributions[0], 5, 4, "cpu")
    model = W._model(task.ref, shape, 3, "cpu")
    calls = [[s[k] for s in stacked] for k in range(4)]
    found = reference_batched.prepare(model, stacked, calls, task.mutated_inputs, lambda t: W._tolerance(t, task.tolerance_table()))
    assert found is not None and found.low_dtypes is not None and found.compiled
    eager = reference_batched.StackedReference(**{**found.__dict__, "compiled": False})
    got, want = found.run(stacked, 0, 4, exact=False), eager.run(stacked, 0, 4, exact=False)
    tolerances = [W._tolerance(lo, task.tolerance_table()) for lo in want[1]]
    for k in range(4):
        assert reference_batched._close([h[k] for h in got[0]], [h[k] for h in want[0]], tolerances)
        assert reference_batched._close([lo[k] for lo in got[1]], [lo[k] for lo in want[1]], tolerances)
    assert all(g.dtype == w.dtype for g, w in zip(got[1], want[1]))


# ---- on a GPU ------------------------------------------------------------------------------------
BUILTIN = sorted(p.name for p in (Path(__file__).parent.parent / "tasks" / "builtin").iterdir() if (p / "meta.py").exists())


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTIN)
def test_on_the_gpu_the_compiled_reference_is_close_to_eager_at_every_call(name, monkeypatch):
    """bf16 and fp8 at the task's smallest public GPU shape, 24 calls (fewer for large ones): where
    the compiled reference stands in, every call's answers (not only the checked ones) are as close
    to eager's as the check asks, and an honest batch passes its verification by it."""
    monkeypatch.setenv(reference_compiled.ENV, "1")
    task = load_task(name)
    with gpu_batch(task) as (made, batch, calls):
        shape = batch.shape
        model = W._model(task.ref, batch.shape, 3, "cuda")
        stacked = None
        if batch.stacked is not None:
            stacked = reference_batched.prepare(model, batch.stacked, [W._call_inputs(batch, k) for k in range(calls)],
                                                task.mutated_inputs, lambda t: W._tolerance(t, task.tolerance_table()))
        print(f"{name} {shape.label}: {'compiled' if stacked and stacked.compiled else 'eager'}")
        if stacked is not None and stacked.compiled:
            for start, count in stacked.parts(calls):
                if count < 2:
                    continue
                each_call_close(model, batch, task, start, *stacked.run(batch.stacked, start, count, exact=False))
        _honest_outputs(made, batch, task)
        assert W._verify_batch("cuda", {"key": "b", "tolerances": task.tolerance_table()})["failed_call"] == -1
