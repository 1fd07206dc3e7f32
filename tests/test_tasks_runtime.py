"""Inputs of a task without distributions are drawn by its own ``get_inputs``, on the device the
call runs on (a KernelBench call of several GB drawn on the CPU took seconds)."""

from __future__ import annotations

import torch

from kernforge.tasks import runtime


def test_get_inputs_draws_on_the_device_given():
    """The meta device stands in for a GPU here: factory calls land where the context says."""
    drawn = runtime._drawn_on("meta", 0, lambda: [torch.rand(4, 5), 3])
    assert drawn is not None and drawn[0].device.type == "meta" and drawn[1] == 3


def test_an_explicit_cpu_tensor_stays_where_it_was_asked_for():
    drawn = runtime._drawn_on("meta", 0, lambda: [torch.rand(2, device="cpu")])
    assert drawn is not None and drawn[0].device.type == "cpu"


def test_inputs_that_cannot_be_drawn_there_fall_back():
    def numpy_inputs():
        return [torch.from_numpy(torch.rand(3).numpy())]

    assert runtime._drawn_on("meta", 0, numpy_inputs) is None


def test_the_same_seed_draws_the_same_inputs():
    def get():
        return [torch.rand(6)]

    a = runtime._drawn_on("cpu", 7, get)
    b = runtime._drawn_on("cpu", 7, get)
    c = runtime._drawn_on("cpu", 8, get)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


class _Linear(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n))


class _HostOnlyInit(torch.nn.Module):
    """An ``__init__`` that needs its tensors on the host (``.numpy()``)."""

    def __init__(self, n):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(torch.arange(n).numpy() * 2.0))


def test_a_model_is_built_on_the_device_where_its_init_can_run_there():
    """Weights are drawn with the device as the default (a 4 GiB linear drawn on the host took
    seconds per shape); an ``__init__`` that cannot run that way is built on the host instead,
    the same way on both sides of a verdict. The meta device stands in for the GPU here."""
    on_device = runtime._built_on("meta", 5, _Linear, [4])
    assert on_device is not None and on_device.weight.device.type == "meta"
    assert runtime._built_on("meta", 5, _HostOnlyInit, [4]) is None


def test_loading_a_task_file_writes_no_bytecode_beside_it(tmp_path, monkeypatch):
    """A metadata file's bytecode holds its hidden shapes; the sandbox hides the file by name, so
    the judge's own loading must leave no copy of it in a ``__pycache__`` beside it."""
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    meta = tmp_path / "meta.py"
    meta.write_text("from __future__ import annotations\nHIDDEN_SHAPES = [{'T': 3, 'H': 96}]\n")
    module = runtime.load_module(meta, fresh=True)
    assert module.HIDDEN_SHAPES == [{"T": 3, "H": 96}]
    assert not (tmp_path / "__pycache__").exists()
