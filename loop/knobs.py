"""Launch knobs of the Triton kernels in a candidate: find them with ``ast`` and rewrite them.

A knob is one value the offline tuner may change without changing what a kernel computes:
a block-size ``tl.constexpr`` argument of a launch ``kernel[grid](...)`` (BLOCK, BLOCK_M, TILE_N,
GROUP_M, ...), the launch options ``num_warps`` and ``num_stages``, ``num_ctas`` where thread-block
clusters exist, or the cache eviction hint of one ``tl.load``. Its value is edited where it is
written: in the launch when it is a literal there, else at the single assignment of the local
variable or module constant that feeds the launch, so that a grid computed from the same
variable (``triton.cdiv(n, block)``) stays consistent with it. ``min(<computed>, 1024)`` has a
tunable cap: the author already wrote the kernel for values below and above it.

Eviction hints are categorical: ``eviction_policy=`` of each ``tl.load`` in a launched kernel or
in a ``@triton.jit`` helper it calls, one of "evict_first", "" (absent: Triton's evict_normal)
and "evict_last", in that order of how long the loaded lines stay in cache, so one step along the
domain is one step in priority. A hint is a PTX cache policy; the interpreter ignores it. Left
alone: a hint that is not a string literal of the domain, loads with ``volatile=True`` (a value
another program may change is no place for a cache hint), with ``*args``/``**kwargs``, or with
the hint possibly given by position (seven positional arguments: Triton 3.0-3.4's signature).

``num_ctas`` is the number of CTAs in a thread-block cluster that together run one program
(Triton's ``CUDAOptions``: "number of blocks in a block cluster. SM90+ only"; the NVIDIA backend
refuses num_ctas > 1 below compute capability 9.0 and the interpreter drops it). Triton splits
tensors over the cluster's CTAs but reduces only within one CTA, so clusters pay off for tl.dot
tiles: it is a knob only when the caller says the target has clusters (``clusters_in``) and the
kernel calls tl.dot.

Left alone, with a note saying why: values computed from the shape (``triton.next_power_of_2(H)``
for a kernel that needs the whole row in one block), unless the kernel uses the parameter only as
the step of its loops, in which case a cap ``min(<computed>, N)`` is introduced; literals that
also appear in the grid (the grid may depend on them); variables assigned more than once or
passed in by the caller; kernels under ``@triton.autotune`` (they tune themselves) and
parameters that ``@triton.heuristics`` sets; integer constexprs whose names do not say they are
tiling parameters (a group size of 128 may be what the operation means).

The float32 product of a ``tl.dot`` is categorical too: ``input_precision=`` written as "ieee" or
"tf32x3" may take either value. "ieee" multiplies on the CUDA cores; "tf32x3" splits each float32
operand into a TF32 head and a TF32 remainder and adds three tensor-core products (head x head,
head x remainder, remainder x head), a float32 product to within a few units of float32's own
rounding at tensor-core speed (CUTLASS's 3xTF32). The judge's float32 tolerance decides whether a
kernel's sums stay within it, as it does for any block size that reorders them. Left alone: a dot
with no ``input_precision`` (Triton's default TF32 for float32, or 16-bit inputs where it means
nothing), and "tf32" (one TF32 product keeps 10 mantissa bits: the judge's float32 tolerance
refuses it, bench/kernelbench/README.md).

Rewriting is a text edit at the knob's position, so comments and layout survive and the same
assignment always gives the same text. Nothing is executed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Mapping

from kernforge.archive.content import code_hash

#: Constexpr names that are tiling parameters: any value computes the same result.
TILING_NAME = re.compile(r"^(?!NUM_)(?:\w*BLOCK\w*|\w*TILE\w*|GROUP_(?:SIZE_)?[MNK])$", re.IGNORECASE)
OPTIONS = ("num_warps", "num_stages", "num_ctas")
#: Triton's NVIDIA backend defaults (``CUDAOptions``): what an absent launch option means.
OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1}
#: num_ctas: 8 is the largest cluster CUDA guarantees to launch (16 is non-portable).
OPTION_DOMAINS = {"num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2, 3, 4, 5), "num_ctas": (1, 2, 4, 8)}
EVICTION = "eviction_policy"
#: Ordered by how long a loaded line stays in cache; "" is an absent hint (evict_normal).
EVICTION_DOMAIN = ("evict_first", "", "evict_last")
#: tl.load's keyword-only hint may be positional in Triton 3.0-3.4: the 7th argument.
EVICTION_POSITION = 6
PRECISION = "input_precision"
#: a float32 tl.dot's product: the CUDA cores' float32, or three TF32 tensor-core products
PRECISION_DOMAIN = ("ieee", "tf32x3")
#: the categorical kinds and their fixed domains, in the order a step moves along
CATEGORICAL = {"eviction": EVICTION_DOMAIN, "precision": PRECISION_DOMAIN}
#: Block sizes are powers of two within a factor of RADIUS of the value they start from.
RADIUS = 4
MAX_BLOCK = 1 << 16
#: tl.dot needs every tile side >= 16.
DOT_MIN = 16
#: Caps the tuner introduces (None: no cap, the value as written).
NEW_CAP_DOMAIN = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, None)


class KnobError(ValueError):
    """A rewrite that cannot be applied: an unknown knob, a bad value, a source that moved."""


@dataclass(frozen=True)
class Knob:
    """One tunable value, where it is written and the values it may take."""

    label: str  # unique in its source: the parameter name, else "kernel.param", else "...@line"
    kernel: str  # the launched kernel, or for an eviction hint the @triton.jit function it is in
    #: the constexpr or option; "<pointer>.eviction_policy" for a load's hint
    param: str
    #: "literal" (in the launch), "local" / "constant" (an assignment feeding it), "cap" (the
    #: literal of min(..., N)), "option" (num_warps/num_stages/num_ctas), "new_cap" (min(expr, N)
    #: added), "eviction" (the eviction_policy string of one tl.load), "precision" (the
    #: input_precision string of one tl.dot)
    kind: str
    value: int | str | None
    line: int
    where: str
    start: int  # byte offsets of the text to replace (equal for an absent launch option)
    end: int
    present: bool = True
    expr: str = ""  # new_cap: the expression being capped
    lo: int = 1

    def domain(self, *anchors: int | str | None) -> tuple[int | str | None, ...]:
        """Values to try: fixed sets for options, new caps and hints, else powers of two near the anchors.

        The order is the search's notion of distance: one step is one place along this tuple.
        """
        if self.kind in CATEGORICAL:
            return CATEGORICAL[self.kind]
        anchors = tuple(a for a in anchors if a is not None or self.kind == "new_cap")
        values: set[int | None] = {self.value, *anchors}
        if self.kind == "option":
            values |= set(OPTION_DOMAINS[self.param])
        elif self.kind == "new_cap":
            values |= {v for v in NEW_CAP_DOMAIN if v is None or v >= self.lo}
        else:
            for v in (self.value, *anchors):
                p = 1
                while p <= min(v * RADIUS, MAX_BLOCK):
                    if p * RADIUS >= v and p >= self.lo:
                        values.add(p)
                    p *= 2
        return tuple(sorted(values, key=lambda v: (v is None, v or 0)))

    def widest(self) -> tuple[int | str | None, ...]:
        """Every value the domain can grow to as the search moves: a block size's powers of two
        reach from its floor to MAX_BLOCK (each new best widens its range by RADIUS)."""
        if self.kind in ("option", "new_cap") or self.kind in CATEGORICAL:
            return self.domain()
        values = {self.value} | {1 << i for i in range(MAX_BLOCK.bit_length()) if (1 << i) >= self.lo}
        return tuple(sorted(values))

    @property
    def grows_shared_memory(self) -> bool:
        """Shared memory grows with every tile side and with num_stages, not with warps, clusters
        (each CTA of a cluster holds a slice), cache hints or a dot's precision (the same tiles are
        loaded; the split into TF32 parts is made in registers)."""
        return self.kind not in ("option", *CATEGORICAL) or self.param == "num_stages"

    def check(self, value: Any) -> None:
        """Raise KnobError unless ``value`` is one this knob can be set to."""
        if self.kind in CATEGORICAL:
            if value not in CATEGORICAL[self.kind]:
                raise KnobError(f"{self.label}: {value!r} is not one of {', '.join(map(repr, CATEGORICAL[self.kind]))}")
        elif value is None:
            if self.kind != "new_cap":
                raise KnobError(f"{self.label}: only an introduced cap can be None")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KnobError(f"{self.label}: {value!r} is not a positive integer")

    def render(self, value: int | str | None) -> str:
        if self.kind == "new_cap":
            return self.expr if value is None else f"min({self.expr}, {value})"
        if self.kind in CATEGORICAL:
            return f'"{value}"' if self.present else f', {EVICTION}="{value}"'
        return str(value) if self.present else f", {self.param}={value}"


@dataclass(frozen=True)
class Analysis:
    knobs: tuple[Knob, ...]
    #: what was left alone and why, one sentence each
    notes: tuple[str, ...]
    #: why there is nothing to tune ("" when there are knobs)
    reason: str = ""

    def values(self) -> dict[str, int | str | None]:
        return {k.label: k.value for k in self.knobs}

    def knob(self, label: str) -> Knob:
        for k in self.knobs:
            if k.label == label:
                return k
        raise KnobError(f"no knob {label!r}; knobs: {', '.join(k.label for k in self.knobs) or 'none'}")


def clusters_in(env: Mapping[str, Any]) -> bool:
    """Whether the device an environment describes (``verifier.environment``) launches thread-block
    clusters: an NVIDIA GPU (CUDA, not ROCm) of compute capability 9.0 or above."""
    capability = str(env.get("capability") or "")
    return bool(env.get("cuda")) and capability.split(".")[0].isdigit() and int(capability.split(".")[0]) >= 9


def analyse(source: str, *, clusters: bool = False) -> Analysis:
    """Every knob of every launch in ``source``, with notes on what was left alone and why.

    ``clusters``: the target launches thread-block clusters (``clusters_in``), so num_ctas is a
    knob of launches of kernels that call tl.dot.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return Analysis((), (), f"nothing to tune: the source does not parse ({err.msg}, line {err.lineno})")
    finder = _Finder(tree, source, clusters=clusters)
    knobs, notes = finder.run()
    if knobs:
        return Analysis(knobs, notes)
    if not finder.kernels:
        why = "no @triton.jit kernel in the source"
    elif not finder.launches:
        why = "no launch kernel[grid](...) of its @triton.jit kernels"
    else:
        why = "no @triton.jit kernel launch with literal constexpr block sizes or launch options"
    return Analysis((), notes, "nothing to tune: " + why + (": " + "; ".join(notes) if notes else ""))


