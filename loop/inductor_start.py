"""A starting candidate for any task, offline: TorchInductor's own Triton kernels as a ``ModelNew``.

``derive(task, device_kind)`` captures Inductor's wrapper for the reference twice (``inductor_code``,
in one child process: the capture imports the reference and resets Dynamo; both captures within
its one ``CAPTURE_TIMEOUT_S``): with every size dynamic, which any shape can run, hidden ones
included, and with static sizes at the timed public shape, which is what ``torch.compile``
itself runs there and much faster on reductions (its reduction strategy and block sizes chosen
knowing the sizes). Each is rewritten by the same translator (``translate``), the static one's
kernels prefixed ``static_``, into one standalone candidate whose ``forward`` takes the static
path at exactly those sizes and the dynamic one elsewhere (``inductor_paths``: why, and how the
sizes are compared). Where the static capture fails or is not all Triton, the start is the
dynamic path alone and its description says why; where the dynamic one fails there is no start.
The candidate has the usual three layers:

* the ``@triton.jit`` kernels as Inductor wrote them, less the ``triton_heuristics`` decorator (its
  autotuner needs a driver and is Inductor's runtime, not the kernel);
* one launcher per kernel that picks its block sizes and grid: ``XBLOCK`` (and ``YBLOCK``...) are
  literals the offline tuner can move; a persistent reduction (``triton_per_*``: no loop over the
  reduced axis) gets ``R0_BLOCK = next_power_of_2(r0_numel)``, which it needs to see a whole row;
  a looped one a fixed ``R0_BLOCK``;
* where the wrapper calls an ATen GEMM (``extern_kernels.mm / addmm / bmm / baddbmm``: Inductor
  writes no Triton for a plain matmul unless it autotunes on a GPU), kernforge's own Triton GEMM
  (``inductor_gemm``) and its launcher, whose tile sizes the offline tuner moves as it moves XBLOCK;
* ``ModelNew.__init__``: where the reference holds parameters or buffers, the reference's own
  (``inductor_init``: the judge seeds both constructions alike, so it draws the same weights, with
  the same names); else one that takes any arguments and holds nothing;
* ``ModelNew.forward``: its inputs, then its own parameters and buffers by name in the capture's
  order, bound to the wrapper's arguments; then, on each path, the body of Inductor's
  ``call(args)``, statement by statement: size arithmetic is kept (``.size()`` of an argument
  too), ``empty_strided_*`` becomes ``torch.empty_strided`` on the inputs' device,
  ``reinterpret_tensor`` ``torch.as_strided``, ``kernel.run(...)`` the launcher, a GEMM call
  ``_launch_kf_gemm``. Guards
  (``assert_size_stride``), streams and ``del`` go. Anything else (``extern_kernels.convolution``,
  another ATen fallback, a C++ kernel) means Inductor did not write this reference in Triton:
  there is no Inductor start, and ``NoStart`` says which call was in the way; so too where the
  reference's ``__init__`` reads a name of its problem file that the candidate would not have.

The output code itself is what a prompt shows as "what torch.compile does: beat it": the LLM
proposer captures it with ``output_code_async`` (on a public shape only, in a child process it can
kill) and shows its ``listing``: the Triton kernels and ``call``, not Inductor's imports, autotuning
decorators or benchmark harness (whose literal sizes are the example shape's).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncContextManager, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from kernforge.tasks.spec import Task

from . import inductor_gemm, inductor_paths
from .inductor_init import Methods, NoInit, model_methods
from .inductor_paths import NotStatic, StaticCode

if TYPE_CHECKING:
    from .inductor_code import Captured

#: Launch block sizes by kernel axis; the offline tuner moves them from here.
BLOCKS = {"cpu": {"X": 1024, "Y": 32, "Z": 16, "R": 64, "XR": 8},
          # XO, RO: an outer reduction's (OUTER_HINT), as Inductor's outer config launches it
          "cuda": {"X": 1024, "Y": 32, "Z": 16, "R": 512, "XR": 1, "XO": 64, "RO": 8}}
CAPTURE_TIMEOUT_S = 300
#: how a capture on a GPU starts its child and keeps it while it runs (the run's ``Devices.gpu_child``:
#: started with every gate held shared, then stopped by any judge about to time); given the
#: coroutine function that starts the child, it yields the child
GpuHold = Callable[[Callable[[], Awaitable[Any]]], AsyncContextManager[Any]]


@dataclass(frozen=True)
class Start:
    """A candidate derived from Inductor's kernels, and the output code it came from."""

    source: str
    kernels: tuple[str, ...]
    #: Inductor's output code with dynamic sizes (the path every shape can take)
    output_code: str
    description: str
    #: Inductor's output code with static sizes at the timed shape; "" where the start has no static path
    static_output_code: str = ""
    #: (input, dimension, size) its dynamic code holds as literals (inductor_code.Captured.fixed)
    fixed: tuple[tuple[int, int, int], ...] = ()
    #: the shape its static path is taken at; None without one
    static_shape: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NoStart:
    """Why Inductor gives no start for this task (said to the user as it is)."""

    reason: str


