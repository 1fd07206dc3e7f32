"""The names of the kernels a candidate defines, so the trace can tell its kernels from torch's."""

from __future__ import annotations

import ast
import re

_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?[\w:<>\s]*?\b(\w+)\s*\(")


def own_kernel_names(source: str) -> list[str]:
    """Triton kernels (functions under a decorator whose name contains ``jit``, possibly below
    ``autotune``/``heuristics``) and CUDA ``__global__`` functions in string literals."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # the import then says what is wrong
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any("jit" in _decorator(d) for d in node.decorator_list):
            names.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
            names.extend(_GLOBAL.findall(node.value))
    return sorted(set(names))


def _decorator(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except (RecursionError, MemoryError):
        return ""
