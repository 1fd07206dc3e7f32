"""Static screen: the red flags of THREATS.md, found in a candidate's source before any of it runs.

``screen(source, allow_torch_ops=...)`` parses the module with :mod:`ast` and returns a
:class:`ScreenResult`: ``ok``, a one-line ``reason`` and the findings, each naming its line, its
rule and the THREATS.md class it defends. The runtime checks (trace, timing, correctness) back this
screen up, so rules are precise rather than broad: a false rejection of an honest kernel is a bug.

Rules (every id the screen can emit; ``#`` is the THREATS.md class):

=================== ===== ======================================================================
rule                  #   what trips it
=================== ===== ======================================================================
syntax                -   the module does not parse
no-modelnew           -   no ``ModelNew`` is defined at module level
modelnew-not-class    -   ``ModelNew`` is bound by something other than a ``class`` statement
side-stream           5   ``torch.cuda.Stream/stream/ExternalStream/set_stream``, ``torch.Stream``;
                          in CUDA strings ``cudaStreamCreate*``, ``cudaStreamPerThread``,
                          per-thread default stream, ``getStreamFromPool``, ``setCurrentCUDAStream``
cuda-graph           13   ``torch.cuda.is_current_stream_capturing``, ``torch.cuda.graph``,
                          ``CUDAGraph``; ``cudaStreamIsCapturing``, ``cudaStreamGetCaptureInfo``,
                          ``cudaStreamBegin/EndCapture``, ``cudaGraphLaunch``...
clock                13   reading the host clock (``time.perf_counter``...) during a call
thread                6   ``threading``, ``_thread``, ``concurrent``, ``asyncio``,
                          ``multiprocessing``, ``torch.jit.fork``; ``std::thread``, ``pthread``,
                          ``std::async``, host callbacks (``cudaLaunchHostFunc``...)
process              21   ``subprocess``, ``pty``, ``os.system/popen/fork/exec*/spawn*/kill``;
                          ``system()``/``popen()``/``fork()`` in C++
ctypes               21   ``ctypes``, ``cffi``, ``torch.cuda.cudart``; ``dlopen``/``dlsym``
introspection        10   ``sys._getframe``, ``sys.modules``, ``sys.path``, ``inspect``, ``gc``,
                          ``traceback``, ``importlib``, ``__import__``, ``globals()``/``vars()``,
                          frame and code attributes (``f_back``, ``__globals__``, ``__dict__``...),
                          ``__builtins__``, importing ``kernforge``
harness-hook         10   ``signal``, ``atexit``, ``faulthandler``, ``sys.settrace/setprofile``...
monkeypatch           8   assigning, ``setattr``/``delattr`` on an attribute of any imported module
                          or object (``time.perf_counter = ...``, ``torch.cuda.Event = ...``);
                          defining a CUDA API function in C++ (symbol interposition)
exec                  -   ``exec``, ``eval``, ``compile``, ``marshal``, ``pickle``, ``runpy``...
dynamic-attr          -   ``getattr``/``setattr`` with a computed name on torch, os, sys, time...
file-io              21   ``open``, ``io``, ``pathlib``, ``shutil``, ``tempfile``, ``os`` file calls,
                          ``torch.load/save``; ``fopen``/``fstream`` in C++
network              21   ``socket``, ``urllib``, ``http``, ``requests``, ``torch.hub``...
environ              21   ``os.environ``, ``os.getenv`` (setting ``TORCH_CUDA_ARCH_LIST`` or
                          ``MAX_JOBS`` to a constant is allowed); ``getenv`` in C++
l2-persist           18   ``accessPolicyWindow``, ``cudaLimitPersistingL2CacheSize``,
                          ``cudaCtxResetPersistingL2Cache``, persisting access properties
torch-compute        16   (torch ops forbidden) a torch compute op outside kernel bodies:
                          ``torch.X``, ``F.X``, ``torch.ops.aten.X``, tensor methods ``.sum()``,
                          ``at::X``/``torch::X`` in C++, the ``@`` operator; see ``torch_ops.py``
torch-layer          16   (torch ops forbidden) calling a ``torch.nn`` layer (``self.linear(x)``)
torch-compile        16   ``torch.compile``, ``torch.jit.script/trace``, ``torch._dynamo``,
                          ``torch._inductor``, ``torch.export``, ``torch.fx``
array-export         16   (torch ops forbidden) ``.numpy()``, ``.tolist()``, ``__dlpack__``,
                          ``torch.utils.dlpack``
foreign-kernels      16   (torch ops forbidden) ``flash_attn``, ``xformers``, ``vllm``,
                          ``flashinfer``, ``liger_kernel``... or their ``torch.ops`` namespaces
try-fallback         16   ``except`` catching ``Exception``, ``BaseException``, bare,
                          ``RuntimeError``, ``ValueError``, torch/triton errors or the candidate's
                          own exceptions, unless the handler re-raises; ``contextlib.suppress``
                          of those; an ``__exit__`` that returns true. Allowed: lookup errors
                          (``KeyError``...), ``except ImportError`` around a body of imports, and
                          ``except OutOfResources`` that relaunches one of the candidate's kernels
output-cache         11   ``forward`` (or a function whose result it returns) returns a value read
                          from a module-level or ``self`` container, or from an ``lru_cache``'d
                          function, or is itself ``lru_cache``'d
tensor-subclass       7   subclassing ``torch.Tensor``, defining ``__torch_function__`` or
                          ``__torch_dispatch__``, ``as_subclass``, assigning ``__class__``
dispatch-hook        10   ``TorchDispatchMode``, ``torch.overrides``, dispatcher internals,
                          ``torch.library`` registrations for ``aten``; ``TORCH_LIBRARY*(aten``
rng-seed             10   reseeding an RNG (``torch.manual_seed``...) outside ``__init__``
=================== ===== ======================================================================

Where rules apply: ``@triton.jit`` (and other kernel-DSL) bodies are kernels, so the torch rules
skip them. Code that only runs while the module is built (module level, ``ModelNew.__init__``, and
functions, classes and methods only *called* from there) may call torch ops, e.g. to build a
causal mask or own an ``nn.Linear``'s parameters, but may not store a torch op to call later; so
may the ``backward`` of a ``torch.autograd.Function``, which the forward-only harness never calls.
Blocks under ``if __name__ == "__main__":`` never run in the harness and are not screened.

Left to the runtime checks: Python operators other than ``@`` (``x * y``, ``x[idx]``), tensor
methods that Python's own types share (``.add``, ``.sort``) or that the candidate also defines,
ops reached through objects the screen cannot name (``for layer in self.layers: layer(x)``),
C++ tensor methods in extensions (``x.sum()``), and state kept across calls other than a
container read on the output path (counters, deferred work: THREATS #12, #13).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, NamedTuple

from . import screen_rules as R
from .kernels import own_ops_of
from .torch_ops import (
    FOREIGN_NAMESPACES,
    HOST_EXPORT_METHODS,
    cpp_call_is_compute,
    tensor_method_is_compute,
    torch_reference_kind,
)

Path = tuple[str, ...]
_FUNCS = R.FUNCS
#: calls that compile the candidate's own CUDA (their results' methods are its kernels)
_EXTENSION_BUILDERS = frozenset({
    "load_inline", "RawModule", "RawKernel", "ElementwiseKernel", "ReductionKernel", "SourceModule",
    "get_function", "cuModuleLoadData", "cuModuleGetFunction",
})
_SNIPPET = 70


@dataclass(frozen=True)
class Finding:
    """One red flag. ``col`` is 1-based, as editors count; ``message`` names the line."""

    line: int
    col: int
    rule: str
    threat: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ScreenResult:
    ok: bool
    reason: str
    findings: tuple[Finding, ...] = ()

    @property
    def threat(self) -> int | None:
        return self.findings[0].threat if self.findings else None

    @classmethod
    def of(cls, findings: Iterable[Finding]) -> "ScreenResult":
        found = tuple(sorted(findings, key=lambda f: (f.line, f.col, f.rule)))
        if not found:
            return cls(True, "no red flags")
        reason = found[0].message
        if len(found) > 1:
            others = sorted({f.rule for f in found[1:]})
            reason += f" (and {len(found) - 1} more: {', '.join(others)})"
        return cls(False, reason, found)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "findings": [f.to_dict() for f in self.findings]}


def screen(source: str, *, allow_torch_ops: bool) -> ScreenResult:
    """Screen a candidate module's source. Nothing in it is imported or run."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        line = e.lineno or 1
        text = (e.text or "").strip()[:_SNIPPET]
        where = f" near `{text}`" if text else ""
        return ScreenResult.of([_finding(line, (e.offset or 1), "syntax", f"syntax error: {e.msg}{where}")])
    except ValueError as e:  # source with NUL bytes
        return ScreenResult.of([_finding(1, 1, "syntax", f"the source cannot be parsed: {e}")])
    except (RecursionError, MemoryError):  # nested past the parser: the import fails and says so
        return ScreenResult(True, "not screened: the source nests too deeply to read")
    try:
        return ScreenResult.of(_Screen(tree, allow_torch_ops).run())
    except (RecursionError, MemoryError):
        # A module CPython compiles but too deep for this walk (a 2,000-term expression): the
        # screen is early feedback only, so it passes nothing and rejects nothing here.
        return ScreenResult(True, "not screened: the source nests too deeply to read")