def derive(task: Task, device_kind: str = "cpu", *, timeout_s: float = CAPTURE_TIMEOUT_S) -> Start | NoStart:
    """The Inductor start for ``task`` (see the module docstring); blocking, seconds."""
    return asyncio.run(derive_async(task, device_kind, timeout_s=timeout_s))


async def derive_async(task: Task, device_kind: str = "cpu", *, timeout_s: float = CAPTURE_TIMEOUT_S,
                       hold: GpuHold | None = None) -> Start | NoStart:
    """``derive`` without blocking the event loop, in a child process that is killed if this is
    cancelled: a run that stops does not wait for a capture (a thread running ``derive`` would
    hold the run's exit until its child ended, minutes at KernelBench's sizes). ``hold``: held
    around the child on a GPU, so that its allocations and fills never fall in a timed window. A
    child that could not start (OSError), or a reply or wrapper that could not be read (ValueError,
    SyntaxError), is a start that is not there, said as the reason: never the end of a run."""
    return checked(task, device_kind, await captured_async(task, device_kind, timeout_s=timeout_s, hold=hold))


async def captured_async(task: Task, device_kind: str = "cpu", *, timeout_s: float = CAPTURE_TIMEOUT_S,
                         hold: GpuHold | None = None) -> Start | NoStart:
    """``derive_async`` before ``checked``: the start as Inductor's code gives it."""
    try:
        reply = await _child_reply(_child_command(task, device_kind), timeout_s, hold)
        if isinstance(reply, NoStart):
            return reply
        return _from_child(reply, "", device_kind, task.reference_path.read_text())
    except (OSError, ValueError, SyntaxError) as error:
        return NoStart(f"{type(error).__name__}: {error}")


def checked(task: Task, device_kind: str, start: Start | NoStart) -> Start | NoStart:
    """``start``, or NoStart where its dynamic code holds a size that one of the task's shapes
    varies (``inductor_paths.varied_fixed_size``): its verdict would be a rejection there."""
    if not isinstance(start, Start):
        return start
    why = inductor_paths.varied_fixed_size(task, device_kind, start.fixed, start.static_shape)
    return start if why is None else NoStart(why)


async def output_code_async(task: Task, device_kind: str = "cpu", *, timeout_s: float = CAPTURE_TIMEOUT_S,
                            hold: GpuHold | None = None) -> str | NoStart:
    """Inductor's output code for ``task``'s reference, for a prompt to show: generated on a public
    shape only (``inductor_code.example_shape``), in a child process that is killed if this is
    cancelled (a run stopped by Ctrl-C does not wait for a capture)."""
    reply = await _child_reply(_child_command(task, device_kind, public_only=True), timeout_s, hold)
    if isinstance(reply, NoStart):
        return reply
    return NoStart(reply["error"]) if "error" in reply else reply["wrapper"]


async def _child_reply(command: list[str], timeout_s: float, hold: GpuHold | None = None) -> dict | NoStart:
    """The capture child's JSON reply, or why there is none; the child is killed on a timeout or
    when the caller is cancelled. It is started and kept by ``hold`` where one is given."""
    with tempfile.TemporaryDirectory(prefix="kernforge-inductor-") as tmp:
        async def start() -> asyncio.subprocess.Process:
            return await asyncio.create_subprocess_exec(*command, env=_child_env(tmp), stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)

        async with (hold or _started)(start) as child:
            return await _child_answer(child, timeout_s)


