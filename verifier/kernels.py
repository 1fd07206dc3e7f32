"""The names of the kernels a candidate defines, so the trace can tell its kernels from torch's."""

from __future__ import annotations

import ast
import re
from typing import Sequence

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


#: what defines an op by its qualified name (``"ns::name"`` or a schema): ``torch.library``'s own
_DEFINERS = frozenset({"custom_op", "triton_op", "define"})
#: namespaces that are torch's own: an op there is never the candidate's
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "higher_order", "_", ""})


def own_op_names(source: str) -> list[str]:
    """The custom ops the module itself defines, as ``"namespace::name"``: through
    ``torch.library.custom_op``/``triton_op``/``define``, or a ``torch.library.Library(ns, "DEF" or
    "FRAGMENT")`` and its ``define``. An honest kernel may name its op after vLLM's
    (``vllm::silu_and_mul``): it is the candidate's whatever its namespace, and the ops its body
    runs are judged one by one.

    Only what surely runs and surely is ``torch.library``'s counts (red team: a ``define`` of its
    own, under ``if False``, "defined" aten's ops, which then passed as the candidate's): a
    statement of the module's top level (or a decorator there), a callee reached through
    ``torch.library`` as imported by the module, and never a torch namespace. Defining an op that
    exists already (another library's) fails the import."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return own_ops_of(tree)


def own_ops_of(tree: ast.Module) -> list[str]:
    """``own_op_names`` of a module already parsed (the static screen's tree)."""
    library = _library_names(tree)
    calls: list[ast.Call] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Expr, ast.Assign)) and isinstance(stmt.value, ast.Call):
            calls.append(stmt.value)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            calls += [d for d in stmt.decorator_list if isinstance(d, ast.Call)]
    libraries: dict[str, str] = {}  # a top-level name holding a Library -> its namespace
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and library(stmt.value.func) == "Library":
            args = [a.value for a in stmt.value.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(args) == 2 and args[1] in ("DEF", "FRAGMENT"):
                libraries.update({t.id: args[0] for t in stmt.targets if isinstance(t, ast.Name)})
    found: set[str] = set()
    for call in calls:
        if not (call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            continue
        text = call.args[0].value
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in libraries \
                and func.attr == "define":
            found.add(f"{libraries[func.value.id]}::{_op_name(text)}")
        elif library(func) in _DEFINERS and "::" in text:
            namespace, _, rest = text.partition("::")
            found.add(f"{namespace.strip()}::{_op_name(rest)}")
    return sorted(op for op in found if op.split("::", 1)[0] not in _TORCH_NAMESPACES)


def _library_names(tree: ast.Module):
    """A function telling which ``torch.library`` name a callee is ("" for none), by the module's
    own top-level imports (``import torch``, ``from torch import library``, ``from torch.library
    import custom_op``, with any ``as``)."""
    modules: dict[str, tuple[str, ...]] = {}  # a name -> the module path it holds
    direct: dict[str, str] = {}  # a name -> the torch.library member it holds
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.name in ("torch", "torch.library"):
                    modules[a.asname or "torch"] = tuple(a.name.split(".")) if a.asname else ("torch",)
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level:
            for a in stmt.names:
                if stmt.module == "torch" and a.name == "library":
                    modules[a.asname or a.name] = ("torch", "library")
                elif stmt.module == "torch.library":
                    direct[a.asname or a.name] = a.name

    def which(func: ast.AST) -> str:
        if isinstance(func, ast.Name):
            return direct.get(func.id, "")
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id not in modules:
            return ""
        path = modules[func.id] + tuple(reversed(parts))
        return path[2] if len(path) == 3 and path[:2] == ("torch", "library") else ""

    return which


def _op_name(schema: str) -> str:
    """``name`` of ``"name.overload(Tensor x) -> Tensor"``."""
    return schema.split("(", 1)[0].split(".", 1)[0].strip()


def _decorator(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except (RecursionError, MemoryError):
        return ""


# ---- which kernel the GPU ran is the candidate's -----------------------------------------------
#: namespaces of the libraries torch computes with: a kernel inside one is never the candidate's,
#: whatever its own name (an own kernel called ``reduce_kernel`` does not claim
#: ``at::native::reduce_kernel<...>``)
LIBRARY_NAMESPACES = frozenset({"at", "c10", "native", "at_cuda_detail", "cub", "thrust", "cutlass", "cute", "flash",
                                "cudnn", "cublas", "cublasLt", "cusparse", "cufft", "curand", "std", "internal", "gemvx",
                                "fmha", "pytorch_flash", "flashinfer", "vllm", "xformers", "mem_eff", "nvjet", "xmma"})
#: older Triton releases suffix a specialisation to a kernel's name ("_norm_kernel_0d1d2de")
_TRITON_SUFFIX = re.compile(r"_\d[0-9a-z]*$")


def function_name(kernel: str) -> tuple[str, ...]:
    """The qualified name of the function a kernel name (as a profiler or Nsight Compute reports
    it) launches, one part per namespace: ``void at::native::reduce_kernel<512, 1>(float*)`` is
    ("at", "native", "reduce_kernel"), a Triton kernel's bare name is itself, and an Itanium-mangled
    C++ name (``_Z13rms_norm_rowsPKf``, ``_ZN2at6native3fooE``) is read from its mangling. Empty
    when the name cannot be read as one."""
    text = kernel.strip().replace("(anonymous namespace)", "anonymous")
    if text.startswith("_Z"):
        return _mangled(text)
    out, depth = [], 0
    for ch in text:  # templates and the parameter list go; what is left is "[return type] name"
        if ch in "<(":
            if depth == 0 and ch == "(" and "".join(out).strip():
                break
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    words = "".join(out).split()
    if not words:
        return ()
    parts = tuple(p for p in words[-1].split("::") if p)
    return parts if all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in parts) else ()


def _mangled(text: str) -> tuple[str, ...]:
    """The name parts of an Itanium-mangled function name (``_Z<len><id>`` or ``_ZN...E``)."""
    i, nested = 2, text.startswith("_ZN")
    i += nested
    parts: list[str] = []
    while i < len(text):
        while nested and i < len(text) and text[i] in "rVK":  # cv-qualifiers of a nested name
            i += 1
        digits = re.match(r"\d+", text[i:])
        if digits is None:
            break
        n = int(digits.group())
        i += len(digits.group())
        parts.append(text[i:i + n])
        i += n
        if not nested or (i < len(text) and text[i] == "E"):
            break
    return tuple(p for p in parts if re.fullmatch(r"[A-Za-z_]\w*", p))


def is_own(kernel: str, own: Sequence[str] | str) -> bool:
    """Whether a kernel the GPU ran is one the candidate defines: its function's own name equals
    one of ``own`` (Triton's old specialisation suffix allowed), and it lies in no namespace of
    torch's libraries. Never a word found somewhere in the name: a kernel called ``native`` or
    ``kernel`` must not claim an ATen kernel as the candidate's own work."""
    names = [own] if isinstance(own, str) else list(own)
    parts = function_name(kernel)
    if not parts or any(p in LIBRARY_NAMESPACES for p in parts[:-1]):
        return False
    last = parts[-1]
    return any(n and (last == n or (last.startswith(n) and _TRITON_SUFFIX.fullmatch(last[len(n):]) is not None))
               for n in names)