def rewrite(source: str, analysis: Analysis, assignment: Mapping[str, int | str | None]) -> str:
    """``source`` with the knobs named in ``assignment`` set; every other byte is kept.

    A knob set to its current value is not touched (an absent launch option set to its default,
    an absent eviction hint set to "", or a new cap set to None, stays absent). ``analysis`` must
    come from this very source.
    """
    texts = {}
    for label, value in assignment.items():
        knob = analysis.knob(label)
        knob.check(value)
        if value != knob.value:
            texts[label] = knob.render(value)
    return _apply(source, analysis, texts)


def template_key(source: str, analysis: Analysis) -> str:
    """The same for every source that differs from this one only in knob values or comments."""
    # Holes are named by knob, not by position: a launch option inserted by an earlier rewrite
    # can stand in another place in the text without making a different family.
    texts = {}
    for knob in analysis.knobs:
        hole = "__knob_" + re.sub(r"\W", "_", knob.label) + "__"
        if knob.kind == "new_cap":
            texts[knob.label] = f"min({knob.expr}, {hole})"
        elif knob.kind in CATEGORICAL:
            texts[knob.label] = hole if knob.present else f", {EVICTION}={hole}"
        else:
            texts[knob.label] = knob.render(hole)
    rendered = _apply(source, analysis, texts)
    # Launch options and eviction hints are dropped from the template altogether: whether one was
    # written out, and in which order, is part of the configuration, not of the family.
    rendered = _OPTION_HOLE.sub("", rendered)
    return code_hash(rendered) + ":" + ",".join(sorted(k.label for k in analysis.knobs))


