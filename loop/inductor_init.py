"""``ModelNew``'s construction for an Inductor start: the reference's own ``__init__``, copied.

The judge seeds the RNG identically before it builds ``Model(*init_inputs)`` and
``ModelNew(*init_inputs)`` (``tasks/runtime.build_model``), so a candidate whose forward reads
weights must draw them itself, the same ones in the same order: the reference's ``__init__``
does exactly that, so it is taken as it is written. Submodules (``nn.Linear``, ``nn.LayerNorm``)
are created as the reference creates them, so ``named_parameters()`` and ``named_buffers()`` give
the same names in the same order, and the wrapper's weight arguments are found by those names.

``model_methods(reference_source)`` returns the class body of ``ModelNew`` less its ``forward``:
every method of the reference's ``Model`` but ``forward`` (an ``__init__`` may call a helper
method of its own), with ``super(Model, self)`` as ``super()``, and the imports those methods
need. It refuses (``NoInit``, with the name) a method that reads a name the candidate would not
have: a module-level helper or constant of the problem file other than ``torch``, ``nn``, ``F``
and ``math``. Copying a module-level value is not safe in general: KernelBench sets its size
globals per shape (``tasks/runtime.set_globals``), and a copy would keep the default's.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

#: module-level names a copied method may read, and the import that gives each in the candidate
IMPORTS = {"torch": "import torch", "nn": "import torch.nn as nn",
           "F": "import torch.nn.functional as F", "math": "import math"}
#: the module each of those names must be bound to in the problem file (else it is something else)
MODULES = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "math": "math"}


class NoInit(ValueError):
    """The reference's ``Model`` cannot be rebuilt as ``ModelNew``; the message says why."""


@dataclass(frozen=True)
class Methods:
    """``ModelNew``'s methods but ``forward``, as source, and the imports they need."""

    source: str
    imports: tuple[str, ...]


def model_methods(reference_source: str) -> Methods:
    """The reference ``Model``'s methods but ``forward``, rewritten for ``ModelNew`` (see the
    module docstring); raises ``NoInit`` where they read a name the candidate lacks."""
    tree = ast.parse(reference_source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        raise NoInit("the reference defines no class Model at module level")
    bases = [ast.unparse(b) for b in model.bases]
    if bases not in (["nn.Module"], ["torch.nn.Module"]) or model.keywords:
        raise NoInit(f"Model derives from {', '.join(bases) or 'nothing'}, not nn.Module alone")
    methods = [n for n in model.body if isinstance(n, ast.FunctionDef) and n.name != "forward"]
    others = [n for n in model.body if not isinstance(n, ast.FunctionDef) and not _docstring(n)]
    if others:
        raise NoInit(f"Model's class body holds `{ast.unparse(others[0])[:80]}`, not only methods")
    if not any(m.name == "__init__" for m in methods):
        raise NoInit("Model has no __init__ to draw its weights from")
    bound = _module_bindings(tree)
    used: set[str] = set()
    for method in methods:
        _SuperCall().visit(method)
        for name in sorted(_free_names(method)):
            if name in IMPORTS and bound.get(name) == MODULES[name]:
                used.add(name)
            elif name == "Model":
                raise NoInit(f"Model.{method.name} names the class Model itself, which the candidate does not define")
            else:
                raise NoInit(f"Model.{method.name} reads `{name}`, a name of the problem file the candidate "
                             "would not have (only torch, nn, F and math are imported there)")
    source = "\n\n".join(ast.unparse(m) for m in methods)
    return Methods(source, tuple(IMPORTS[n] for n in IMPORTS if n in used))


def _docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _module_bindings(tree: ast.Module) -> dict[str, str]:
    """Module-level import bindings of the problem file: name -> the module it is bound to."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


class _SuperCall(ast.NodeTransformer):
    """``super(Model, self)`` as ``super()``: ModelNew is not a Model."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "super" and len(node.args) == 2
                and ast.unparse(node.args[0]) == "Model" and not node.keywords):
            return ast.Call(func=node.func, args=[], keywords=[])
        return node


def _free_names(fn: ast.FunctionDef) -> set[str]:
    """Names ``fn`` reads that are neither its arguments, its own locals nor builtins."""
    args = fn.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
        elif isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node is not fn:
            local.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local |= {(a.asname or a.name).split(".")[0] for a in node.names}
    loads = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return {n for n in loads - local if not hasattr(builtins, n)}
