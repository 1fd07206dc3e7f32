"""Hidden shapes for plain KernelBench files: every size varied, no operator setting, never bigger
than the public shape, the same every time. The fixtures in tests/tasks/kernelbench/ are
unchanged copies of KernelBench problems (MIT licence)."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from kernforge.tasks import runtime, shapes
from kernforge.tasks.loader import candidate_bundle, load_task, unbundle
from kernforge.tasks.spec import Shape

KB = Path(__file__).resolve().parent / "tasks" / "kernelbench"
#: problems the GPU benchmark already holds verbatim (bench/kernelbench/problems) are read there
BENCH = Path(__file__).resolve().parents[1] / "bench" / "kernelbench" / "problems" / "level1"
ELSEWHERE = {"matmul.py": BENCH / "2_Standard_matrix_multiplication_.py", "rms_norm.py": BENCH / "36_RMSNorm_.py"}


def kb(name: str) -> Path:
    """A bare KernelBench file (no side meta) by its short name."""
    return ELSEWHERE.get(name, KB / name)

# file: (sizes every one of which some hidden shape varies, settings no hidden shape varies)
CASES = {
    "matmul.py": ({"M", "K", "N"}, set()),
    "conv1d_dilated_strided.py": ({"batch_size", "in_channels", "out_channels", "length"},
                                  {"kernel_size", "stride", "dilation"}),
    "rms_norm.py": ({"batch_size", "features", "dim1", "dim2"}, set()),
    # block_len must divide seq_length; n_heads is a size here (the input is (b, l, h, p))
    "mamba2.py": ({"batch_size", "seq_length", "n_heads", "d_head", "d_state"}, {"block_len"}),
    # num_heads must divide embed_dim, and the input's channels must equal embed_dim: the two
    # only vary together
    "vision_attention.py": ({"batch_size", "embed_dim", "num_channels", "image_height", "image_width"},
                            {"num_heads"}),
}


def plan_of(name: str) -> shapes.Plan:
    return shapes.plan(kb(name), load_task(kb(name)).public_shapes)


def plan_of_path(path: Path) -> shapes.Plan:
    return shapes.plan(path)


def fresh_plan(name: str) -> shapes.Plan:
    """Planned from scratch, bypassing the per-process memo."""
    module = runtime.load_module(kb(name), fresh=True)
    return shapes._Planner(module, shapes.int_globals(module)).run()


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def meta_bytes(path: Path, shape: Shape) -> int:
    """Build and run the file at ``shape`` on meta, plainly (no probe machinery); its bytes."""
    module = runtime.load_module(path, fresh=True)
    runtime.set_shape(module, shape)
    with warnings.catch_warnings(), torch.no_grad(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
        outputs = _tensors(model(*inputs))
    assert outputs, f"{path.name} at {shape}: the forward returned no tensor"
    state = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in [*_tensors(inputs), *outputs, *state])


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_size_is_varied_and_no_setting(name):
    sizes, settings = CASES[name]
    plan = plan_of(name)
    assert plan.fallback is None
    assert set(plan.varied) == sizes
    default = plan.default.as_dict()
    for shape in plan.shapes:
        changed = {k for k, v in shape.params if v != default[k]}
        assert not changed & settings, f"{shape} varies the operator setting(s) {changed & settings}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_hidden_shapes_run_on_meta_and_never_outgrow_the_default(name):
    task = load_task(kb(name))
    limit = meta_bytes(kb(name), task.public_shapes[0])
    assert 1 <= len(task.hidden_shapes) <= shapes.MAX_HIDDEN
    assert len(set(task.hidden_shapes)) == len(task.hidden_shapes)
    assert not set(task.hidden_shapes) & set(task.public_shapes)
    for shape in task.hidden_shapes:
        assert all(isinstance(v, int) and v > 0 for _, v in shape.params)
        assert meta_bytes(kb(name), shape) <= limit, f"{shape} moves more bytes than the public shape"


@pytest.mark.parametrize("name", sorted(CASES))
def test_deterministic(name):
    first, second = fresh_plan(name), fresh_plan(name)
    assert first.shapes == second.shapes == load_task(kb(name)).hidden_shapes
    assert first.probes == second.probes and first.ops == second.ops


def test_probing_leaves_the_shared_module_alone():
    task = load_task(kb("mamba2.py"))
    module = runtime.reference_module(task)
    assert shapes.int_globals(module) == task.public_shapes[0].as_dict()


def test_a_module_left_at_another_shape_is_not_probed_again(monkeypatch):
    """The reference worker sets a shape on the shared module, then loads the task again: the
    plan is kept by the file's content, not by the globals it finds."""
    task = load_task(kb("matmul.py"))
    module = runtime.reference_module(task)
    runtime.set_shape(module, task.hidden_shapes[0])
    monkeypatch.setattr(shapes, "_Planner", lambda *a: pytest.fail("probed again"))
    try:
        assert set(load_task(kb("matmul.py")).hidden_shapes) <= set(task.hidden_shapes)
    finally:
        runtime.set_shape(module, task.public_shapes[0])


