"""A timed batch's reference run over many calls at once (``reference_batched``, under vmap), on
the CPU: the same answers as each call run alone, for every built-in task whose reference vmap
can run; ruled out (the calls run one at a time, as before) wherever it would not give eager's
answer; and the verification of a batch by it finds the same wrong calls, in any part, with the
candidate's outputs laid out evenly or not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernforge.tasks.loader import load_task
from kernforge.tasks.spec import Shape, Tolerance
from kernforge.verifier import integrity, reference, reference_batched
from kernforge.verifier import refworker as W
from kernforge.verifier.arena import Arena, Slots
from kernforge.verifier.messages import TensorRef
from refworker_helpers import gpu_batch, refworker_arena  # noqa: E402

TASKS = Path(__file__).parent / "tasks"
BUILTIN = sorted(p.name for p in (Path(__file__).parent.parent / "tasks" / "builtin").iterdir()
                 if (p / "meta.py").exists())
#: built-in references vmap cannot run (a data-dependent index per expert): their calls run alone
NOT_STACKED = {"fused_moe"}


@pytest.fixture
def arena():
    with refworker_arena(64 << 20, 32 << 20) as made:
        yield made


def _plan(task: object, seeds: list[int], shape: dict[str, int]) -> W._Batch:
    W._plan_batch("cpu", {"key": "b", "task_ref": task.ref, "shape": shape, "dist": task.distributions[0], "seeds": seeds,
                          "init_seed": 3})
    return W._STATE["batches"]["b"]


def _prepare(batch: W._Batch, task: object) -> reference_batched.StackedReference | None:
    model = W._model(task.ref, batch.shape, 3, "cpu")
    calls = [W._call_inputs(batch, k) for k in range(len(batch.sets))]
    return reference_batched.prepare(model, batch.stacked, calls, task.mutated_inputs,
                                     lambda t: W._tolerance(t, task.tolerance_table()))


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_reference_run_stacked_gives_each_calls_own_answer(arena, name):
    task = load_task(name)
    batch = _plan(task, list(range(1, 7)), task.cpu_public_shapes[-1].as_dict())
    assert batch.stacked is not None
    stacked = _prepare(batch, task)
    if name in NOT_STACKED:
        assert stacked is None
        return
    assert stacked is not None and stacked.part == 6
    highs, lows = stacked.run(batch.stacked, 0, 6)
    model = W._model(task.ref, batch.shape, 3, "cpu")
    for k in range(6):
        high, low = reference.run_reference(model, W._call_inputs(batch, k), task.mutated_inputs)
        for got, want in zip([h[k] for h in highs] + [lo[k] for lo in lows], high + low):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"call {k}")
    # the task's own inputs written in place are left as they were drawn
    again = _plan(task, list(range(1, 7)), task.cpu_public_shapes[-1].as_dict())
    assert again is batch


def test_an_answer_further_from_eager_than_allowed_rules_it_out(arena, monkeypatch):
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    run = reference_batched.StackedReference.run
    tol = W._tolerance(torch.empty(0), task.tolerance_table())

    def off_by(amount: float):
        def shifted(self, stacked, start, count, **kw):
            highs, lows = run(self, stacked, start, count, **kw)
            highs[0][count - 1] += amount * (tol.rtol * highs[0][count - 1].abs() + tol.atol)  # the last call only
            return highs, lows
        return shifted

    monkeypatch.setattr(reference_batched.StackedReference, "run", off_by(0.5))
    assert _prepare(batch, task) is None, "half the tolerance off, at one call"
    monkeypatch.setattr(reference_batched.StackedReference, "run", off_by(0.01))
    assert _prepare(batch, task) is not None, "well inside the sixteenth of the tolerance"


def test_close_allows_a_rounding_step_and_wants_the_same_non_finite_values():
    tol = [Tolerance(rtol=1e-2, atol=1e-2)]
    want = torch.tensor([1.0, -3.0, 0.5, 200.0], dtype=torch.bfloat16)
    step = (want.view(torch.int16) + 1).view(torch.bfloat16)  # each one rounding step away from zero
    assert reference_batched._close([step], [want], tol)
    assert not reference_batched._close([(step.view(torch.int16) + 2).view(torch.bfloat16)], [want], tol), "three steps"
    nan = torch.tensor([float("nan"), float("inf"), 1.0])
    assert reference_batched._close([nan.clone()], [nan], tol)
    assert not reference_batched._close([torch.tensor([float("nan"), float("-inf"), 1.0])], [nan], tol)
    assert not reference_batched._close([torch.tensor([0.0, float("inf"), 1.0])], [nan], tol)
    fp8 = torch.tensor([1.0, -3.0, 0.5, 448.0]).to(torch.float8_e4m3fn)
    one = (fp8.view(torch.uint8) - torch.tensor([0, 0, 1, 1], dtype=torch.uint8)).view(torch.float8_e4m3fn)
    assert reference_batched._close([one], [fp8], tol), "float8: one step, as a sum in another order rounds"
    two = (fp8.view(torch.uint8) - torch.tensor([0, 2, 0, 0], dtype=torch.uint8)).view(torch.float8_e4m3fn)  # -3 to -2.5
    assert not reference_batched._close([two], [fp8], tol)
    ints = torch.tensor([1, 2, 3])
    assert not reference_batched._close([ints + torch.tensor([0, 0, 1])], [ints], tol), "integers bit for bit"


ITEM = '''import torch
import torch.nn as nn

T = 4
H = 64


class Model(nn.Module):
    def forward(self, x, weight):
        return x * float(weight.abs().max())  # read on the host: vmap cannot run it


def get_inputs():
    return [torch.randn(T, H), 1.0 + 0.1 * torch.randn(H)]


def get_init_inputs():
    return []
'''


def _tiny_norm_with(tmp_path: Path, name: str, reference_source: str) -> object:
    """tiny_norm with another reference."""
    root = tmp_path / name
    root.mkdir()
    for f in (TASKS / "tiny_norm").iterdir():
        if f.is_file():
            (root / f.name).write_text(f.read_text())
    (root / "reference.py").write_text(reference_source)
    return load_task(str(root))


def test_a_reference_vmap_cannot_run_is_run_call_by_call(arena, tmp_path):
    task = _tiny_norm_with(tmp_path, "item_norm", ITEM)
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    assert batch.stacked is not None and _prepare(batch, task) is None
    _honest_outputs(arena, batch, task)
    got = W._verify_batch("cpu", {"key": "b", "tolerances": task.tolerance_table()})
    assert got["failed_call"] == -1 and batch.ref_stacked is False


def test_plain_values_that_differ_between_calls_rule_it_out():
    model = torch.nn.Identity()
    calls = [[torch.ones(3), 1], [torch.ones(3), 2]]
    assert reference_batched.prepare(model, [torch.ones(2, 3)], calls, [], lambda t: Tolerance(rtol=1e-2, atol=1e-2)) is None


def _honest_outputs(arena: Arena, batch: W._Batch, task: object, gap: int = 0) -> None:
    """Each call's right outputs placed in the heap (``gap`` bytes more before every other call's:
    the outputs then lie unevenly), then the inputs it writes in place, where they lie; the
    trusted write done before."""
    batch.region.copy_(batch.pristine)
    heap = Slots(arena.layout.input_bytes, arena.layout.size)
    model = W._model(task.ref, batch.shape, 3, str(arena.data.device))
    outputs = []
    with torch.no_grad():
        for k, args in enumerate(batch.sets):
            if gap and k % 2:
                heap.next += gap
            got = model(*[arena.view(TensorRef(**a["ref"])) if a.get("ref") else a["value"] for a in args])
            returned = [t for t in (got if isinstance(got, (tuple, list)) else [got]) if isinstance(t, torch.Tensor)]
            outputs.append([arena.place(heap, t) for t in returned] + [TensorRef(**args[i]["ref"]) for i in task.mutated_inputs])
    W._place_outputs(batch, outputs)


@pytest.mark.parametrize("gap", [0, 512], ids=["even", "uneven"])
@pytest.mark.parametrize("part_bytes", [reference_batched.PART_BYTES, 1], ids=["one part", "parts of two"])
def test_a_wrong_call_is_found_in_any_part_with_outputs_laid_out_evenly_or_not(arena, monkeypatch, gap, part_bytes):
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, 10)), {"T": 5, "H": 200})
    _honest_outputs(arena, batch, task, gap)
    model = W._model(task.ref, batch.shape, 3, "cpu")
    low = reference.run_low(model, W._call_inputs(batch, 0), [])
    per_call = reference_batched.call_bytes(model, W._call_inputs(batch, 0), low, True)
    monkeypatch.setattr(reference_batched, "PART_BYTES", part_bytes if part_bytes > 1 else 2 * per_call + 100)
    verify = {"key": "b", "tolerances": task.tolerance_table()}
    assert W._verify_batch("cpu", verify)["failed_call"] == -1
    assert batch.ref_stacked and (W._stacked_outputs(batch, arena) is None) == bool(gap)
    assert batch.ref_stacked.part == (9 if part_bytes > 1 else 2)
    arena.view(batch.outputs[7][0])[1, 3] += 1.0
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == 7 and got["results"][0]["details"]["bad"] == 1, got["results"]
    arena.view(batch.outputs[7][0])[1, 3] -= 1.0
    arena.view(batch.outputs[8][0]).zero_()
    assert W._verify_batch("cpu", verify)["failed_call"] == 8, "the last call, alone in its part"


def test_a_stacked_run_that_fails_later_verifies_that_window_call_by_call(arena, monkeypatch):
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    _honest_outputs(arena, batch, task)
    verify = {"key": "b", "tolerances": task.tolerance_table()}
    assert W._verify_batch("cpu", verify)["failed_call"] == -1 and batch.ref_stacked

    def fails(*args):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(reference_batched.StackedReference, "run", fails)
    arena.view(batch.outputs[2][0]).zero_()
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == 2 and "stacked_failed" in got["steps"]


def test_a_verify_uses_the_stacked_reference_and_reads_the_record_from_its_last_part(arena, monkeypatch):
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    _honest_outputs(arena, batch, task)
    verify = {"key": "b", "tolerances": task.tolerance_table()}
    W._verify_batch("cpu", verify)
    runs = []
    run = reference_batched.StackedReference.run
    monkeypatch.setattr(reference_batched.StackedReference, "run", lambda self, *a, **kw: runs.append(a[1:]) or run(self, *a, **kw))
    monkeypatch.setattr(reference, "run_reference", lambda *a: pytest.fail("a call's reference run alone"))
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == -1 and got["max_abs_err"] < 1e-3 and runs == [(0, 8)]
    assert Shape.of({"T": 5, "H": 200}) == batch.shape


def test_a_verdicts_second_batch_at_a_shape_takes_the_first_ones_decision_and_still_finds_a_wrong_call(arena, monkeypatch):
    """A verdict times each shape by a long batch and a short one, on the same weights: the
    stacked reference is checked against eager on the first verified (three of its calls), and
    the second takes that decision, its part sized for its own calls. Its every call is still
    verified; another shape, or the next verdict, checks afresh."""
    task = load_task(str(TASKS / "tiny_norm"))
    verify = {"tolerances": task.tolerance_table()}
    long = _plan(task, list(range(1, 10)), {"T": 5, "H": 200})
    _honest_outputs(arena, long, task)
    prepared = []
    prepare = reference_batched.prepare
    monkeypatch.setattr(reference_batched, "prepare", lambda *a, **kw: prepared.append(len(a[2])) or prepare(*a, **kw))
    assert W._verify_batch("cpu", {"key": "b", **verify})["failed_call"] == -1 and prepared == [9]
    W._plan_batch("cpu", {"key": "short", "task_ref": task.ref, "shape": {"T": 5, "H": 200}, "dist": task.distributions[0],
                          "seeds": [21, 22, 23, 24], "init_seed": 3})
    short = W._STATE["batches"]["short"]
    _honest_outputs(arena, short, task)
    assert W._verify_batch("cpu", {"key": "short", **verify})["failed_call"] == -1
    assert prepared == [9], "the short batch checked the stacked reference again"
    assert short.ref_stacked.part == 4 and short.ref_stacked.model is long.ref_stacked.model
    arena.view(short.outputs[2][0])[0, 7] += 1.0
    assert W._verify_batch("cpu", {"key": "short", **verify})["failed_call"] == 2
    W._plan_batch("cpu", {"key": "other", "task_ref": task.ref, "shape": {"T": 3, "H": 200}, "dist": task.distributions[0],
                          "seeds": [31, 32, 33], "init_seed": 3})
    _honest_outputs(arena, W._STATE["batches"]["other"], task)
    assert W._verify_batch("cpu", {"key": "other", **verify})["failed_call"] == -1 and prepared == [9, 3]
    W._forget("cpu", {})
    assert "stacked" not in W._STATE, "the next verdict draws its own weights: nothing decided is kept"


def test_a_decision_is_not_reused_for_calls_whose_plain_values_differ():
    x = [torch.ones(2, 3), 1.0]
    found = reference_batched.StackedReference(None, None, [None, 1.0], [0], [], 4, per_call=100, device=torch.device("cpu"))
    stacked = [torch.ones(3, 2, 3)]
    assert reference_batched.reuse(found, stacked, [x, x, x]).part == 3
    assert reference_batched.reuse(found, stacked, [x, [x[0], 2.0], x]) is None
    assert reference_batched.reuse(found, stacked, [[x[0], 2.0]] * 3) is None
    assert reference_batched.reuse(found, stacked, [x]) is None, "one call gains nothing run stacked"
    compiled = reference_batched.StackedReference(None, None, [None, 1.0], [0], [], 4, compiled=True, per_call=100,
                                                  device=torch.device("cpu"))
    assert reference_batched.reuse(compiled, stacked, [x, x, x]) is None, "the compiled graph was checked at its own size"


IN_ITS_DTYPE = '''import torch
import torch.nn as nn

T = 4
H = 64


class Model(nn.Module):
    def forward(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * weight  # in the inputs' own dtype


def get_inputs():
    return [torch.randn(T, H), 1.0 + 0.1 * torch.randn(H)]


def get_init_inputs():
    return []
'''


def _norm_in_its_dtype(tmp_path: Path) -> object:
    return _tiny_norm_with(tmp_path, "norm_in_its_dtype", IN_ITS_DTYPE)


def _count_low_runs(monkeypatch) -> list[int]:
    runs: list[int] = []
    run_low = reference.run_low
    monkeypatch.setattr(reference, "run_low", lambda *a: runs.append(1) or run_low(*a))
    return runs


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "call by call"])
def test_a_reference_computing_in_float32_runs_only_its_high_answer_in_a_verification(arena, monkeypatch, stacked):
    """tiny_norm computes in float32 whatever its inputs: on the CPU its high answer (float64
    inputs) is float32 work widened, and its low answer that rounded, bit for bit. Its calls run
    together (vmap) or one at a time (the window's first call then runs both answers)."""
    task = load_task(str(TASKS / "tiny_norm"))
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    if not stacked:
        batch.ref_stacked = False
    _honest_outputs(arena, batch, task)
    verify = {"key": "b", "tolerances": task.tolerance_table()}
    assert W._verify_batch("cpu", verify)["failed_call"] == -1
    assert not stacked or batch.ref_stacked.low_dtypes == [torch.float32]
    runs = _count_low_runs(monkeypatch)
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == -1 and "derived_out" not in got["steps"]
    assert len(runs) == (0 if stacked else 1), "the low answer run beside the high one"
    arena.view(batch.outputs[3][0])[0, 5] += 1.0
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == 3 and "derived_out" in got["steps"] and got["results"][0]["details"]["bad"] == 1
    assert len(runs) > (0 if stacked else 2), "a call out: the window again, its low answers run"


def test_a_reference_computing_in_its_inputs_dtype_runs_both_answers(arena, tmp_path, monkeypatch):
    task = _norm_in_its_dtype(tmp_path)
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    _honest_outputs(arena, batch, task)
    assert W._verify_batch("cpu", {"key": "b", "tolerances": task.tolerance_table()})["failed_call"] == -1
    assert batch.ref_stacked and batch.ref_stacked.low_dtypes is None, "float32 work is not float64 work rounded"
    batch.ref_stacked = False
    runs = _count_low_runs(monkeypatch)
    assert W._verify_batch("cpu", {"key": "b", "tolerances": task.tolerance_table()})["failed_call"] == -1
    assert len(runs) == 9, "call by call: every call's low answer, and the last's again for the record"


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "call by call"])
def test_an_output_out_only_of_the_derived_allowance_is_judged_by_the_low_answer_itself(arena, tmp_path, monkeypatch, stacked):
    """With no tolerance but the low answer's distance, eager's own float32 answer (what an honest
    kernel could return) lies outside the allowance of the rounded high answer, the nearest float32
    value, at most elements: the low run then decides, and it passes; a wrong call still fails."""
    task = _norm_in_its_dtype(tmp_path)
    batch = _plan(task, list(range(1, 9)), {"T": 5, "H": 200})
    if not stacked:
        batch.ref_stacked = False
    _honest_outputs(arena, batch, task)
    monkeypatch.setattr(reference_batched, "rounded", lambda highs, lows: True)  # as if the first calls had shown it
    exact = {name: {"rtol": 0.0, "atol": 0.0} for name in task.tolerance_table()}
    verify = {"key": "b", "tolerances": exact}
    got = W._verify_batch("cpu", verify)
    assert got["failed_call"] == -1 and "derived_out" in got["steps"]
    assert not stacked or batch.ref_stacked.low_dtypes == [torch.float32]
    arena.view(batch.outputs[6][0])[2, 7] *= 1.001
    assert W._verify_batch("cpu", verify)["failed_call"] == 6


