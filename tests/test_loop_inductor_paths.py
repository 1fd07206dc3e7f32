"""The Inductor start's two paths (loop/inductor_paths.py): the static kernels' names, and the guard
that sends a call to the static path by its inputs' sizes alone."""

from __future__ import annotations

import pytest
import torch

from kernforge.loop.inductor_paths import NotStatic, guard, renamed

_WRAPPER = '''
triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', """
@triton.jit
def triton_poi_fused_0(in_ptr0, xnumel, XBLOCK: tl.constexpr):
    pass
""")
triton_poi_fused_0_1 = async_compile.triton('triton_poi_fused_0_1', """
@triton.jit
def triton_poi_fused_0_1(in_ptr0, xnumel, XBLOCK: tl.constexpr):
    pass
""")

def call(args):
    arg0_1, = args
    triton_poi_fused_0.run(arg0_1, 8)
    triton_poi_fused_0_1.run(arg0_1, 8)
    return (arg0_1, )
'''


def test_renamed_prefixes_each_kernel_where_defined_and_launched_and_nothing_else():
    text = renamed(_WRAPPER)
    for name in ("triton_poi_fused_0", "triton_poi_fused_0_1"):
        assert f"static_{name} = async_compile.triton('static_{name}'" in text
        assert f"def static_{name}(" in text and f"static_{name}.run(arg0_1, 8)" in text
    assert "static_static_" not in text and "arg0_1, = args" in text


def _at_static_sizes(signature):
    scope = {"torch": torch}
    exec(guard(signature), scope)
    return scope["_at_static_sizes"]


@pytest.mark.parametrize("other, static", [
    (torch.zeros(2, 3), True),
    (torch.ones(2, 3) * float("nan"), True),  # values never count
    (torch.zeros(3, 2), False),
    (torch.zeros(3, 2).t(), False),  # the same sizes, other strides
    (torch.zeros(2, 3, dtype=torch.float16), False),
])
def test_guard_compares_sizes_strides_and_dtype_never_values(other, static):
    check = _at_static_sizes([("tensor", (2, 3), (3, 1), "torch.float32"), ("value", "4")])
    assert check((other, 4)) is static
    assert check((torch.zeros(2, 3), 5)) is False
    assert check((torch.zeros(2, 3), 4.0)) is False  # Dynamo made the int a constant of its type
    assert check((torch.zeros(2, 3), True)) is False


def test_guard_refuses_an_input_it_cannot_compare_with_a_literal():
    with pytest.raises(NotStatic, match="input 1"):
        guard([("tensor", (2,), (1,), "torch.float32"), ("value", "<object at 0x7f>")])