@contextlib.asynccontextmanager
async def _started(start: Callable[[], Awaitable[Any]]) -> AsyncIterator[Any]:
    """``GpuHold`` where there is nothing to hold (a CPU run): the child, started."""
    yield await start()


async def _child_answer(child: asyncio.subprocess.Process, timeout_s: float) -> dict | NoStart:
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
    except asyncio.TimeoutError:
        return NoStart(_too_long(timeout_s))
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    reply, problem = _reply(out.decode(errors="replace"), err.decode(errors="replace"), child.returncode)
    return NoStart(problem) if reply is None else reply


# ---- the child process ---------------------------------------------------------------------------
def _child_command(task: Task, device_kind: str, *, public_only: bool = False) -> list[str]:
    # a task folder (built-in or not) is passed as the folder: its meta.py holds the shapes to compile on
    path = task.reference_path
    ref = str(path.parent if path.name == "reference.py" else path)
    return [sys.executable, "-m", "kernforge.loop.inductor_start", ref, device_kind, *(["public"] if public_only else [])]


def _child_env(tmp: str) -> dict[str, str]:
    # Inductor's kernels compiled in the child itself: a pool of compile processes takes longer to
    # start than a capture's handful of kernels take to compile (23_Softmax on this project's
    # 2-core CI machine: 16 s with the pool, 6.7 s without, the same code captured)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"), TRITON_CACHE_DIR=str(Path(tmp) / "triton"),
               TORCHINDUCTOR_COMPILE_THREADS="1")
    env.pop("TRITON_INTERPRET", None)
    return env


def _too_long(timeout_s: float) -> str:
    return f"capturing Inductor's code took more than {timeout_s:.0f} s"


def _reply(stdout: str, stderr: str, returncode: int | None) -> tuple[dict | None, str]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the Inductor capture exited with status {returncode}: {tail[:300]}"
    return json.loads(lines[-1]), ""


def _from_child(reply: dict | None, problem: str, device_kind: str, reference_source: str = "") -> Start | NoStart:
    if reply is None:
        return NoStart(problem)
    if "error" in reply:
        return NoStart(reply["error"])
    state = tuple(tuple(s) for s in reply.get("state", ()))
    try:
        methods = model_methods(reference_source) if state else None
    except (NoInit, SyntaxError) as why:
        return NoStart(f"ModelNew cannot draw the reference's weights as Model does: {why}")
    bindings = [tuple(b) for b in reply["bindings"]]
    fixed = tuple(tuple(int(v) for v in f) for f in reply.get("fixed", ()))
    static, why_not = inductor_paths.static_code(reply.get("static"))
    if static is not None:  # a failure here is the dynamic code's too, or the static code's alone
        try:
            source, kernels = translate(reply["wrapper"], bindings, reply["n_inputs"], device_kind,
                                        state=state, methods=methods, static=static, fixed=fixed)
            description = inductor_paths.description(kernels, static.shape)
            return Start(source, kernels, reply["wrapper"], description, static.wrapper, fixed, static.shape)
        except (Untranslatable, NotStatic) as why:
            why_not = f"its static code is not all Triton or cannot be told apart: {why}"
    try:
        source, kernels = translate(reply["wrapper"], bindings, reply["n_inputs"], device_kind,
                                    state=state, methods=methods, fixed=fixed)
    except Untranslatable as why:
        return NoStart(f"Inductor's code for this reference is not all Triton: {why}")
    return Start(source, kernels, reply["wrapper"], inductor_paths.description(kernels, None, why_not), fixed=fixed)


def _child_main(ref: str, device_kind: str, public_only: bool = False) -> None:
    from kernforge.tasks.loader import load_task

    from .inductor_code import NoInductorCode, capture

    task = load_task(ref)
    try:
        captured = capture(task, device_kind, public_only=True) if public_only else _dynamic_capture(task, device_kind)
    except NoInductorCode as why:
        print(json.dumps({"error": str(why)}))
        return
    reply = {"wrapper": captured.wrapper, "bindings": captured.bindings, "n_inputs": captured.n_inputs,
             "state": captured.state, "shape": captured.shape.as_dict(), "fixed": captured.fixed}
    if not public_only:  # the start: also the static code for the timed shape, in this same child
        reply["static"] = _static_reply(task, device_kind)
    print(json.dumps(reply))