def _finding(line: int, col: int, rule: str, text: str) -> Finding:
    spec = R.RULES[rule]
    tag = f" (THREATS #{spec.threat})" if spec.threat is not None else ""
    return Finding(line, col, rule, spec.threat, f"line {line}: {text}{tag}: {spec.why}")


def _snippet(node: ast.AST | str) -> str:
    text = node if isinstance(node, str) else ast.unparse(node)
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "..."


class _Ctx(NamedTuple):
    jit: bool  # inside a kernel body (Triton or another DSL)
    construction: bool  # runs only while the module and ModelNew are built


class _Screen:
    def __init__(self, tree: ast.Module, allow_torch_ops: bool) -> None:
        self.tree = tree
        self.allow = allow_torch_ops
        self.found: dict[tuple[int, str, str], Finding] = {}
        self.exempt: set[int] = set()  # ids of nodes already judged (allowed environ writes)
        R.drop_main_block(tree)
        self.nodes: list[ast.AST] = list(ast.walk(tree))
        self.parent: dict[int, ast.AST] = {}
        self.scope: dict[int, ast.AST | None] = {}
        self._index(tree, None)
        self.aliases = self._aliases()
        self.shadowed = self._bound_names()
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in tree.body if isinstance(n, _FUNCS)}
        self.jit = self._kernel_functions()
        #: custom ops the module defines itself: the candidate's, whatever their namespace is called
        self.own_ops = frozenset(own_ops_of(tree))
        self.own_names, self.ext_holders = self._own_names()
        self.construction = self._construction_functions()
        self.layer_attrs, self.layer_names = self._layers()

    # ---------------------------------------------------------------- reporting

    def report(self, node: ast.AST | int, rule: str, snippet: str, what: str) -> None:
        if rule in R.TORCH_POLICY_RULES and self.allow:
            return
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        col = 1 if isinstance(node, int) else getattr(node, "col_offset", 0) + 1
        key = (line, rule, snippet)
        if key not in self.found:
            self.found[key] = _finding(line, col, rule, f"`{snippet}` {what}")

    def run(self) -> list[Finding]:
        self._check_modelnew()
        self._walk(self.tree, _Ctx(jit=False, construction=True))
        self._check_output_cache()
        return list(self.found.values())

    # ---------------------------------------------------------------- indexing

    def _index(self, node: ast.AST, scope: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            self.parent[id(child)] = node
            self.scope[id(child)] = scope
            inner = child if isinstance(child, (*_FUNCS, ast.Lambda, ast.GeneratorExp)) else scope
            self._index(child, inner)

    def _aliases(self) -> dict[str, set[Path]]:
        aliases: dict[str, set[Path]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        aliases.setdefault(a.asname, set()).add(tuple(a.name.split(".")))
                    else:
                        root = a.name.split(".")[0]
                        aliases.setdefault(root, set()).add((root,))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        aliases.setdefault(a.asname or a.name, set()).add((*node.module.split("."), a.name))
        self.aliases = aliases
        renames = [n for n in self.nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and isinstance(n.value, (ast.Name, ast.Attribute))]
        for _ in range(3):  # `F = torch.nn.functional`, `mm = F.linear`: follow simple renames
            for node in renames:
                for p in self.resolve(node.value, builtin=False):
                    aliases.setdefault(node.targets[0].id, set()).add(p)
        return aliases

    def _bound_names(self) -> set[str]:
        names: set[str] = set()
        for node in self.nodes:
            if isinstance(node, (*_FUNCS, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
        return names

    def resolve(self, node: ast.AST, builtin: bool = True) -> list[Path]:
        """Dotted import paths an expression may name: ``F.relu`` -> torch.nn.functional.relu."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return sorted(self.aliases[node.id])
            if builtin and node.id not in self.shadowed and hasattr(builtins, node.id):
                return [("builtins", node.id)]
            return []
        if isinstance(node, ast.Attribute):
            return [p + (node.attr,) for p in self.resolve(node.value, builtin)]
        if R.is_getattr_const(node):
            assert isinstance(node, ast.Call)
            name = node.args[1].value  # type: ignore[attr-defined]
            return [p + (name,) for p in self.resolve(node.args[0], builtin)]
        return []

    def _root_len(self, node: ast.AST) -> int:
        """Length of the import path the chain's root name came from (0: not an import)."""
        while isinstance(node, ast.Attribute) or R.is_getattr_const(node):
            node = node.value if isinstance(node, ast.Attribute) else node.args[0]  # type: ignore[attr-defined]
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return min(len(p) for p in self.aliases[node.id])
        return 0

    def _kernel_functions(self) -> set[ast.AST]:
        kernels: set[ast.AST] = set()
        wrapped: set[str] = set()
        for node in self.nodes:
            if isinstance(node, _FUNCS) and any(self._is_kernel_decorator(d) for d in node.decorator_list):
                kernels.add(node)
            elif isinstance(node, ast.Call) and self._is_kernel_decorator(node.func):
                wrapped.update(a.id for a in node.args if isinstance(a, ast.Name))
        kernels.update(n for n in self.nodes if isinstance(n, _FUNCS) and n.name in wrapped)
        return kernels

    def _is_kernel_decorator(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            node = node.func
        return any(p[0] in R.KERNEL_DSL_ROOTS and p[-1] in R.KERNEL_DECORATORS for p in self.resolve(node))

    def _own_names(self) -> tuple[set[str], set[str]]:
        """Names the candidate defines (functions, methods, extension exports) and the names that
        hold its compiled extensions: a method call on those is the candidate's own code."""
        names = {n.name for n in self.nodes if isinstance(n, _FUNCS)}
        holders: set[str] = set()
        for node in self.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(R.PYBIND_DEF.findall(node.value))
            elif isinstance(node, ast.Call) and self._is_extension_build(node):
                for kw in node.keywords:
                    if kw.arg == "functions" and isinstance(kw.value, (ast.List, ast.Tuple)):
                        names.update(e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
                    elif kw.arg == "functions" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        names.add(kw.value.value)
                assign = self.parent.get(id(node))
                if isinstance(assign, (ast.Assign, ast.AnnAssign)):
                    for t in assign.targets if isinstance(assign, ast.Assign) else [assign.target]:
                        holders.add(R.target_key(t))
        return names, holders

    def _is_extension_build(self, call: ast.Call) -> bool:
        for p in self.resolve(call.func):
            if (p[0] == "torch" and "cpp_extension" in p) or p[-1] in _EXTENSION_BUILDERS:
                return True
        return False

    # ---------------------------------------------------------------- regions

    def _construction_functions(self) -> set[ast.AST]:
        """Functions that run only while the module and ``ModelNew`` are being built."""
        refs: dict[str, list[ast.AST]] = {}
        attr_refs: dict[str, list[ast.AST]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                refs.setdefault(node.id, []).append(node)
            elif isinstance(node, ast.Attribute):
                attr_refs.setdefault(node.attr, []).append(node)
        built: set[ast.AST] = set(self._backward_methods(attr_refs))
        ok_classes: set[str] = set()

        def at_build_time(ref: ast.AST) -> bool:
            s = self.scope.get(id(ref))
            return s is None or s in built

        def called_at_build_time(ref: ast.AST) -> bool:
            p = self.parent.get(id(ref))
            return isinstance(p, ast.Call) and p.func is ref and at_build_time(ref)

        def class_ref_ok(ref: ast.AST) -> bool:
            p = self.parent.get(id(ref))
            if isinstance(p, ast.ClassDef) and ref in p.bases:
                return p.name in ok_classes
            if isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id == "super":
                return True
            return called_at_build_time(ref)

        changed = True
        while changed:
            changed = False
            for name in self.classes:
                if name in ok_classes:
                    continue
                if name == "ModelNew" or (refs.get(name) and all(class_ref_ok(r) for r in refs[name])):
                    ok_classes.add(name)
                    changed = True
            for name, fn in self.functions.items():
                if fn in built or fn.decorator_list:
                    continue
                uses = refs.get(name, [])
                if (uses or name in ("get_inputs", "get_init_inputs")) and all(called_at_build_time(r) for r in uses):
                    built.add(fn)
                    changed = True
            for name in ok_classes:
                for fn in self.classes[name].body:
                    if not isinstance(fn, _FUNCS) or fn in built or fn.decorator_list:
                        continue
                    uses = attr_refs.get(fn.name, [])
                    if fn.name == "__init__" or (fn.name != "forward" and uses and all(called_at_build_time(r) for r in uses)):
                        built.add(fn)
                        changed = True
        return built

    def _backward_methods(self, attr_refs: dict[str, list[ast.AST]]) -> Iterator[ast.AST]:
        """``backward`` of a ``torch.autograd.Function``: only autograd calls it, and the harness
        runs forward alone (unless the module names ``.backward`` somewhere)."""
        if "backward" in attr_refs:
            return
        for cls in self.classes.values():
            if any(p[:2] == ("torch", "autograd") and p[-1] == "Function" for b in cls.bases for p in self.resolve(b)):
                yield from (f for f in cls.body if isinstance(f, _FUNCS) and f.name == "backward")

    def _layers(self) -> tuple[set[str], set[str]]:
        """``self.X`` attributes and module names that hold a torch.nn layer (or a container of them)."""
        attrs: set[str] = set()
        names: set[str] = set()
        for node in self.nodes:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            builds_layer = any(
                isinstance(c, ast.Call) and any(torch_reference_kind(p) == "layer" for p in self.resolve(c.func))
                for c in ast.walk(node.value)
            )
            if not builds_layer:
                continue
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    attrs.add(t.attr)
                elif isinstance(t, ast.Name) and self.scope.get(id(t)) is None:
                    names.add(t.id)
        return attrs, names

    # ---------------------------------------------------------------- the walk

    def _walk(self, node: ast.AST, ctx: _Ctx) -> None:
        if isinstance(node, _FUNCS):
            for d in node.decorator_list:
                self._walk(d, ctx)
            self._walk(node.args, ctx)  # defaults and annotations run when the def runs
            if node.returns is not None:
                self._walk(node.returns, ctx)
            inner = _Ctx(jit=ctx.jit or node in self.jit, construction=node in self.construction)
            for stmt in node.body:
                self._walk(stmt, inner)
            return
        if isinstance(node, (ast.Lambda, ast.GeneratorExp)):
            ctx = _Ctx(jit=ctx.jit, construction=False)
        self._check(node, ctx)
        for child in ast.iter_child_nodes(node):
            self._walk(child, ctx)

    def _check(self, node: ast.AST, ctx: _Ctx) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self._check_import(node, ctx)
        elif isinstance(node, ast.ClassDef):
            self._check_class(node)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self._check_try(node, ctx)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            self._check_assign(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self._check_string(node)
        if isinstance(node, ast.Call):
            self._check_call(node, ctx)
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult) \
                and not (self.allow or ctx.jit or ctx.construction):
            # launchers do integer arithmetic with + - * //, but never multiply matrices
            self.report(node, "torch-compute", _snippet(node), "multiplies matrices with `@`, a torch compute op")
        if isinstance(node, ast.Attribute):
            self._check_identifier(node, node.attr)
            if node.attr in R.INTROSPECTION_ATTRS:
                self.report(node, "introspection", _snippet(node), f"reads `{node.attr}`")
        if isinstance(node, ast.Name):
            self._check_identifier(node, node.id)
            if node.id == "__builtins__":
                self.report(node, "introspection", node.id, "reaches the builtins namespace")
            if node.id == "__name__" and isinstance(node.ctx, ast.Store):
                self.report(node, "introspection", "__name__ = ...", "renames the module")
        if self._is_chain(node) and self._is_maximal(node):
            self._check_chain(node, ctx)

    def _is_chain(self, node: ast.AST) -> bool:
        return isinstance(node, (ast.Name, ast.Attribute)) or R.is_getattr_const(node)

    def _is_maximal(self, node: ast.AST) -> bool:
        p = self.parent.get(id(node))
        if isinstance(p, ast.Attribute) and p.value is node:
            return False
        return not (R.is_getattr_const(p) and p.args[0] is node)  # type: ignore[union-attr]

    def _check_identifier(self, node: ast.AST, name: str) -> None:
        for tok in R.CUDA_TOKENS:
            if tok.in_python and tok.pattern.search(name):
                self.report(node, tok.rule, _snippet(node), tok.what)

    # ---------------------------------------------------------------- names and paths

    def _path_rule(self, path: Path) -> tuple[int, str, str] | None:
        """(matched prefix length, rule, what) for the longest rule prefix of ``path``."""
        for n in range(len(path), 0, -1):
            prefix = path[:n]
            if prefix in R.EXEMPT_PATHS:
                return None
            if prefix in R.PATH_RULES:
                rule, what = R.PATH_RULES[prefix]
                return n, rule, what
        os_hit = R.os_rule(path)
        if os_hit:
            return (2 if path[1] != "path" else 3), *os_hit
        thread_hit = R.threading_rule(path)
        if thread_hit:
            return 2, *thread_hit
        return None

    def _check_path(self, node: ast.AST, path: Path, root_len: int, ctx: _Ctx, snippet: str) -> bool:
        hit = self._path_rule(path)
        if not hit:
            return False
        n, rule, what = hit
        if rule in R.CALL_TIME_RULES:
            if not ctx.construction:
                self.report(node, rule, snippet, what)
            return True
        if n <= root_len or id(node) in self.exempt:
            return True  # reported where it was imported, or judged already
        self.report(node, rule, snippet, what)
        return True

    def _check_chain(self, node: ast.AST, ctx: _Ctx) -> None:
        paths = self.resolve(node)
        if not paths:
            return
        parent = self.parent.get(id(node))
        is_call = isinstance(parent, ast.Call) and parent.func is node
        snippet = _snippet(parent if is_call else node)
        storing = isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del))
        root_len = self._root_len(node)
        for path in paths:
            if self._check_path(node, path, root_len, ctx, snippet) or storing:
                continue
            self._check_torch(node, path, ctx, snippet, is_call)

    def _check_torch(self, node: ast.AST, path: Path, ctx: _Ctx, snippet: str, is_call: bool) -> None:
        if self.allow or ctx.jit or path[0] != "torch":
            return
        kind = torch_reference_kind(path)
        if kind is None or (kind == "compute" and self._root_is_op_import(node)):
            return
        dotted = ".".join(path)
        if kind == "layer":
            if is_call and not ctx.construction:
                self.report(node, "torch-layer", snippet, f"builds and runs the torch layer `{dotted}` during the call")
            return
        if is_call and ctx.construction:
            return  # build-time work (a mask, a weight layout): it cannot see the inputs
        if len(path) > 3 and path[1] == "ops" and f"{path[2]}::{path[3]}" in self.own_ops:
            return  # its own op (kernels.own_op_names): the ops its body runs are judged there
        if len(path) > 3 and path[1] == "ops" and path[2] in FOREIGN_NAMESPACES:
            self.report(node, "foreign-kernels", snippet, f"calls another library's op `{dotted}`")
            return
        verb = "calls" if is_call else "refers to"
        self.report(node, "torch-compute", snippet, f"{verb} the torch compute op `{dotted}`")

    def _root_is_op_import(self, node: ast.AST) -> bool:
        """The chain's root name was imported as the op itself (``from torch import matmul``):
        that import was reported, so its uses are not reported again."""
        while isinstance(node, ast.Attribute) or R.is_getattr_const(node):
            node = node.value if isinstance(node, ast.Attribute) else node.args[0]  # type: ignore[attr-defined]
        if not isinstance(node, ast.Name):
            return False
        return any(torch_reference_kind(p) == "compute" for p in self.aliases.get(node.id, ()))

    def _check_import(self, node: ast.Import | ast.ImportFrom, ctx: _Ctx) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                return
            base = tuple(node.module.split("."))
            items = [(base if a.name == "*" else base + (a.name,), a) for a in node.names]
        else:
            items = [(tuple(a.name.split(".")), a) for a in node.names]
        for path, alias in items:
            text = _snippet(ast.unparse(node) if len(node.names) == 1 else f"import {'.'.join(path)}")
            self._check_identifier(node, ".".join(path))
            if self._check_path(node, path, 0, ctx, text):
                continue
            if alias.name == "*" and len(path) == 1 and path[0] in R.BY_ATTRIBUTE:
                rule, what = R.BY_ATTRIBUTE[path[0]]
                self.report(node, rule, text, what)
                continue
            if path[0] != "torch":
                continue
            if alias.name == "*":
                self.report(node, "torch-compute", text, "imports every name of a torch namespace, so its ops cannot be screened")
            elif torch_reference_kind(path) == "compute":
                self.report(node, "torch-compute", text, f"imports the torch compute op `{'.'.join(path)}`")

    # ---------------------------------------------------------------- calls

    def _check_call(self, node: ast.Call, ctx: _Ctx) -> None:
        funcs = self.resolve(node.func)
        for path in funcs:
            if path in (("builtins", "setattr"), ("builtins", "delattr"), ("builtins", "object", "__setattr__"),
                        ("builtins", "object", "__delattr__"), ("builtins", "type", "__setattr__")):
                if node.args and self.resolve(node.args[0]):
                    self.report(node, "monkeypatch", _snippet(node), f"changes an attribute of `{_snippet(node.args[0])}`")
            if path[:2] in (("builtins", "getattr"), ("builtins", "setattr"), ("builtins", "delattr")):
                if len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
                    if any(p[0] in R.DYNAMIC_ATTR_ROOTS for p in self._rooted(node.args[0])):
                        self.report(node, "dynamic-attr", _snippet(node), "looks up a computed attribute name")
            if path == ("contextlib", "suppress") and any(self._broad(a, imports_only=False) for a in node.args):
                self.report(node, "try-fallback", _snippet(node), "silences exceptions that a failing kernel raises")
            if path[:2] == ("torch", "library") and any(R.mentions_aten(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                self.report(node, "dispatch-hook", _snippet(node), "registers an implementation for an aten op")
            if path[:2] == ("os", "environ") and path[-1] == "setdefault" and R.env_writable(node.args[:1]):
                self.exempt.add(id(node.func))
        if isinstance(node.func, ast.Attribute):
            self._check_method(node, node.func, ctx, bool(funcs))
        if not (self.allow or ctx.jit or ctx.construction) and self._calls_layer(node.func):
            self.report(node, "torch-layer", _snippet(node), "runs a torch.nn layer during the call")

    def _check_method(self, node: ast.Call, func: ast.Attribute, ctx: _Ctx, resolved: bool) -> None:
        name = func.attr
        if name in R.SUBCLASS_METHODS:
            self.report(node, "tensor-subclass", _snippet(node), "turns a tensor into a subclass")
            return
        if name in R.FILE_METHODS:
            self.report(node, "file-io", _snippet(node), "maps a file into memory")
            return
        if resolved or self.allow or ctx.jit or ctx.construction or self.resolve(func.value):
            return
        if name in HOST_EXPORT_METHODS:
            self.report(node, "array-export", _snippet(node), "copies the tensor's values out of torch")
            return
        if name in self.own_names or R.receiver_key(func.value) in self.ext_holders:
            return
        if tensor_method_is_compute(name):
            self.report(node, "torch-compute", _snippet(node), f"calls the tensor method `.{name}()`, a torch compute op")

    def _calls_layer(self, func: ast.AST) -> bool:
        if isinstance(func, ast.Attribute) and func.attr in ("forward", "__call__"):
            func = func.value
        while isinstance(func, ast.Subscript):
            func = func.value
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return func.attr in self.layer_attrs
        return isinstance(func, ast.Name) and func.id in self.layer_names

    # ---------------------------------------------------------------- statements

    def _check_assign(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.Delete):
            targets = node.targets
        else:
            targets = [node.target]  # type: ignore[attr-defined]
        for t in R.flatten_targets(targets):
            if isinstance(t, ast.Subscript) and isinstance(node, ast.Assign) and R.env_writable([t.slice]) \
                    and any(p[:2] == ("os", "environ") for p in self.resolve(t.value)) \
                    and isinstance(node.value, ast.Constant):
                self.exempt.add(id(t.value))
            if not isinstance(t, ast.Attribute):
                continue
            if t.attr == "__class__":
                self.report(t, "tensor-subclass", _snippet(t), "changes an object's class")
            elif self.resolve(t.value):
                verb = "deletes" if isinstance(node, ast.Delete) else "replaces"
                self.report(t, "monkeypatch", _snippet(t), f"{verb} an attribute of an imported module")

    def _check_class(self, node: ast.ClassDef) -> None:
        base_paths = [p for b in node.bases for p in self.resolve(b)]
        is_mode = any(p[:4] == ("torch", "utils", "_python_dispatch", "TorchDispatchMode") or p[:2] == ("torch", "overrides")
                      for p in base_paths)
        if any(p in R.TENSOR_CLASSES for p in base_paths):
            self.report(node, "tensor-subclass", f"class {node.name}", "subclasses torch.Tensor")
        for item in node.body:
            if not isinstance(item, _FUNCS):
                continue
            if item.name in R.SUBCLASS_HOOKS and not is_mode:
                self.report(item, "tensor-subclass", f"def {item.name}", "intercepts torch calls on its objects")
            if item.name in ("__exit__", "__aexit__") and any(
                r.value is not None and not (isinstance(r.value, ast.Constant) and not r.value.value)
                for r in R.own_nodes(item) if isinstance(r, ast.Return)
            ):
                self.report(item, "try-fallback", f"def {item.name}", "can return true, which swallows the exception")

    def _check_try(self, node: ast.AST, ctx: _Ctx) -> None:
        body = node.body  # type: ignore[attr-defined]
        imports_only = all(R.is_import_stmt(s) for s in body)
        if ctx.construction and self._queries_only(body):
            return  # a device query at import (red team G): no kernel ran in it, none can have failed
        for h in node.handlers:  # type: ignore[attr-defined]
            if h.type is not None and not self._broad(h.type, imports_only):
                continue
            if R.reraises(h) or self._retries_own_kernel(h):
                continue
            caught = "everything" if h.type is None else f"`{_snippet(h.type)}`"
            text = "except:" if h.type is None else f"except {_snippet(h.type)}"
            self.report(h, "try-fallback", text, f"catches {caught} and carries on")

    def _rooted(self, expr: ast.AST) -> list[Path]:
        """What ``expr`` resolves to, or else what the name at the root of its chain does, through
        attributes, calls and subscripts (``threading.Event().wait`` -> ``threading``): a computed
        attribute of anything reached from a module is that module's (red team:
        ``getattr(threading.Event().wait, "__glo" + "bals__")`` reached threading's raw starter)."""
        paths = self.resolve(expr)
        while not paths and isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
            expr = expr.func if isinstance(expr, ast.Call) else expr.value
            paths = self.resolve(expr)
        return paths

    def _queries_only(self, body: list[ast.stmt]) -> bool:
        """Every call in ``body`` is a device query (``DEVICE_QUERIES``): nothing of the
        candidate's, no build, no launch."""
        calls = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Call)]
        for call in calls:
            paths = self.resolve(call.func)
            if not paths and isinstance(call.func, ast.Attribute):
                # a method of a query's result (driver.active.get_current_target()): judged by its root
                root = call.func
                while isinstance(root, ast.Attribute):
                    root = root.value
                paths = self.resolve(root.func) if isinstance(root, ast.Call) else self.resolve(root)
            if not paths or not all(any(p[:len(q)] == q for q in R.DEVICE_QUERIES) for p in paths):
                return False
        return True

    def _retries_own_kernel(self, handler: ast.ExceptHandler) -> bool:
        """``except OutOfResources:`` that launches one of the candidate's Triton kernels again
        (a smaller tile): the fallback is its own kernel."""
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if not types or not all(t is not None and _snippet(t).split(".")[-1] == "OutOfResources" for t in types):
            return False
        kernels = {f.name for f in self.jit}
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and isinstance(n.func.value, ast.Name)
                   and n.func.value.id in kernels for stmt in handler.body for n in ast.walk(stmt))

    def _broad(self, expr: ast.AST, imports_only: bool) -> bool:
        """Whether an exception type (or tuple of types) can catch a failing kernel's error."""
        if isinstance(expr, ast.Tuple):
            return any(self._broad(e, imports_only) for e in expr.elts)
        for path in self.resolve(expr):
            if path[0] == "builtins" and len(path) == 2:
                if path[1] in R.NARROW_EXCEPTIONS or (imports_only and path[1] in R.IMPORT_EXCEPTIONS):
                    return False
        return True

    def _check_string(self, node: ast.Constant) -> None:
        text = R.strip_c_comments(node.value)
        c_like = R.looks_like_c(text)
        for tok in R.CUDA_TOKENS:
            if not (tok.in_python or c_like):
                continue  # generic C words (`system(`, `fopen`) only count in C/C++ source
            for m in tok.pattern.finditer(text):
                line = node.lineno + text.count("\n", 0, m.start())
                self.report(line, tok.rule, _snippet(m.group(0).strip()), f"{tok.what} in CUDA source")
        if self.allow or ("at::" not in text and "torch::" not in text):
            return
        for m in R.CPP_ATEN_CALL.finditer(text):
            if cpp_call_is_compute(m.group(1)):
                line = node.lineno + text.count("\n", 0, m.start())
                self.report(line, "torch-compute", _snippet(m.group(0).rstrip("( ")), "calls an ATen compute op in C++")

    # ---------------------------------------------------------------- ModelNew

    def _check_modelnew(self) -> None:
        bindings = list(R.module_level_bindings(self.tree, "ModelNew"))
        if not bindings:
            self.report(1, "no-modelnew", "ModelNew", "is not defined")
            return
        for b in bindings:
            if not isinstance(b, ast.ClassDef):
                self.report(b, "modelnew-not-class", _snippet(b), "binds `ModelNew` to something other than a class")

    # ---------------------------------------------------------------- output caches (#11)

    def _check_output_cache(self) -> None:
        model = self.classes.get("ModelNew")
        if model is None:
            return
        containers = self._containers()
        cached = {name for name, fn in self.functions.items() if self._cache_decorator(fn)}
        methods = {f.name: f for f in model.body if isinstance(f, _FUNCS)}
        work = [methods[m] for m in ("forward", "__call__") if m in methods]
        seen: set[ast.AST] = set()
        while work:
            fn = work.pop()
            if fn in seen:
                continue
            seen.add(fn)
            deco = self._cache_decorator(fn)
            if deco is not None:
                self.report(deco, "output-cache", f"@{_snippet(deco)}", f"caches the results of `{fn.name}`, whose result forward returns")
            local = R.local_names(fn)
            for ret in (n for n in R.own_nodes(fn) if isinstance(n, ast.Return) and n.value is not None):
                for base in R.returned_bases(ret.value, fn, 0):
                    if isinstance(base, ast.Call):
                        callee = R.callee(base, self.functions, methods)
                        if callee is not None:
                            work.append(callee)
                        if isinstance(base.func, ast.Name) and base.func.id in cached:
                            self.report(base, "output-cache", _snippet(base), "returns an object a cached function keeps across calls")
                    held = R.container_read(base)
                    if held is not None and (held in containers["self"] if held.startswith("self.")
                                             else held in containers["module"] and held not in local):
                        self.report(base, "output-cache", _snippet(base), f"returns a value kept in `{held}` across calls")

    def _containers(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {"module": set(), "self": set()}
        for node in self.nodes:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None or not self._is_container(node.value):
                continue
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                key = R.target_key(t)
                if key.startswith("self."):
                    found["self"].add(key)
                elif isinstance(t, ast.Name) and self.scope.get(id(t)) is None:
                    found["module"].add(key)
        return found

    def _is_container(self, value: ast.AST) -> bool:
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            return True
        return isinstance(value, ast.Call) and any(p in R.CONTAINER_CALLS for p in self.resolve(value.func))

    def _cache_decorator(self, fn: ast.AST) -> ast.AST | None:
        for d in getattr(fn, "decorator_list", []):
            target = d.func if isinstance(d, ast.Call) else d
            if any(p in R.CACHE_DECORATORS for p in self.resolve(target)):
                return d
        return None
