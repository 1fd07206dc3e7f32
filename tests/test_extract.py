"""loop/extract.py: the candidate module out of a reply, or a clear reason why there is none."""

from __future__ import annotations

import ast

import pytest

from kernforge.loop.extract import extract_code, fenced_blocks

MODULE = '''"""Row-wise kernel, one program per row."""
import torch
import triton


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return launch(x)
'''

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def launch(x):
    _kernel[(1,)](x, x.numel(), BLOCK=128)
    return x
'''

USAGE = '''model = ModelNew().cuda()
print(model(torch.randn(4, 4, device="cuda")))
'''


def fence(code: str, lang: str = "python", ticks: str = "```") -> str:
    return f"{ticks}{lang}\n{code}{ticks}\n"


@pytest.mark.parametrize("lang", ["python", "py", "Python", "python3", ""])
def test_one_block_any_python_label(lang):
    result = extract_code(f"Plan: a row kernel.\n\n{fence(MODULE, lang)}")
    assert result.ok and result.kind == "ok" and result.code == MODULE
    assert result.summary == "Row-wise kernel, one program per row."


def test_tilde_fences_and_crlf():
    result = extract_code(fence(MODULE, ticks="~~~").replace("\n", "\r\n"))
    assert result.ok and "class ModelNew" in result.code and "\r" not in result.code


def test_last_module_wins_when_the_model_revises():
    first = MODULE.replace("Row-wise", "First draft,")
    result = extract_code(f"Draft:\n{fence(first)}\nBetter:\n{fence(MODULE)}")
    assert result.code == MODULE and "last of 2" in result.note


def test_kernel_block_is_joined_in_front_of_the_model_block():
    result = extract_code(f"Kernel:\n{fence(KERNEL)}\nModel:\n{fence(MODULE)}")
    assert result.ok and "joined after block(s) 1" in result.note
    tree = ast.parse(result.code)
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"_kernel", "launch", "ModelNew"} <= names
    assert result.code.index("def launch") < result.code.index("class ModelNew")


def test_unrelated_blocks_are_not_joined():
    shell = fence("pip install triton\n", "bash")
    helper = fence("def unrelated():\n    return 1\n")
    result = extract_code(f"{shell}{helper}{fence(MODULE)}{fence(USAGE)}")
    assert result.code == MODULE and "joined" not in result.note


def test_a_usage_example_after_the_module_is_left_out():
    result = extract_code(f"{fence(MODULE)}\nUse it like this:\n{fence(USAGE)}")
    assert result.code == MODULE


def test_cuda_source_block_beside_the_python_module():
    cuda = fence("__global__ void k(float* x) {}\n", "cpp")
    result = extract_code(f"{cuda}\n{fence(MODULE)}")
    assert result.code == MODULE


def test_only_non_python_blocks():
    result = extract_code(fence("__global__ void k(float* x) {}\n", "cuda"))
    assert not result.ok and result.kind == "no_code" and "none in Python" in result.note


def test_no_fence_whole_reply_is_a_module():
    result = extract_code(MODULE)
    assert result.code == MODULE and "no code fence" in result.note


def test_no_fence_prose_then_module():
    result = extract_code("Here is my answer.\n\n" + MODULE)
    assert result.code == MODULE


def test_no_fence_markdown_heading_then_module():
    result = extract_code("# Plan\nOne row per program.\n\n" + MODULE)
    assert result.code == MODULE


def test_no_fence_and_no_module():
    result = extract_code("I would use a persistent kernel with 2 rows per program.")
    assert not result.ok and result.kind == "no_code" and "no class ModelNew" in result.note


def test_no_fence_model_new_inside_prose():
    result = extract_code("You could write class ModelNew that calls the kernel, then tune it.\nclass ModelNew is simple.")
    assert not result.ok and "not a Python module" in result.note


def test_blocks_without_model_new():
    result = extract_code(fence(KERNEL))
    assert not result.ok and result.kind == "no_model_new" and "ModelNew" in result.note


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_reply(text):
    result = extract_code(text)
    assert not result.ok and result.kind == "no_code" and "no content" in result.note


def test_truncated_inside_the_module_gives_no_code():
    cut = "Plan.\n```python\n" + MODULE[: len(MODULE) // 2]
    result = extract_code(cut, truncated=True)
    assert not result.ok and result.kind == "truncated" and "cut off" in result.note


def test_truncated_at_a_line_boundary_is_still_refused():
    # The cut module parses, but it is not the model's finished answer.
    cut = "```python\n" + MODULE
    assert extract_code(cut, truncated=True).code is None
    assert extract_code(cut, truncated=False).code == MODULE  # a forgotten closing fence is fine


def test_truncated_after_a_complete_module():
    text = fence(MODULE) + "\nNow some notes on tuning:\n```python\n# BLOCK = 10"
    result = extract_code(text, truncated=True)
    assert result.code == MODULE


def test_truncated_with_no_fence():
    result = extract_code(MODULE, truncated=True)
    assert not result.ok and result.kind == "truncated" and "token limit" in result.note


def test_truncated_before_any_model_block():
    result = extract_code(fence(KERNEL) + "```python\nimport torch\n", truncated=True)
    assert not result.ok and result.kind == "truncated"


def test_syntax_error_is_kept_for_the_verifier_with_the_line():
    broken = MODULE.replace("def forward(self, x):", "def forward(self, x)")
    result = extract_code(fence(broken))
    assert result.code == broken and result.kind == "syntax_error" and "line 7" in result.note


def test_a_parsing_block_is_preferred_to_a_broken_one():
    broken = MODULE.replace("def forward(self, x):", "def forward(self, x)")
    result = extract_code(fence(MODULE) + fence(broken))
    assert result.code == MODULE and result.kind == "ok"


def test_longer_fence_holds_inner_backticks():
    module = MODULE.replace('"""Row-wise kernel, one program per row."""', '"""Row kernel.\n\n```\nexample\n```\n"""')
    result = extract_code(fence(module, ticks="````"))
    assert result.code == module


def test_fenced_blocks_reports_open_fence():
    blocks = fenced_blocks("a\n```python\nx = 1\n```\n```py\ny = 2\n")
    assert [(b.lang, b.closed) for b in blocks] == [("python", True), ("py", False)]