#: example shapes a start's dynamic capture is tried on, at most (each is a whole Inductor compile)
CAPTURE_SHAPES = 2


def _dynamic_capture(task: Task, device_kind: str) -> Captured:
    """The start's dynamic capture: on ``example_shape``; where Dynamo specialised a size there
    that another of the task's shapes varies (its code would be refused there: ``checked``) only
    because a size came out as 0 or 1 (``zero_one_only``), on the next example shape
    (``CAPTURE_SHAPES`` in all); the first capture where none does better. On the H100,
    42_Max_Pooling_2D's smallest shape (height 2: a 4-wide pooling of it is one row high) fixed
    the height at 2 and the problem had no start; its next shape keeps the height a symbol. A
    size fixed by a branch on its value (``if x.shape[-1] == 64``) is not tried elsewhere: the
    other shape's code would hold only where the size is not that value."""
    from .inductor_code import capture, example_shapes, timed_shape

    timed = timed_shape(task, device_kind).as_dict()
    shapes = example_shapes(task, device_kind)[:CAPTURE_SHAPES]
    first = capture(task, device_kind, shape=shapes[0])
    if inductor_paths.varied_fixed_size(task, device_kind, first.fixed, timed) is None or not zero_one_only(first.guards):
        return first
    for shape in shapes[1:]:
        captured = capture(task, device_kind, shape=shape)
        if inductor_paths.varied_fixed_size(task, device_kind, captured.fixed, timed) is None:
            return captured
    return first


def zero_one_only(guards: Sequence[str]) -> bool:
    """Every equality among Dynamo's guards on a capture's sizes sets a size expression to 0 or 1
    (its specialisation of sizes 0 and 1, say ``Eq(s18 - 1, 1)``: a pooled height of one row),
    and there is at least one; none sets one to another value (a branch on a size, ``Eq(s18, 64)``)."""
    equal = [g for g in guards if g.startswith("Eq(")]
    return bool(equal) and all(re.fullmatch(r"Eq\((.+, [01]|[01], .+)\)", g) for g in equal)


def _static_reply(task: Task, device_kind: str) -> dict:
    """The static capture at the timed shape, or its error: the dynamic capture has succeeded, and
    a start still stands on it alone, so any failure here is a reason to say, not a crash."""
    from .inductor_code import NoInductorCode, capture

    try:
        captured = capture(task, device_kind, static=True)
    except NoInductorCode as why:
        return {"error": str(why)}
    except Exception as why:  # a reference that compiles dynamically but not statically: said in the description
        return {"error": f"{type(why).__name__}: {str(why).strip()[:300]}"}
    return {"wrapper": captured.wrapper, "bindings": captured.bindings, "signature": captured.signature,
            "shape": captured.shape.as_dict()}


# ---- what a prompt shows -------------------------------------------------------------------------
@dataclass(frozen=True)
class Listing:
    """The part of Inductor's output code a prompt shows: its Triton kernels and ``call``."""

    text: str
    kernels: tuple[str, ...]
    #: lines of the whole output code the listing was taken from
    total_lines: int


def listing(output_code: str) -> Listing | None:
    """Inductor's Triton kernels as it wrote them, from ``@triton.jit`` on (its autotuning decorator
    goes: its size hints are the example shape's sizes), each under the comment naming the ops it
    fuses, then the ``call`` function that allocates buffers and launches them (an ATen fallback
    such as ``extern_kernels.mm`` shows there). None when there is no Triton kernel."""
    tree = ast.parse(output_code)
    lines = output_code.splitlines()
    parts: list[str] = []
    kernels: list[str] = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute) and ast.unparse(node.value.func.value) == "async_compile"):
            continue
        name = ast.unparse(node.targets[0])
        args = node.value.args
        text = args[1].value if len(args) > 1 and isinstance(args[1], ast.Constant) else None
        jitted = _jit_source(text) if node.value.func.attr == "triton" and isinstance(text, str) else None
        if jitted is None:
            parts.append(f"# {name}: a {node.value.func.attr} kernel (not shown)")
            continue
        kernels.append(name)
        parts.append("\n".join([*_fused_ops(lines, node.lineno), jitted[0].strip()]))
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"), None)
    if not kernels or call is None:
        return None
    parts.append(textwrap.dedent("\n".join(lines[call.lineno - 1:call.end_lineno])))
    return Listing("\n\n\n".join(parts), tuple(kernels), len(lines))


