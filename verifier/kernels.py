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


#: ``TORCH_LIBRARY(ns, m)`` (or ``_FRAGMENT``) in C++ source, and each ``m.def("name...`` after it
_CPP_LIBRARY = re.compile(r"TORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
_CPP_DEF = r"\b{var}\s*\.\s*def\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\()?\s*\"(\w+)"
#: the Python calls that define an op by its qualified name (``"ns::name"`` or a schema)
_PY_DEFINERS = ("custom_op", "triton_op", "define")


def own_op_names(source: str) -> list[str]:
    """The custom ops the module itself defines, as ``"namespace::name"``: through
    ``torch.library.custom_op``/``triton_op``/``define``, a ``torch.library.Library(ns, "DEF" or
    "FRAGMENT")`` and its ``define``, or ``TORCH_LIBRARY(ns, m) { m.def(...) }`` in C++ source.
    An op is the candidate's whatever its namespace is called (an honest kernel may name its op
    after vLLM's, ``vllm::silu_and_mul``); defining one that exists already fails the import, and
    an implementation given to another library's op (``impl``) defines nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: set[str] = set()
    libraries: dict[str, str] = {}  # a variable holding a Library -> its namespace
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _callee(node.value.func) == "Library":
            args = [a.value for a in node.value.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(args) == 2 and args[1] in ("DEF", "FRAGMENT"):
                libraries.update({t.id: args[0] for t in node.targets if isinstance(t, ast.Name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            text = node.args[0].value
            held = node.func.value.id if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                else None
            if held in libraries and node.func.attr == "define":  # type: ignore[union-attr]
                found.add(f"{libraries[held]}::{_op_name(text)}")
            elif _callee(node.func) in _PY_DEFINERS and "::" in text:
                namespace, _, rest = text.partition("::")
                found.add(f"{namespace.strip()}::{_op_name(rest)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "TORCH_LIBRARY" in node.value:
            for lib in _CPP_LIBRARY.finditer(node.value):
                namespace, var = lib.groups()
                found |= {f"{namespace}::{name}" for name in re.findall(_CPP_DEF.format(var=re.escape(var)), node.value)}
    return sorted(found)


def _op_name(schema: str) -> str:
    """``name`` of ``"name.overload(Tensor x) -> Tensor"``."""
    return schema.split("(", 1)[0].split(".", 1)[0].strip()


def _callee(func: ast.AST) -> str:
    """The last name of a called expression (``torch.library.custom_op`` -> ``custom_op``)."""
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


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