# ---- on a GPU ------------------------------------------------------------------------------------
def each_call_close(model: object, batch: W._Batch, task: object, start: int, highs: list, lows: list) -> None:
    """Every call of a part (from ``start``: its stacked answers ``highs``, ``lows``) as close to
    its own eager answers as the stacked reference's check asks."""
    for j in range(highs[0].shape[0]):
        k = start + j
        high, low = reference.run_reference(model, W._call_inputs(batch, k), task.mutated_inputs)
        tolerances = [W._tolerance(lo, task.tolerance_table()) for lo in low]
        assert reference_batched._close([h[j] for h in highs], high, tolerances), f"call {k} high"
        assert reference_batched._close([lo[j] for lo in lows], low, tolerances), f"call {k} low"


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILTIN)
def test_on_the_gpu_a_stacked_reference_is_close_to_eager_at_every_call(name):
    """bf16 and fp8 at the task's smallest public GPU shape, 24 calls (fewer for large ones): where
    the stacked reference is taken, every call's answers (not only the three checked) are as close
    to eager's as the check asks; an honest batch passes its verification either way."""
    task = load_task(name)
    with gpu_batch(task) as (made, batch, calls):
        shape = batch.shape
        stacked = _prepare(batch, task) if batch.stacked is not None else None
        derived = " (low answer derived)" if stacked and stacked.low_dtypes else ""
        print(f"{name} {shape.label}: {'stacked, part ' + str(stacked.part) + derived if stacked else 'call by call'}")
        if stacked is not None:
            model = W._model(task.ref, batch.shape, 3, "cuda")
            for start, count in stacked.parts(calls):
                highs, lows = stacked.run(batch.stacked, start, count)
                if derived:  # the high answer rounded has the low run's bits at every call, not only those checked
                    rounded = stacked.run(batch.stacked, start, count, exact=False)[1]
                    assert all(integrity.bits_equal(r, lo) for r, lo in zip(rounded, lows)), "a derived low answer"
                each_call_close(model, batch, task, start, highs, lows)
        _honest_outputs(made, batch, task)
        assert W._verify_batch("cuda", {"key": "b", "tolerances": task.tolerance_table()})["failed_call"] == -1


@pytest.mark.parametrize("free_gib, expected", [(None, reference_batched.PART_BYTES), (2, reference_batched.PART_BYTES),
                                                (16, 2 << 30), (100, reference_batched.PART_MOST_BYTES)],
                         ids=["the CPU", "a full GPU", "16 GiB free", "100 GiB free"])
def test_a_part_takes_a_share_of_the_free_memory_within_bounds(monkeypatch, free_gib, expected):
    """Parts of a few hundred MB left the large shapes' calls one to a part (run call by call): on a
    GPU with room a part takes an eighth of the free memory, never less than before nor more than 4 GiB."""
    if free_gib is None:
        assert reference_batched.part_bytes(torch.device("cpu")) == expected
        return
    monkeypatch.setattr(reference, "room", lambda device: free_gib << 30)
    assert reference_batched.part_bytes(torch.device("cuda", 0)) == expected