def _fused_ops(lines: list[str], lineno: int) -> list[str]:
    """Inductor's comment above a kernel that names the ops it fuses (``# Topologically Sorted ...``)."""
    for line in reversed(lines[max(0, lineno - 60):lineno - 1]):
        if not line.startswith("#"):
            break
        if line.startswith("# Topologically Sorted Source Nodes"):
            return [line]
    return []


# ---- the rewrite ---------------------------------------------------------------------------------
class Untranslatable(ValueError):
    """A statement of Inductor's wrapper that is not allocation, a view, size arithmetic or a Triton launch."""


_ALLOC = re.compile(r"^empty_strided_(cpu|cuda|xpu)$")
_DROP_CALLS = {"assert_size_stride", "assert_alignment", "get_raw_stream"}
_HEADER = '''"""Starting candidate: TorchInductor's Triton kernels for the reference, launched without Inductor.

Generated by kernforge (loop/inductor_start.py) from torch.compile's output code; the kernels are
Inductor's, the launchers and ModelNew are rewritten from its wrapper.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
'''


def translate(wrapper: str, bindings: Sequence[tuple[str, str]], n_inputs: int, device_kind: str = "cpu", *,
              state: Sequence[tuple[str, str]] = (), methods: Methods | None = None,
              static: StaticCode | None = None, fixed: Sequence[tuple[int, int, int]] = ()) -> tuple[str, tuple[str, ...]]:
    """The candidate module for Inductor's ``wrapper``, and its kernels' names (``_kf_gemm`` among
    them where an ATen GEMM was replaced). ``state``: the reference's parameters and buffers that
    follow the ``n_inputs`` forward inputs among the wrapper's arguments (``inductor_code.Captured``);
    ``methods``: the reference's ``__init__`` (and helpers) that make them, needed when there are any.
    ``static``: Inductor's code with static sizes, a second path taken at its sizes alone
    (``inductor_paths``); its kernels are prefixed ``static_``. ``fixed``: the sizes the dynamic
    code holds as literals (``Captured.fixed``): its path refuses a call where one differs. Raises
    ``NotStatic`` where its inputs cannot be compared with literals."""
    if state and methods is None:
        raise ValueError("a reference with parameters or buffers needs its methods to build them")
    paths = [_Path.of(wrapper, bindings)]
    if static is not None:
        # the dynamic path serves every shape but the timed one: its GEMMs compile once for them all
        paths[0] = replace(paths[0], body=[inductor_gemm.general(line) for line in paths[0].body])
        paths.insert(0, _Path.of(inductor_paths.renamed(static.wrapper), static.bindings))
    gemm = any(p.gemm for p in paths)
    parts = [_HEADER + "".join(f"{line}\n" for line in (methods.imports if methods else ()) if line not in _HEADER)]
    for path in paths:
        for name, (src, params) in path.kernels.items():
            parts.append(f"\n# ---- {name}: Inductor's kernel ----\n{src.strip()}\n")
            parts.append(_launcher(name, src, params, BLOCKS.get(device_kind, BLOCKS["cuda"])))
    if gemm:
        parts.append(inductor_gemm.source(device_kind))
    if static is not None:
        parts.append(inductor_paths.guard(static.signature))
    if fixed:
        parts.append(inductor_paths.fixed_check(fixed))
    parts.append(inductor_paths.model_new(paths[-1].body, paths[0].body if static is not None else None,
                                          n_inputs, state, methods, fixed=bool(fixed)))
    kernels = tuple(name for path in paths for name in path.kernels)
    return "\n".join(parts), kernels + (("_kf_gemm",) if gemm else ())


@dataclass(frozen=True)
class _Path:
    """One wrapper translated: its kernels (name -> source, parameters) and its ``call()`` body."""

    kernels: dict[str, tuple[str, list[str]]]
    body: list[str]
    gemm: bool

    @classmethod
    def of(cls, wrapper: str, bindings: Sequence[tuple[str, str]]) -> "_Path":
        tree = ast.parse(wrapper)
        kernels = _kernels(tree)
        call = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "call"), None)
        if call is None:
            raise Untranslatable("the wrapper has no call()")
        body = _forward_body(call.body, kernels, bindings)
        gemm = any(inductor_gemm.LAUNCHER + "(" in line for line in body)
        if not kernels and not gemm:
            raise Untranslatable("Inductor emitted no Triton kernel")
        return cls(kernels, body, gemm)