def test_every_size_gets_its_first_value_before_any_retry(monkeypatch):
    """Mamba2's seq_length needs five values before one divides by block_len; n_heads comes later
    in the file and must not starve while seq_length retries."""
    monkeypatch.setattr(shapes, "MAX_FORWARDS", 8)  # the default, all at once, one per size, one more
    plan = fresh_plan("mamba2.py")
    assert plan.probes <= shapes.MAX_BUILDS + 8
    assert {"batch_size", "n_heads", "d_head", "d_state"} <= set(plan.varied)


def test_budget_bounds_the_probes(monkeypatch):
    monkeypatch.setattr(shapes, "MAX_FORWARDS", 2)
    plan = fresh_plan("rms_norm.py")
    assert plan.fallback is None and plan.shapes
    assert plan.probes <= shapes.MAX_BUILDS + 2


@pytest.mark.parametrize("n", [2, 3, 4, 5, 16, 64, 100, 1000, 1024, 2048, 16384])
def test_values_tried_are_smaller_odd_first(n):
    tries = shapes._tries(n)
    values = [v for _, v in tries]
    assert values and all(0 < v < n for v in values) and len(set(values)) == len(values)
    slot, first = tries[0]
    assert slot == "odd"
    if n >= 5:
        assert first % 2 == 1 and first > 1  # odd, so never a power of two
    assert ("small", 1) in tries or values[0] == 1


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


