"""The task loader: built-in names, KernelBench files and folders, and clear errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernforge.tasks import runtime
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import builtin_names, load_task, load_tasks

KB_RELU = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    batch_size = 16
    dim = 1024

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return []
    """
)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_builtin_rms_norm_loads():
    task = load_task("rms_norm")
    assert task.ref == "builtin:rms_norm"
    assert task.dtype("cuda") == "bfloat16" and task.dtype("cpu") == "float32"
    assert task.hidden_shapes and not set(task.hidden_shapes) & set(task.public_shapes)
    assert "HIDDEN" not in task.reference_source


def test_kernelbench_file_defaults(tmp_path):
    task = load_task(write(tmp_path / "19_ReLU.py", KB_RELU))
    assert task.name == "19_ReLU"
    assert task.public_shapes[0].as_dict() == {"batch_size": 16, "dim": 1024}
    # hidden shapes vary every size (tests/test_tasks_shapes.py); the interpreter's vary the
    # batch: 1, an odd size, and a smaller one
    default = task.public_shapes[0].as_dict()
    assert {k for s in task.hidden_shapes for k, v in s.params if v != default[k]} == {"batch_size", "dim"}
    assert sorted(s.as_dict()["batch_size"] for s in task.cpu_hidden_shapes) == [1, 7, 17]
    assert task.distributions == ("default",)


def test_kernelbench_inputs_follow_shape_and_seed(tmp_path):
    task = load_task(write(tmp_path / "relu.py", KB_RELU))
    shape = task.hidden_shapes[0]
    a = runtime.make_inputs(task, shape, "default", 7, "cpu")
    b = runtime.make_inputs(task, shape, "default", 7, "cpu")
    c = runtime.make_inputs(task, shape, "default", 8, "cpu")
    assert a[0].shape == (1, 1024)
    assert a[0].equal(b[0]) and not a[0].equal(c[0])


def test_folder_with_a_broken_file_reports_it(tmp_path):
    write(tmp_path / "good.py", KB_RELU)
    write(tmp_path / "no_model.py", "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n")
    write(tmp_path / "syntax.py", "def broken(:\n")
    tasks, errors = load_tasks(tmp_path)
    assert [t.name for t in tasks] == ["good"]
    messages = sorted(str(e) for e in errors)
    assert any("no_model.py" in m and "`Model`" in m for m in messages)
    assert any("syntax.py:1" in m and "syntax error" in m for m in messages)


def test_meta_typo_is_an_error(tmp_path):
    write(tmp_path / "relu.py", KB_RELU)
    write(tmp_path / "relu.meta.py", "HIDEN_SHAPES = [{'batch_size': 3}]\n")
    with pytest.raises(TaskError, match=r"relu.meta.py: unknown metadata HIDEN_SHAPES"):
        load_task(tmp_path / "relu.py")


@pytest.mark.parametrize(
    "meta, message",
    [
        ("PUBLIC_SHAPES = [{'width': 3}]", "not integer globals"),
        ("PUBLIC_SHAPES = [{'dim': -1}]", "non-integer or negative"),
        ("PUBLIC_SHAPES = {}", "non-empty list"),
        ("TOLERANCES = {'float32': 3}", "must be \\(atol, rtol\\)"),
        ("DISTRIBUTIONS = ('normal',)", "need a make_inputs"),
        ("roofline = 3", "must be a function"),
        ("raise RuntimeError('boom')", "importing it failed: RuntimeError: boom"),
    ],
)
def test_bad_meta_is_named(tmp_path, meta, message):
    write(tmp_path / "relu.py", KB_RELU)
    write(tmp_path / "relu.meta.py", meta + "\n")
    with pytest.raises(TaskError, match=message):
        load_task(tmp_path / "relu.py")


def test_a_setting_whose_own_value_is_negative_may_be_named_in_a_shape(tmp_path):
    """53_Gemm_Scaling_Hardtanh_GELU's hardtanh_min is -2: a CPU shape that names it (at -2, or
    -3) is a shape; a negative size is still refused."""
    source = (Path(__file__).resolve().parents[1] / "bench" / "kernelbench" / "problems" / "level2"
              / "53_Gemm_Scaling_Hardtanh_GELU.py").read_text()
    write(tmp_path / "gemm.py", source)
    write(tmp_path / "gemm.meta.py", "CPU_PUBLIC_SHAPES = [{'batch_size': 8, 'in_features': 40, 'out_features': 33, "
                                     "'hardtanh_min': -3, 'hardtanh_max': 2}]\n")
    assert load_task(tmp_path / "gemm.py").cpu_public_shapes[0].as_dict()["hardtanh_min"] == -3
    write(tmp_path / "gemm.meta.py", "CPU_PUBLIC_SHAPES = [{'batch_size': -8}]\n")
    with pytest.raises(TaskError, match=r"non-integer or negative sizes for \['batch_size'\]"):
        load_task(tmp_path / "gemm.py")


def test_unknown_name_lists_builtins():
    with pytest.raises(TaskError, match="no such built-in task or path"):
        load_task("no_such_task")


def test_builtin_names_include_rms_norm():
    assert "rms_norm" in builtin_names()