def _kernels(tree: ast.Module) -> dict[str, tuple[str, list[str]]]:
    """name -> (kernel source without Inductor's decorator and driver setup, parameter names).
    An outer reduction's source keeps Inductor's hint as a comment (``OUTER_HINT``): the launcher
    reads it."""
    out: dict[str, tuple[str, list[str]]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "async_compile"):
            continue
        name = node.targets[0].id if isinstance(node.targets[0], ast.Name) else "?"
        if func.attr != "triton":
            raise Untranslatable(f"{name} is a {func.attr} kernel, not Triton")
        jitted = _jit_source(node.value.args[1].value)
        if jitted is None:
            raise Untranslatable(f"{name} has no @triton.jit function")
        src, kernel = jitted
        hint = re.search(r"reduction_hint\s*=\s*ReductionHint\.(OUTER(?:_TINY)?)\b", node.value.args[1].value)
        if hint is not None:
            src = f"{OUTER_HINT if hint.group(1) == 'OUTER' else OUTER_TINY_HINT}\n{src}"
        out[name] = (_portable(src), [a.arg for a in kernel.args.args])
    return out


#: Inductor's hint that a reduction runs along a strided axis (its x axis is the contiguous one),
#: kept above the kernel's source: such a kernel is launched with many rows and a short block of
#: the reduced axis (Inductor's own outer config), so that each load of a block is coalesced.
OUTER_HINT = "# Inductor: ReductionHint.OUTER"
#: the same for a reduced axis of a few elements
OUTER_TINY_HINT = "# Inductor: ReductionHint.OUTER_TINY"
#: a persistent reduction's rows per program: Inductor's choices, at most this many elements in all
#: (its MAX_PERSISTENT_BLOCK_NUMEL)
PERSISTENT_ROWS = (1, 8, 32, 128)
PERSISTENT_NUMEL = 4096


def _hint(src: str) -> str | None:
    """The outer hint a kernel's source keeps on its first line (``_kernels``), or None."""
    first = src.split("\n", 1)[0]
    return first if first in (OUTER_HINT, OUTER_TINY_HINT) else None


def _persistent_rows(src: str) -> int | None:
    """XBLOCK of a persistent reduction along a strided axis, as Inductor's own heuristics give it
    without autotuning (``_persistent_reduction_configs``): the most rows of ``PERSISTENT_ROWS``
    whose elements stay within ``PERSISTENT_NUMEL``, or for a tiny reduced axis 2 * (256 // its
    block). None where the kernel has no outer hint or holds no literal block of the reduced axis
    (static code does). With one row per program, every load of 36_RMSNorm_'s reduced axis
    (64 elements, 256 KiB apart) was its own memory transaction: 0.12x torch.compile on the H100."""
    hint = _hint(src)
    tiny = hint == OUTER_TINY_HINT
    block = re.search(r"\bR0_BLOCK\s*:\s*tl\.constexpr\s*=\s*(\d+)", src)
    if hint is None or block is None:
        return None
    r = int(block.group(1))
    if tiny:
        return 2 * (256 // r) if r <= 256 else 1
    rows = re.search(r"^\s*xnumel = (\d+)$", src, re.M)
    most = int(rows.group(1)) if rows else None
    return max(x for x in PERSISTENT_ROWS if x == 1 or (x * r <= PERSISTENT_NUMEL and (most is None or x <= most)))


def _jit_source(text: str) -> tuple[str, ast.FunctionDef] | None:
    """An Inductor kernel string from its ``@triton.jit`` line on (the heuristics decorator above
    it goes, and the imports and driver setup above that), and the kernel's definition."""
    kernel = next((n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)), None)
    jit = next((d for d in kernel.decorator_list if ast.unparse(d) == "triton.jit"), None) if kernel else None
    if jit is None:
        return None
    return "@triton.jit\n" + "\n".join(text.splitlines()[jit.end_lineno:]), kernel