_OPTION_HOLE = re.compile(r",?\s*\b(?:num_warps|num_stages|num_ctas|eviction_policy)\s*=\s*__knob_\w+?__")


def _apply(source: str, analysis: Analysis, texts: Mapping[str, str]) -> str:
    data = source.encode("utf-8", "surrogatepass")
    edits = []
    for label, text in texts.items():
        knob = analysis.knob(label)
        current = data[knob.start:knob.end].decode("utf-8", "surrogatepass")
        if knob.kind == "new_cap":
            ok = current == knob.expr
        else:
            ok = not knob.present or _literal(current) == knob.value
        if not ok:
            raise KnobError(f"{label}: the source at line {knob.line} is not what was analysed ({current!r})")
        edits.append((knob.start, analysis.knobs.index(knob), knob.end, text.encode()))
    # Apply from the end so earlier offsets stay valid; at one insertion point the first
    # knob's text must come first, so it is applied last.
    for start, _, end, text in sorted(edits, reverse=True):
        data = data[:start] + text + data[end:]
    return data.decode("utf-8", "surrogatepass")


def _literal(text: str):
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None


def _int(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else node.attr
    return ""


@dataclass
class _Kernel:
    name: str
    params: list[str]
    constexprs: set[str]
    autotuned: bool
    heuristic: set[str]
    has_dot: bool
    has_loop: bool  # a loop that loads: something for num_stages to pipeline
    loop_steps_only: set[str]  # constexprs used only as a range step and inside those loops


def _scan_kernel(fn: ast.FunctionDef) -> _Kernel | None:
    decorators = [_dotted(d) for d in fn.decorator_list]
    if not any(d.split(".")[-1] == "jit" for d in decorators):
        return None
    heuristic: set[str] = set()
    for d in fn.decorator_list:
        if _dotted(d).split(".")[-1] == "heuristics" and isinstance(d, ast.Call) and d.args:
            if isinstance(d.args[0], ast.Dict):
                heuristic |= {k.value for k in d.args[0].keys if isinstance(k, ast.Constant)}
    args = fn.args.posonlyargs + fn.args.args
    constexprs = set()
    for a in args + fn.args.kwonlyargs:
        ann = a.annotation
        if ann is not None and ("constexpr" in _dotted(ann) or (isinstance(ann, ast.Constant) and "constexpr" in str(ann.value))):
            constexprs.add(a.arg)
    nodes = list(ast.walk(fn))
    calls = {_dotted(n).split(".")[-1] for n in nodes if isinstance(n, ast.Call)}
    loops = [n for n in nodes if isinstance(n, (ast.For, ast.While))]
    # num_stages pipelines the loads of a loop; a loop that loads nothing has nothing to overlap.
    loads = any(isinstance(n, ast.Call) and _dotted(n).split(".")[-1] == "load"
                for loop in loops for n in ast.walk(loop))
    # A parameter used only as the step of range loops (and inside them) can be capped: the
    # loop already walks any extent in steps of any size.
    inside: dict[str, set[int]] = {}
    for loop in loops:
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and len(loop.iter.args) == 3:
            step = loop.iter.args[2]
            if isinstance(step, ast.Name) and step.id in constexprs:
                inside.setdefault(step.id, set()).update(id(n) for n in ast.walk(loop))
    steps_only = {name for name, ids in inside.items()
                  if all(id(n) in ids for n in nodes if isinstance(n, ast.Name) and n.id == name)}
    return _Kernel(fn.name, [a.arg for a in args], constexprs,
                   any(d.split(".")[-1] == "autotune" for d in decorators), heuristic,
                   "dot" in calls, loads, steps_only)


def _scope_nodes(body: list[ast.stmt]):
    """Nodes of one scope: nested functions, lambdas and classes are not entered."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _bindings(body: list[ast.stmt], params: list[str]) -> dict[str, list[ast.AST | None]]:
    """name -> the value expression of each binding (None where it is not a plain assignment)."""
    out: dict[str, list[ast.AST | None]] = {p: [None] for p in params}

    def bind(target: ast.AST, value: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            out.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            same = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for i, elt in enumerate(target.elts):
                bind(elt, value.elts[i] if same else None)
        else:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    out.setdefault(n.id, []).append(None)

    for node in _scope_nodes(body):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                bind(t, node.value)
        elif isinstance(node, ast.AnnAssign):
            bind(node.target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            bind(node.target, None)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(node.name, []).append(None)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                out.setdefault(name, []).append(None)
    return out


@dataclass(frozen=True)
class _Scope:
    name: str  # the function's name, "" for the module
    bindings: dict[str, list[ast.AST | None]]
    params: frozenset[str]


@dataclass(frozen=True)
class _Site:
    node: ast.Constant  # the integer literal to edit
    kind: str  # literal, local, constant, cap
    where: str
    lo: int = 1


class _Finder:
    """Walks one module: its kernels, their launches and the knobs of each launch and load."""

    def __init__(self, tree: ast.Module, source: str, *, clusters: bool = False) -> None:
        self.data = source.encode("utf-8", "surrogatepass")
        self.clusters = clusters
        self.starts = [0]
        while (i := self.data.find(b"\n", self.starts[-1])) >= 0:
            self.starts.append(i + 1)
        self.kernels: dict[str, _Kernel] = {}
        self.defs: dict[str, ast.FunctionDef] = {}  # every @triton.jit function: kernels and helpers
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (kernel := _scan_kernel(node)):
                self.kernels[node.name] = kernel
                self.defs[node.name] = node
        self.load_names = _language_names(tree, "load")
        self.dot_names = _language_names(tree, "dot")
        # Names a function declares global can be reassigned out of sight of the module body.
        self.globals = {name for n in ast.walk(tree) if isinstance(n, ast.Global) for name in n.names}
        self.launches: list[tuple[ast.Call, _Kernel, list[_Scope]]] = []
        self._collect(tree.body, [_Scope("", _bindings(tree.body, []), frozenset())])

    def _collect(self, body: list[ast.stmt], scopes: list[_Scope]) -> None:
        for node in _scope_nodes(body):
            if isinstance(node, ast.ClassDef):
                self._collect(node.body, scopes)  # a class body is no scope for its methods
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in self.kernels:
                a = node.args
                params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                params += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                scope = _Scope(node.name, _bindings(node.body, params), frozenset(params))
                self._collect(node.body, [scope, *scopes])
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in self.kernels):
                self.launches.append((node, self.kernels[node.func.value.id], scopes))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def text(self, node: ast.AST) -> str:
        start = self.offset(node.lineno, node.col_offset)
        return self.data[start:self.offset(node.end_lineno, node.end_col_offset)].decode("utf-8", "surrogatepass")

    def run(self) -> tuple[tuple[Knob, ...], tuple[str, ...]]:
        knobs: list[Knob] = []
        notes: list[str] = []
        found = [item for call, kernel, scopes in self.launches for item in self._launch(call, kernel, scopes)]
        for item in found + list(self._in_kernels()):
            if isinstance(item, str):
                notes.append(item)
            elif all(_site(k) != _site(item) for k in knobs):
                knobs.append(item)  # one knob per edit site, however many launches it feeds
        knobs.sort(key=lambda k: (k.start, OPTIONS.index(k.param) if k.kind == "option" else -1))
        return _labelled(knobs), tuple(dict.fromkeys(notes))

    def _resolve(self, expr: ast.AST, scopes: list[_Scope], depth: int = 0) -> _Site | str:
        if _int(expr) is not None:
            return _Site(expr, "literal", f"line {expr.lineno}")
        if isinstance(expr, ast.Call) and "constexpr" in _dotted(expr.func) and len(expr.args) == 1 \
                and _int(expr.args[0]) is not None:
            return _Site(expr.args[0], "literal", f"line {expr.lineno}")
        if isinstance(expr, ast.Call) and _dotted(expr.func) == "min" and len(expr.args) == 2 and not expr.keywords:
            caps = [a for a in expr.args if _int(a) is not None]
            if len(caps) == 1:
                other = expr.args[1 - expr.args.index(caps[0])]
                # A floor max(16, ...) inside the cap is a minimum the kernel needs (tl.dot).
                floor = 1
                if isinstance(other, ast.Call) and _dotted(other.func) == "max":
                    floor = max([_int(a) for a in other.args if _int(a) is not None] or [1])
                return _Site(caps[0], "cap", f"the cap of `{self.text(expr)}`, line {expr.lineno}", floor)
        if isinstance(expr, ast.Name) and depth < 4:
            for i, scope in enumerate(scopes):
                values = scope.bindings.get(expr.id)
                if values is None:
                    continue
                if expr.id in scope.params:
                    return f"comes from the caller (`{expr.id}` is a parameter of `{scope.name}`)"
                if len(values) != 1 or values[0] is None or (not scope.name and expr.id in self.globals):
                    return f"`{expr.id}` is assigned more than once or not by a plain assignment"
                site = self._resolve(values[0], scopes[i:], depth + 1)
                if isinstance(site, _Site) and site.kind == "literal":
                    kind = "local" if scope.name else "constant"
                    return _Site(site.node, kind, f"`{expr.id}` = {site.node.value}, line {site.node.lineno}")
                return site
            return f"`{expr.id}` is not bound in this module"
        return f"is computed at run time (`{self.text(expr)}`)"

    def _grid(self, call: ast.Call, scopes: list[_Scope]) -> tuple[set[int], set[str]]:
        """Integer literals and names in the grid expression (one assignment deep)."""
        nodes = [call.func.slice]
        if isinstance(call.func.slice, ast.Name):
            for scope in scopes:
                if call.func.slice.id in scope.bindings:
                    nodes += [v for v in scope.bindings[call.func.slice.id] if v is not None]
                    break
        walked = [n for root in nodes for n in ast.walk(root)]
        return {_int(n) for n in walked if _int(n) is not None}, {n.id for n in walked if isinstance(n, ast.Name)}

    def _launch(self, call: ast.Call, kernel: _Kernel, scopes: list[_Scope]):
        name, line = kernel.name, call.lineno
        if kernel.autotuned:
            yield f"{name} (launch at line {line}) is under @triton.autotune, which tunes it; left alone"
            return
        pairs = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                break
            if i < len(kernel.params):
                pairs.append((kernel.params[i], arg))
        pairs += [(k.arg, k.value) for k in call.keywords if k.arg is not None]
        grid_ints, grid_names = self._grid(call, scopes)
        clusters = self.clusters and kernel.has_dot
        for param, expr in pairs:
            if param == "num_ctas" and not clusters:
                yield f"{name}: num_ctas of the launch at line {line} {self._no_clusters()}; left alone"
                continue
            if param in OPTIONS:
                site = self._resolve(expr, scopes)
                if isinstance(site, str) or site.kind == "cap":
                    why = site if isinstance(site, str) else f"is {site.where}"
                    yield f"{name}: {param} {why}; left alone"
                else:
                    yield self._knob(kernel, param, "option", site, f"{param} of the launch at line {line}")
                continue
            if param not in kernel.constexprs:
                continue
            site = self._resolve(expr, scopes)
            if not TILING_NAME.match(param):
                if isinstance(site, _Site):
                    yield (f"{name}: {param}={site.node.value} is not named like a tiling parameter "
                           f"(it may be part of what the kernel computes); left alone")
                continue
            if param in kernel.heuristic:
                yield f"{name}: {param} is set by @triton.heuristics; left alone"
                continue
            if isinstance(site, str):
                names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
                if param in kernel.loop_steps_only and not names & grid_names:
                    start = self.offset(expr.lineno, expr.col_offset)
                    yield Knob("", name, param, "new_cap", None, expr.lineno,
                               f"a cap on {param} of the launch at line {line}", start,
                               self.offset(expr.end_lineno, expr.end_col_offset), expr=self.text(expr),
                               lo=DOT_MIN if kernel.has_dot else 1)
                else:
                    yield (f"{name}: {param} {site} and the kernel does not only step through a loop "
                           f"with it, so another value could change the result; left alone")
                continue
            value = site.node.value
            if value < 1 or value in grid_ints:
                why = "is not positive" if value < 1 else "also appears in the grid, which may depend on it"
                yield f"{name}: {param}={value} ({site.where}) {why}; left alone"
                continue
            is_tile = re.search("BLOCK|TILE", param, re.IGNORECASE) is not None
            lo = min(value, max(site.lo, DOT_MIN if kernel.has_dot and is_tile else 1))
            yield self._knob(kernel, param, site.kind, site, f"{param} of the launch at line {line}", lo)
        given = {p for p, _ in pairs}
        splat = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
        args = call.args + [k.value for k in call.keywords]
        for option in OPTIONS:
            if option in given:
                continue
            if option == "num_ctas" and not clusters:
                if self.clusters:
                    yield f"{name}: {self._no_clusters()}; num_ctas not added"
                continue
            if splat or not args:
                yield f"{name}: the launch at line {line} passes *args/**kwargs or nothing; {option} not added"
            elif option == "num_stages" and not kernel.has_loop:
                yield f"{name}: no loop that loads, so num_stages would change nothing; not added"
            else:
                last = max(args, key=lambda a: (a.end_lineno, a.end_col_offset))
                at = self.offset(last.end_lineno, last.end_col_offset)
                yield Knob("", name, option, "option", OPTION_DEFAULTS[option], last.end_lineno,
                           f"{option} added to the launch at line {line}", at, at, present=False)

    def _no_clusters(self) -> str:
        if self.clusters:
            return "has no tl.dot: Triton reduces only within one CTA, so a cluster has nothing to share"
        return "needs thread-block clusters (an NVIDIA GPU of compute capability 9.0+), which this target lacks"

    def _in_kernels(self):
        """The eviction hint of every tl.load and the precision of every tl.dot in a launched kernel
        or a @triton.jit function it calls."""
        stack = [kernel.name for _, kernel, _ in self.launches if not kernel.autotuned]
        reached: set[str] = set()
        while stack:
            name = stack.pop()
            if name not in reached:
                reached.add(name)
                stack += [n.func.id for n in ast.walk(self.defs[name])
                          if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in self.defs]
        for name in reached:
            for node in ast.walk(self.defs[name]):
                if isinstance(node, ast.Call) and _dotted(node.func) in self.load_names:
                    yield self._eviction(name, node)
                elif isinstance(node, ast.Call) and _dotted(node.func) in self.dot_names:
                    yield from self._precision(name, node)

    def _precision(self, function: str, call: ast.Call):
        """The input_precision of one tl.dot, where it is written as one of PRECISION_DOMAIN."""
        node = next((k.value for k in call.keywords if k.arg == PRECISION), None)
        if node is None:
            return
        line = call.lineno
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRECISION_DOMAIN):
            yield (f"{function}: input_precision `{self.text(node)}` of the tl.dot at line {line} is not one of "
                   f"{', '.join(map(repr, PRECISION_DOMAIN))}; left alone")
            return
        operand = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "input"), None)
        names = [n for n in ast.walk(operand) if isinstance(n, ast.Name)] if operand is not None else []
        first = min(names, key=lambda n: (n.lineno, n.col_offset)).id if names else "dot"
        yield Knob("", function, f"{first}.{PRECISION}", "precision", node.value, line,
                   f"input_precision of the tl.dot at line {line} in {function}",
                   self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def _eviction(self, function: str, call: ast.Call) -> Knob | str:
        line = call.lineno
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return f"{function}: the tl.load at line {line} passes *args/**kwargs; its eviction_policy left alone"
        if len(call.args) > EVICTION_POSITION:
            return f"{function}: the tl.load at line {line} may give eviction_policy by position; left alone"
        volatile = keywords.get("volatile")
        if volatile is not None and not (isinstance(volatile, ast.Constant) and volatile.value is False):
            return f"{function}: the tl.load at line {line} is volatile; its eviction_policy left alone"
        pointer = call.args[0] if call.args else keywords.get("pointer")
        names = [n for n in ast.walk(pointer) if isinstance(n, ast.Name)] if pointer is not None else []
        first = min(names, key=lambda n: (n.lineno, n.col_offset)).id if names else "load"
        param, where = f"{first}.{EVICTION}", f"eviction_policy of the tl.load at line {line} in {function}"
        if EVICTION in keywords:
            node = keywords[EVICTION]
            if not (isinstance(node, ast.Constant) and node.value in EVICTION_DOMAIN and isinstance(node.value, str)):
                return (f"{function}: eviction_policy `{self.text(node)}` of the tl.load at line {line} is not one of "
                        f"{', '.join(map(repr, EVICTION_DOMAIN))}; left alone")
            return Knob("", function, param, "eviction", node.value, line, where,
                        self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))
        args = call.args + [k.value for k in call.keywords]
        if not args:
            return f"{function}: the tl.load at line {line} has no arguments; left alone"
        last = max(args, key=lambda a: (a.end_lineno, a.end_col_offset))
        at = self.offset(last.end_lineno, last.end_col_offset)
        return Knob("", function, param, "eviction", "", line, where, at, at, present=False)

    def _knob(self, kernel: _Kernel, param: str, kind: str, site: _Site, where: str, lo: int = 1) -> Knob:
        node = site.node
        if kind in ("local", "constant", "cap"):
            where = f"{where}, via {site.where}"
        return Knob("", kernel.name, param, kind, node.value, node.lineno, where,
                    self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset),
                    lo=lo)


def _language_names(tree: ast.Module, function: str) -> set[str]:
    """How this module spells ``triton.language.<function>`` (tl.load, tl.dot, ...)."""
    names = {f"tl.{function}", f"triton.language.{function}"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {f"{a.asname}.{function}" for a in node.names if a.name == "triton.language" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "triton":
            names |= {f"{a.asname or a.name}.{function}" for a in node.names if a.name == "language"}
        elif isinstance(node, ast.ImportFrom) and node.module == "triton.language":
            names |= {a.asname or a.name for a in node.names if a.name == function}
    return names


def _site(knob: Knob) -> tuple:
    # Absent launch options share their insertion point: they differ by name.
    return knob.start, knob.end, knob.present or knob.param


def _labelled(knobs: list[Knob]) -> tuple[Knob, ...]:
    """Short unique labels: the parameter, else kernel.parameter, else parameter@line (kernel.
    parameter@line where two kernels share the line number; .N after it, from 1, for two loads of
    one pointer on one line)."""
    def count(f):
        return {key: sum(f(o) == key for o in knobs) for key in map(f, knobs)}
    by_param = count(lambda k: k.param)
    by_kernel = count(lambda k: (k.kernel, k.param))
    by_param_line = count(lambda k: (k.param, k.line))
    by_line = count(lambda k: (k.kernel, k.param, k.line))
    seen: dict[tuple, int] = {}
    out = []
    for k in knobs:
        if by_param[k.param] == 1:
            label = k.param
        elif by_kernel[(k.kernel, k.param)] == 1:
            label = f"{k.kernel}.{k.param}"
        else:
            key = (k.kernel, k.param, k.line)
            # the kernel's name only where it tells apart two knobs of one parameter on one line number
            label = f"{k.param}@{k.line}"
            if by_param_line[key[1:]] != by_line[key]:
                label = f"{k.kernel}.{label}"
            if by_line[key] > 1:
                seen[key] = n = seen.get(key, 0) + 1
                label += f".{n}"
        out.append(Knob(label, *[getattr(k, f) for f in Knob.__dataclass_fields__ if f != "label"]))
    return tuple(out)