FALLBACKS = {
    # data-dependent: meta has no values
    "item": ("return x * x.sum().item()", "torch.randn(batch_size, dim)", ".item() cannot be called on meta"),
    # an unrolled recurrence: thousands of aten calls, seconds on meta
    "unrolled": ("return sum(torch.tanh(x[:, t % 4]) for t in range(2000))", "torch.randn(batch_size, dim)",
                 "too long to probe on meta"),
    # every probe would allocate the default's inputs for real
    "real device": ("return x", "torch.randn(batch_size, dim, device='cpu')", "puts tensors on cpu"),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_a_file_that_cannot_be_probed_varies_only_the_batch(tmp_path, case):
    forward, draw, reason = FALLBACKS[case]
    path = write(tmp_path / "fallback.py", f"""
        import torch
        import torch.nn as nn

        batch_size = 16
        dim = 64

        class Model(nn.Module):
            def forward(self, x):
                {forward}

        def get_inputs():
            return [{draw}]

        def get_init_inputs():
            return []
        """)
    plan = plan_of_path(path)
    assert plan.fallback and reason in plan.fallback
    assert load_task(path).hidden_shapes == plan.shapes == shapes.batch_only({"batch_size": 16, "dim": 64})


def test_globals_computed_from_sizes_follow_them(tmp_path):
    """``input_shape = (dim,)`` and ``bias_shape = (out_features,)`` (31 KernelBench files) are
    computed at import from a size: a hidden shape that changes the size runs those lines again,
    so the inputs and weights follow it. (Left at the default's value, a hidden shape of
    76_Gemm_Add_ReLU with out_features=1 broadcast a (8192,) bias into a (769, 8192) reference
    output, and an honest kernel was judged incorrect on the H200.)"""
    path = write(tmp_path / "tuple_shape.py", """
        import torch
        import torch.nn as nn

        batch_size = 32
        dim = 100
        input_shape = (dim,)
        bias_shape = input_shape + (1,)

        class Model(nn.Module):
            def __init__(self, bias_shape):
                super().__init__()
                self.bias = nn.Parameter(torch.zeros(bias_shape[0]))

            def forward(self, x):
                return torch.cumsum(x, dim=1) + self.bias

        def get_inputs():
            return [torch.randn(batch_size, *input_shape)]

        def get_init_inputs():
            return [bias_shape]
        """)
    found = plan_of_path(path)
    assert set(found.varied) == {"batch_size", "dim"}
    task = load_task(path)
    for shape in task.hidden_shapes:
        dim = shape.as_dict()["dim"]
        (x,) = runtime.make_inputs(task, shape, "default", 0, "cpu")
        assert x.shape[1] == dim
        assert runtime.make_init_inputs(task, shape) == [(dim, 1)]
    assert runtime.make_inputs(task, Shape.of({"batch_size": 32, "dim": 100}), "default", 0, "cpu")[0].shape == (32, 100)


def test_interpreter_shapes_stay_batch_only():
    task = load_task(kb("rms_norm.py"))
    assert task.cpu_public_shapes == task.public_shapes
    assert task.cpu_hidden_shapes == shapes.batch_only(task.public_shapes[0].as_dict())


def test_a_plain_file_knows_what_one_call_moves_at_its_own_sizes_and_one_with_cpu_shapes_needs_not(tmp_path):
    """The CPU interpreter judges a plain KernelBench file at its own sizes: what one call moves
    there (inputs, the output, weights), measured on meta, lets the judge refuse it up front."""
    relu = BENCH / "19_ReLU.py"
    assert load_task(relu).cpu_call_bytes == 2 * 4096 * 393216 * 4  # the input and the output, float32
    matmul = load_task(ELSEWHERE["matmul.py"]).cpu_call_bytes
    assert matmul == 4 * 4 * (1024 * 4096 + 4096 * 2048 + 1024 * 2048)  # 2M x 2K, 2K x 2N in; 2M x 2N out
    write(tmp_path / "19_ReLU.py", relu.read_text())
    write(tmp_path / "19_ReLU.meta.py", "CPU_PUBLIC_SHAPES = [{'batch_size': 4, 'dim': 300}]\n")
    assert load_task(tmp_path / "19_ReLU.py").cpu_call_bytes is None  # CPU shapes of its own


def test_meta_hidden_shapes_are_not_probed(tmp_path, monkeypatch):
    write(tmp_path / "matmul.py", kb("matmul.py").read_text())
    write(tmp_path / "matmul.meta.py", "HIDDEN_SHAPES = [{'M': 3}]\n")
    monkeypatch.setattr(shapes, "plan", lambda *a, **k: pytest.fail("probed a task with HIDDEN_SHAPES"))
    task = load_task(tmp_path / "matmul.py")
    assert [s.as_dict()["M"] for s in task.hidden_shapes] == [3] == [s.as_dict()["M"] for s in task.cpu_hidden_shapes]


def test_unbundled_task_is_not_probed(tmp_path, monkeypatch):
    """A bundle is unpacked in the candidate's own process: no hidden shapes are worked out there,
    not even the batch-only ones."""
    data = candidate_bundle(load_task(kb("matmul.py")))
    monkeypatch.setattr(shapes, "plan", lambda *a, **k: pytest.fail("probed in the candidate's process"))
    task = unbundle(data, tmp_path, derive_hidden=False)
    assert task.hidden_shapes == () == task.cpu_hidden_shapes