def _portable(src: str) -> str:
    """``libdevice.f(x)`` as ``tl.math.f(x)`` where Triton has that function: the same device call
    on a GPU, and the Triton interpreter evaluates ``tl.math`` but not every ``libdevice`` name
    (``libdevice.erf`` fails there, ``tl.math.erf`` runs)."""
    import triton.language as tl

    return re.sub(r"\blibdevice\.(\w+)\(",
                  lambda m: f"tl.math.{m.group(1)}(" if hasattr(tl.math, m.group(1)) else m.group(0), src)


#: a program id's widening to 64 bits, where Inductor wrote one
_WIDE = r"(?:\.to\(tl\.int64\))?"


#: a y axis whose blocks may outnumber the grid's y limit: Inductor's kernel takes its block as program
#: id 1 plus program id 2 times the y grid (its ``Grid2DWithYZOverflow``; any dynamic y size)
_Y_SPILLS = re.compile(rf"\byoffset = \(tl\.program_id\(1\) \+ tl\.program_id\(2\) \* tl\.num_programs\(1\)\){_WIDE} \* YBLOCK\b")
#: the most programs a CUDA grid has along y (Inductor's ``get_max_y_grid``)
MAX_Y_GRID = 65535


def _launcher(name: str, src: str, params: list[str], blocks: dict[str, int]) -> str:
    runtime = [p for p in params if not re.fullmatch(r"[XYZ]BLOCK|R\d_BLOCK", p)]
    constexprs = [p for p in params if p not in runtime]
    # the program id as it is, or widened to 64 bits (the dynamic capture's indices: inductor_code)
    axes = {m.group(1): int(m.group(2))
            for m in re.finditer(rf"\b([xyz])offset = tl\.program_id\((\d)\){_WIDE} \* [XYZ]BLOCK\b", src)}
    lines = [f"def _launch_{name}({', '.join(runtime)}):"]
    persistent = name.removeprefix(inductor_paths.STATIC).startswith("triton_per_")
    # a reduction takes XBLOCK rows of a whole block of the reduced axis each: few rows. Inductor's
    # static code makes a persistent reduction's R0_BLOCK a literal of the kernel, no parameter.
    reduction = any(p.startswith("R") for p in constexprs) or any(re.fullmatch(r"r\d_numel", p) for p in runtime)
    # an outer reduction (a strided reduced axis), looped: XBLOCK contiguous rows, a short R block;
    # persistent, as many rows as Inductor gives it (on a GPU: where the CPU's interpreter runs, the
    # blocks are its own)
    outer = reduction and not persistent and _hint(src) == OUTER_HINT and "XO" in blocks
    rows = _persistent_rows(src) if reduction and persistent and "XO" in blocks else None
    for p in constexprs:
        if p.startswith("R"):
            numel = f"r{p[1]}_numel"
            value = f"triton.next_power_of_2({numel})" if persistent else str(blocks["RO" if outer else "R"])
            lines.append(f"    {p} = {value}")
        else:
            x_reduction = rows or (blocks["XO"] if outer else blocks["XR"])
            lines.append(f"    {p} = {x_reduction if reduction and p == 'XBLOCK' else blocks[p[0]]}")
    grid = [None, None, None]
    for axis in "xyz":
        if f"{axis.upper()}BLOCK" in constexprs:
            if axis == "y" and axis not in axes and _Y_SPILLS.search(src):
                if "ZBLOCK" in constexprs or "znumel" in runtime:
                    raise Untranslatable(f"{name}: a y axis that spills into z beside a z axis of its own")
                # Inductor's Grid2DWithYZOverflow: as many z rows of y blocks as the y limit needs
                lines += ["    _y_blocks = triton.cdiv(ynumel, YBLOCK)",
                          f"    _y_rows = max(1, triton.cdiv(_y_blocks, {MAX_Y_GRID}))"]
                grid[1], grid[2] = "triton.cdiv(_y_blocks, _y_rows)", "_y_rows"
                continue
            if axis not in axes:
                raise Untranslatable(f"{name}: the {axis} axis is not one program id per block")
            grid[axes[axis]] = f"triton.cdiv({axis}numel, {axis.upper()}BLOCK)"
        elif f"{axis}numel" in runtime:
            one = re.search(rf"\b{axis}offset = tl\.program_id\((\d)\){_WIDE}\n", src)  # one element per program
            if one is None:
                raise Untranslatable(f"{name}: a {axis} axis without a block size or one program per element")
            grid[int(one.group(1))] = f"{axis}numel"
    used = [g for g in grid if g is not None]
    if any(g is None for g in grid[:len(used)]):
        raise Untranslatable(f"{name}: program ids that skip an axis")
    grid_text = ", ".join(used or ["1"])
    call = ", ".join(runtime + [f"{p}={p}" for p in constexprs])
    lines.append(f"    {name}[({grid_text},)]({call})")
    return "\n".join(lines) + "\n"


