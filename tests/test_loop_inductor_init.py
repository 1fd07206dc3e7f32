"""ModelNew's construction for an Inductor start (loop/inductor_init.py): the reference's own
methods but forward, or a reason a person can read why they cannot be copied."""

from __future__ import annotations

import pytest
import torch

from kernforge.loop.inductor_init import NoInit, model_methods

_HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _reference(init: str, extra: str = "") -> str:
    return (_HEAD + extra + "class Model(nn.Module):\n    \"\"\"doc\"\"\"\n" + init
            + "\n    def forward(self, x):\n        return helper(x)\n")


def test_methods_are_the_references_with_a_plain_super():
    methods = model_methods(_reference(
        "    def __init__(self, n, eps=1e-5):\n"
        "        super(Model, self).__init__()\n"
        "        self.norm = nn.LayerNorm(n, eps=eps)\n"
        "        self.scale = nn.Parameter(torch.randn(n) * F.gelu(torch.ones(1)))\n"
        "        self._reset()\n\n"
        "    def _reset(self):\n"
        "        self.register_buffer('count', torch.zeros(()))\n"))
    assert "super().__init__()" in methods.source and "super(Model" not in methods.source
    assert "def _reset(self):" in methods.source  # a helper method __init__ calls comes along
    assert "def forward" not in methods.source  # forward reads a helper ModelNew never runs
    assert methods.imports == ("import torch", "import torch.nn as nn", "import torch.nn.functional as F")


def test_copied_init_draws_the_same_weights_under_the_same_seed():
    source = _reference("    def __init__(self, i, o):\n        super(Model, self).__init__()\n"
                        "        self.lin = nn.Linear(i, o)\n        self.bias = nn.Parameter(torch.randn(o))\n")
    space: dict = {}
    exec(compile(source.replace("return helper(x)", "return x"), "reference", "exec"), space)
    exec(compile(_HEAD + "class ModelNew(nn.Module):\n" + "\n".join(
        "    " + line for line in model_methods(source).source.splitlines()), "candidate", "exec"), space)
    torch.manual_seed(3)
    ref = space["Model"](5, 7)
    torch.manual_seed(3)
    new = space["ModelNew"](5, 7)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in new.named_parameters()]
    for (name, a), (_, b) in zip(ref.named_parameters(), new.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("init,extra,said", [
    ("        self.lin = make(n)\n", "def make(n):\n    return nn.Linear(n, n)\n\n", "`make`"),
    ("        self.lin = nn.Linear(n, WIDTH)\n", "WIDTH = 8\n\n", "`WIDTH`"),
    ("        self.lin = np.zeros(n)\n", "import numpy as np\n\n", "`np`"),
])
def test_a_name_of_the_problem_file_is_refused_by_name(init, extra, said):
    source = _reference("    def __init__(self, n):\n        super(Model, self).__init__()\n" + init, extra)
    with pytest.raises(NoInit, match=said) as caught:
        model_methods(source)
    assert "Model.__init__" in str(caught.value) and "would not have" in str(caught.value)


def test_a_model_that_is_not_a_plain_module_is_refused():
    source = _HEAD + "class Base(nn.Module):\n    pass\n\nclass Model(Base):\n    def __init__(self):\n        super().__init__()\n"
    with pytest.raises(NoInit, match="not nn.Module alone"):
        model_methods(source)