def _forward_body(stmts: list[ast.stmt], kernels: dict, bindings: Sequence[tuple[str, str]]) -> list[str]:
    out = [f"{name} = {expr}" for name, expr in bindings]
    for stmt in stmts:
        out += _statement(stmt, kernels, {name for name, _ in bindings})
    return out


def _statement(stmt: ast.stmt, kernels: dict, bound: set[str]) -> list[str]:
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == "args":
        return []  # the arguments are bound from the inputs instead
    if isinstance(stmt, ast.Delete):
        return []
    if isinstance(stmt, ast.With):
        return [line for s in stmt.body for line in _statement(s, kernels, bound)]
    if isinstance(stmt, ast.Return):
        value = _Views().visit(stmt.value) if stmt.value is not None else None  # a view returned (InstanceNorm)
        if isinstance(value, ast.Tuple):
            items = [ast.unparse(e) for e in value.elts]
            return [f"return {items[0]}" if len(items) == 1 else f"return ({', '.join(items)})"]
        return [f"return {ast.unparse(value)}" if value is not None else "return None"]
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
    if value is None:
        raise Untranslatable(f"wrapper statement `{ast.unparse(stmt)[:120]}`")
    if isinstance(value, ast.Call):
        func = ast.unparse(value.func)
        if func in _DROP_CALLS or func.endswith(".set_device") or func == "args.clear":
            return []
        if _ALLOC.match(func):
            size, stride, dtype = (ast.unparse(a) for a in value.args[:3])
            target = ast.unparse(stmt.targets[0])
            return [f"{target} = torch.empty_strided({size}, {stride}, dtype={dtype}, device=device)"]
        shown = ast.unparse(value)[:120]
        value = _Views().visit(value)
        if func == "reinterpret_tensor" or _metadata(value, bound):
            return [ast.unparse(stmt.targets[0]) + " = " + ast.unparse(value)]
        if func.endswith(".run") and func[:-4] in kernels:
            args = ", ".join(ast.unparse(a) for a in value.args)
            return [f"_launch_{func[:-4]}({args})"]
        if func in inductor_gemm.CALLS and isinstance(stmt, ast.Expr):
            try:
                return [inductor_gemm.launch(func, value)]
            except ValueError as why:
                raise Untranslatable(str(why)) from None
        raise Untranslatable(f"`{shown}`")
    _check_arithmetic(value, stmt)
    return [ast.unparse(stmt)]


class _Views(ast.NodeTransformer):
    """``reinterpret_tensor(x, size, stride, offset)`` anywhere in a call (a GEMM's transposed
    weight is one of its arguments) as ``torch.as_strided``, the same view."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "reinterpret_tensor":
            node.func = ast.Attribute(value=ast.Name("torch", ast.Load()), attr="as_strided", ctx=ast.Load())
        return node


def _metadata(value: ast.Call, bound: set[str]) -> bool:
    """``arg1_1.size()`` / ``.stride()`` of a wrapper argument: Inductor reads a size it did not
    take as an argument of its own from the tensor (``s50 = arg1_1_size[0]`` follows)."""
    func = value.func
    return (isinstance(func, ast.Attribute) and func.attr in ("size", "stride") and not value.args
            and not value.keywords and isinstance(func.value, ast.Name) and func.value.id in bound)


def _check_arithmetic(value: ast.expr, stmt: ast.stmt) -> None:
    """Size arithmetic only: names, numbers, operators, an item of a size tuple and ``max``/``min``
    (``ps0 = s0*s53``, ``s50 = arg1_1_size[0]``, a stride of ``max(1, s0)``)."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in ("max", "min") and not node.keywords:
                continue
        elif isinstance(node, (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                               ast.Load, ast.Tuple, ast.Subscript)):
            continue
        raise Untranslatable(f"wrapper statement `{ast.unparse(stmt)[:120]}`")


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2], public_only=sys.argv[3:] == ["public"])
