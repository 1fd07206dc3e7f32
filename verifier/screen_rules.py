"""The static screen's tables: what each rule means, which names and CUDA tokens trip it.

``screen.py`` walks the candidate's syntax tree and looks names up here. Each rule has an id, the
THREATS.md class it defends (None when it is no cheat by itself but hides code from the screen),
and the sentence that explains to a person (and to the model) why it is refused. The end of the
module holds the small stateless syntax helpers the rules share.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from .torch_ops import is_bookkeeping

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Rule:
    threat: int | None
    why: str


RULES: dict[str, Rule] = {
    "syntax": Rule(None, "the module must parse before anything else can be judged"),
    "no-modelnew": Rule(None, "the harness constructs `ModelNew(*get_init_inputs())`"),
    "modelnew-not-class": Rule(None, "`ModelNew` must be a class defined in the module"),
    "side-stream": Rule(5, "work on another stream escapes the timer"),
    "cuda-graph": Rule(13, "the harness times with CUDA graphs: code that inspects or drives capture can tell timing from checking, or break the timer's graph"),
    "clock": Rule(13, "a candidate that times its own calls can tell warm-up, checking and timing apart"),
    "thread": Rule(6, "a host thread or callback can finish the output after the call has returned"),
    "process": Rule(21, "candidates may not start processes"),
    "ctypes": Rule(21, "native calls reach past every check (streams, timers, memory)"),
    "introspection": Rule(10, "candidates may not inspect or import the harness, its frames or its modules"),
    "harness-hook": Rule(10, "signal handlers, trace hooks and exit hooks run inside the harness's own code"),
    "monkeypatch": Rule(8, "changing a module that the harness also uses can fake its timers or checks"),
    "exec": Rule(None, "code built at run time cannot be screened"),
    "dynamic-attr": Rule(None, "an attribute name computed at run time hides what is used from the screen"),
    "file-io": Rule(21, "candidates may not read or write files"),
    "network": Rule(21, "candidates may not use the network"),
    "environ": Rule(21, "the environment is not the candidate's to read (credentials) or change"),
    "l2-persist": Rule(18, "data pinned in L2 survives the cache flush between timed calls"),
    "torch-compute": Rule(16, "this task requires the work to be done by the candidate's own kernels"),
    "torch-layer": Rule(16, "calling a torch.nn layer runs torch's kernels, not the candidate's"),
    "torch-compile": Rule(16, "torch.compile / TorchScript / export generate the kernels from torch ops: they are not the candidate's"),
    "array-export": Rule(16, "handing a tensor to the host or another library lets code the screen cannot see compute the answer"),
    "foreign-kernels": Rule(16, "another library's kernels are not the candidate's own"),
    "try-fallback": Rule(16, "a handler that swallows a kernel failure can fall back to something else and hide that the kernel failed"),
    "output-cache": Rule(11, "an output kept across calls is returned again for new inputs"),
    "tensor-subclass": Rule(7, "a tensor subclass or proxy can compute when compared instead of when called"),
    "dispatch-hook": Rule(10, "dispatch modes and aten overrides can hide ops from the runtime trace or change what they do"),
    "rng-seed": Rule(10, "reseeding during a call can make later inputs predictable"),
}

# --------------------------------------------------------------------------------------------
# Dotted names. The longest matching prefix wins; a use is reported only where the import that
# named it was not already reported (``import threading`` once, not every ``threading.Thread``).

PATH_RULES: dict[tuple[str, ...], tuple[str, str]] = {}


def _add(rule: str, what: str, *dotted: str) -> None:
    for d in dotted:
        PATH_RULES[tuple(d.split("."))] = (rule, what)


_add("side-stream", "creates or switches to a side stream",
     "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream",
     "torch.cuda.StreamContext", "torch.cuda.streams", "torch.Stream", "torch.cuda._set_stream_by_id",
     "torch.accelerator.set_stream", "torch._C._cuda_setStream", "cupy.cuda.Stream",
     "cupy.cuda.ExternalStream", "pycuda.driver.Stream", "numba.cuda.stream")
_add("cuda-graph", "inspects or drives CUDA graph capture",
     "torch.cuda.is_current_stream_capturing", "torch.cuda.graphs", "torch.cuda.graph",
     "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables", "torch.cuda.graph_pool_handle",
     "torch._C._cuda_isCurrentStreamCapturing", "torch._C._CUDAGraph")
_add("clock", "reads the host clock during the call",
     "time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
     "time.monotonic_ns", "time.process_time", "time.process_time_ns", "time.thread_time",
     "time.thread_time_ns", "time.clock_gettime", "time.clock_gettime_ns", "datetime.datetime.now",
     "datetime.datetime.utcnow", "datetime.datetime.today")
# ``threading`` is judged by attribute (``threading_rule``): a lock around a cache starts nothing
_add("thread", "starts host threads or tasks",
     "_thread", "concurrent", "asyncio", "multiprocessing", "torch.multiprocessing",
     "torch.jit.fork", "joblib")
_add("process", "starts a process", "subprocess", "pty", "pexpect")
_add("ctypes", "calls native code directly", "ctypes", "_ctypes", "cffi", "torch.cuda.cudart")
_add("introspection", "inspects or imports the running harness",
     "sys._getframe", "sys._current_frames", "sys.modules", "sys.meta_path", "sys.path_hooks",
     "sys.path_importer_cache", "sys.path", "inspect", "gc", "traceback", "importlib", "pkgutil",
     "linecache", "dis", "kernforge", "__main__", "builtins.__import__", "builtins.globals",
     "builtins.locals", "builtins.vars")
_add("harness-hook", "installs a handler or hook",
     "signal", "atexit", "faulthandler", "sys.settrace", "sys.setprofile", "sys.addaudithook",
     "sys.excepthook", "sys.displayhook", "sys.unraisablehook", "sys.monitoring",
     "sys.breakpointhook", "builtins.breakpoint")
_add("exec", "runs code built at run time",
     "builtins.exec", "builtins.eval", "builtins.compile", "marshal", "runpy", "code", "codeop",
     "pickle", "dill", "cloudpickle", "shelve", "types.CodeType", "types.FunctionType")
_add("file-io", "reads or writes files",
     "builtins.open", "builtins.input", "io", "pathlib", "shutil", "tempfile", "glob", "fileinput",
     "mmap", "fcntl", "sqlite3", "dbm", "zipfile", "tarfile", "gzip", "bz2", "lzma", "posix", "nt",
     "torch.load", "torch.save", "torch.from_file", "torch.UntypedStorage.from_file", "torch.TypedStorage.from_file",
     "torch.storage.UntypedStorage.from_file", "torch.storage.TypedStorage.from_file", "torch.ByteStorage.from_file",
     "torch.FloatStorage.from_file", "torch.HalfStorage.from_file", "torch.CharStorage.from_file",
     "numpy.load", "numpy.save", "numpy.savez",
     "numpy.savez_compressed", "numpy.fromfile", "numpy.loadtxt", "numpy.savetxt",
     "numpy.genfromtxt", "numpy.memmap")
_add("network", "uses the network",
     "socket", "ssl", "urllib", "urllib3", "http", "requests", "httpx", "aiohttp", "ftplib",
     "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "socketserver", "websocket",
     "websockets", "paramiko", "grpc", "zmq", "torch.hub", "torch.distributed", "huggingface_hub",
     "openai", "webbrowser")
_add("torch-compile", "compiles torch code into kernels",
     "torch.compile", "torch.jit.script", "torch.jit.trace", "torch.jit.trace_module",
     "torch.jit.script_method", "torch.jit.freeze", "torch.jit.optimize_for_inference",
     "torch._dynamo", "torch._inductor", "torch.export", "torch._export", "torch.fx")
_add("dispatch-hook", "hooks torch's dispatcher",
     "torch.utils._python_dispatch", "torch.overrides", "torch._C._EnablePythonDispatcher",
     "torch._C._DisableTorchDispatch", "torch._C.DisableTorchFunction",
     "torch._C.DisableTorchFunctionSubclass", "torch._C._set_dispatch_mode",
     "torch._C._push_on_torch_dispatch_stack", "torch._C._push_on_torch_function_stack",
     "torch._C._set_torch_function_mode", "torch._C._disabled_torch_function_impl",
     "torch._C._dispatch_tls_set_dispatch_key_excluded", "torch._C._ExcludeDispatchKeyGuard",
     "torch._C._IncludeDispatchKeyGuard")
_add("tensor-subclass", "makes a tensor subclass",
     "torch._subclasses", "torch.Tensor._make_subclass", "torch.Tensor._make_wrapper_subclass",
     "torch.Tensor.as_subclass")
_add("rng-seed", "reseeds a random number generator",
     "torch.manual_seed", "torch.seed", "torch.set_rng_state", "torch.random.manual_seed",
     "torch.random.seed", "torch.random.set_rng_state", "torch.cuda.manual_seed",
     "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all",
     "torch.cuda.set_rng_state", "torch.cuda.set_rng_state_all", "random.seed", "random.setstate",
     "numpy.random.seed", "numpy.random.set_state")
_add("foreign-kernels", "imports another library's kernels",
     "flash_attn", "xformers", "apex", "vllm", "sglang", "sgl_kernel", "flashinfer", "liger_kernel",
     "deepspeed", "transformer_engine", "bitsandbytes", "torchao", "fbgemm_gpu", "megablocks",
     "mamba_ssm", "causal_conv1d", "kernels", "triton_kernels", "deep_gemm", "jax", "tensorflow",
     "cupyx")

#: prefixes that are exempt from a broader rule above (longest prefix wins, None = no rule)
EXEMPT_PATHS: frozenset[tuple[str, ...]] = frozenset({
    ("torch", "_inductor", "runtime"),  # libdevice/triton helpers used inside Triton kernels
})

#: rules that only apply when the task forbids torch compute
TORCH_POLICY_RULES = frozenset({"torch-compute", "torch-layer", "array-export", "foreign-kernels"})

#: rules that apply only while a call runs (not in ``__init__`` or at import)
CALL_TIME_RULES = frozenset({"rng-seed", "clock"})

# ``os`` is needed for harmless things (``os.path.join``, ``os.cpu_count``), so it is judged by
# attribute: process control, environment, and everything else (files) by default.
OS_PROCESS = frozenset({
    "system", "popen", "fork", "forkpty", "vfork", "kill", "killpg", "execl", "execle", "execlp",
    "execlpe", "execv", "execve", "execvp", "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe",
    "spawnv", "spawnve", "spawnvp", "spawnvpe", "posix_spawn", "posix_spawnp", "wait", "waitpid",
    "wait3", "wait4", "waitid", "startfile", "register_at_fork",
})
OS_ENVIRON = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})
OS_SAFE = frozenset({
    "path", "sep", "altsep", "linesep", "pathsep", "curdir", "pardir", "extsep", "devnull", "name",
    "cpu_count", "process_cpu_count", "sched_getaffinity", "getpid", "fspath", "PathLike",
})
#: what of ``threading`` starts nothing: locks and their kin, thread-local data, the thread's id
#: (not a Thread object: its type starts another)
THREADING_SAFE = frozenset({
    "Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore", "Event", "Barrier", "local",
    "get_ident", "get_native_id", "TIMEOUT_MAX",
})
#: modules judged by attribute (``os_rule``, ``threading_rule``): importing one is harmless, and
#: ``from M import *`` is reported, since its names' uses could not be judged
BY_ATTRIBUTE = {"os": ("file-io", "imports every name of `os`, so their uses cannot be screened"),
                "threading": ("thread", "imports every name of `threading`, so their uses cannot be screened")}
OS_PATH_PURE = frozenset({
    "join", "basename", "dirname", "split", "splitext", "splitdrive", "normpath", "normcase",
    "abspath", "relpath", "commonpath", "commonprefix", "isabs", "sep", "fspath",
})
#: environment variables a candidate may *set* (build settings for ``load_inline``)
ENV_WRITABLE = frozenset({"TORCH_CUDA_ARCH_LIST", "MAX_JOBS"})


def threading_rule(path: tuple[str, ...]) -> tuple[str, str] | None:
    """The rule for ``threading.X``, or None when it starts nothing (``THREADING_SAFE``)."""
    if len(path) < 2 or path[0] != "threading" or path[1] in THREADING_SAFE:
        return None
    return "thread", "starts host threads or tasks"


def os_rule(path: tuple[str, ...]) -> tuple[str, str] | None:
    """The rule for ``os.X`` / ``os.path.X``, or None when harmless."""
    if len(path) < 2 or path[0] != "os":
        return None
    attr = path[1]
    if attr in OS_PROCESS:
        return "process", "starts or controls a process"
    if attr in OS_ENVIRON:
        return "environ", "reads or changes the environment"
    if attr == "path":
        if len(path) == 2 or path[2] in OS_PATH_PURE:
            return None
        return "file-io", "probes the file system"
    if attr in OS_SAFE:
        return None
    return "file-io", "uses the operating system's file interface"


# --------------------------------------------------------------------------------------------
# Tokens in CUDA C++ source strings (load_inline, NVRTC) and in Python names (cuda-python).


@dataclass(frozen=True)
class Token:
    pattern: re.Pattern[str]
    rule: str
    what: str
    #: also looked for in Python identifiers (``driver.cuStreamCreate``)
    in_python: bool = True


def _tok(regex: str, rule: str, what: str, in_python: bool = True) -> Token:
    return Token(re.compile(regex), rule, what, in_python)


CUDA_TOKENS: tuple[Token, ...] = (
    _tok(r"\bcudaStreamCreate\w*|\bcuStreamCreate\w*", "side-stream", "creates a CUDA stream"),
    _tok(r"\bcudaStreamPerThread\b|\bCU_STREAM_PER_THREAD\b|\bCUDA_API_PER_THREAD_DEFAULT_STREAM\b|default-stream[= ]+per-thread",
         "side-stream", "uses the per-thread default stream"),
    _tok(r"\bgetStreamFromPool\b|\bgetStreamFromExternal\b|\bsetCurrentCUDAStream\b",
         "side-stream", "takes or sets a stream other than the current one"),
    _tok(r"\bcudaLaunchHostFunc\b|\bcuLaunchHostFunc\b|\bcudaStreamAddCallback\b|\bcuStreamAddCallback\b",
         "thread", "queues a host callback"),
    _tok(r"\bstd::j?thread\b|\bpthread_create\b|\bstd::async\b|#\s*include\s*<(?:thread|pthread\.h)>",
         "thread", "starts a host thread", in_python=False),
    _tok(r"\bcu(?:da)?StreamIsCapturing\b|\bcu(?:da)?StreamGetCaptureInfo\w*|\bcurrentStreamCaptureStatus\w*|\bcu(?:da)?Stream(?:Begin|End)Capture\w*|\bcu(?:da)?ThreadExchangeStreamCaptureMode\b|\bcu(?:da)?Graph(?:Launch|Instantiate|Create|AddKernelNode|ExecUpdate)\w*",
         "cuda-graph", "inspects or drives CUDA graph capture"),
    _tok(r"[aA]ccessPolicyWindow|\bcudaLimitPersistingL2CacheSize\b|\bCU_LIMIT_PERSISTING_L2_CACHE_SIZE\b|ResetPersistingL2Cache\b|\bcudaAccessPropertyPersisting\b|\bCU_ACCESS_PROPERTY_PERSISTING\b",
         "l2-persist", "sets up persisting L2 cache lines"),
    _tok(r"\b(?:std::)?(?:system|popen|fork|vfork|execv|execvp|execve|execl|execlp)\s*\(|\bposix_spawnp?\b",
         "process", "starts a process", in_python=False),
    _tok(r"\bdlopen\b|\bdlsym\b|\bLD_PRELOAD\b", "ctypes", "loads or looks up native symbols"),
    _tok(r"\b(?:cudaError_t|CUresult)\s+(?:CUDARTAPI\s+)?(?:cuda|cu)[A-Z]\w*\s*\(",
         "monkeypatch", "defines a CUDA API function of its own (symbol interposition)", in_python=False),
    _tok(r"\bfopen\b|\b(?:std::)?[io]?fstream\b|#\s*include\s*<fstream>|\bopendir\b|\bposix_fadvise\b|\bmincore\b"
         r"|\bpreadv2\b|\bRWF_NOWAIT\b|\bmmap\s*\(|\b(?:open|openat|pread|read)\s*\(\s*\"/",
         "file-io", "reads, maps or probes files", in_python=False),
    _tok(r"\b(?:msgget|msgsnd|msgrcv|semget|semop|shmget|shmat|mq_open|mq_send|mq_receive)\s*\(",
         "file-io", "uses System V or POSIX IPC, whose objects outlive the process", in_python=False),
    _tok(r"\bsyscall\s*\(", "ctypes", "makes a raw system call", in_python=False),
    _tok(r"\b(?:std::)?getenv\s*\(|\bsetenv\s*\(|\bputenv\s*\(", "environ", "reads or changes the environment", in_python=False),
    _tok(r"#\s*include\s*<(?:sys/socket\.h|netinet/in\.h|arpa/inet\.h)>", "network", "opens sockets", in_python=False),
    _tok(r"TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(\s*aten\b", "dispatch-hook", "registers kernels for aten ops", in_python=False),
)

#: ``at::name(`` / ``torch::name(`` in C++: a free ATen function (classified by torch_ops)
CPP_ATEN_CALL = re.compile(r"\b(?:at|torch)::([a-z_][a-z0-9_]*)\s*\(")

#: ``m.def("name", ...)`` in pybind11 sources: functions the candidate's extension exports
PYBIND_DEF = re.compile(r"\.def\s*\(\s*\"(\w+)\"")

_C_MARKERS = ("#include", "__global__", "__device__", 'extern "C"', "PYBIND11_MODULE", "TORCH_LIBRARY", "torch::", "at::")


def looks_like_c(text: str) -> bool:
    """Whether a string is C/C++ source rather than prose (a docstring that says "system (...)")."""
    return any(m in text for m in _C_MARKERS) or ("{" in text and ";" in text)


_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def strip_c_comments(text: str) -> str:
    """C and C++ comments blanked out, newlines kept so line numbers still count."""
    return _C_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


# --------------------------------------------------------------------------------------------
# Exceptions, caches, containers.

#: handlers for these cannot swallow a kernel failure: lookups and arithmetic on Python values
NARROW_EXCEPTIONS = frozenset({
    "KeyError", "IndexError", "LookupError", "AttributeError", "StopIteration",
    "StopAsyncIteration", "ZeroDivisionError", "OverflowError", "ArithmeticError",
    "FloatingPointError", "UnicodeError", "UnicodeDecodeError", "UnicodeEncodeError",
})
IMPORT_EXCEPTIONS = frozenset({"ImportError", "ModuleNotFoundError"})

#: decorators that keep results across calls
CACHE_DECORATORS = frozenset({
    ("functools", "lru_cache"), ("functools", "cache"), ("functools", "cached_property"),
})

#: calls that build a mutable container
CONTAINER_CALLS = frozenset({
    ("builtins", "dict"), ("builtins", "list"), ("builtins", "set"), ("builtins", "bytearray"),
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "deque"),
    ("collections", "Counter"), ("collections", "ChainMap"), ("weakref", "WeakValueDictionary"),
    ("weakref", "WeakKeyDictionary"),
})

#: decorators that make a function a kernel body (Triton or another kernel DSL), not host code
KERNEL_DSL_ROOTS = frozenset({"triton", "cutlass", "numba", "tilelang", "warp"})
KERNEL_DECORATORS = frozenset({"jit", "kernel", "autotune", "heuristics", "prim_func"})

#: attributes that reach into frames, code objects and namespaces
INTROSPECTION_ATTRS = frozenset({
    "__globals__", "__code__", "__closure__", "__builtins__", "__dict__", "__subclasses__",
    "__bases__", "__mro__", "__defaults__", "__kwdefaults__", "f_back", "f_globals", "f_locals",
    "f_builtins", "f_code", "f_trace", "tb_frame", "tb_next", "gi_frame", "gi_code", "cr_frame",
    "cr_code", "ag_frame", "co_code", "co_consts", "co_names",
})

#: module roots where a computed attribute name (``getattr(torch, name)``) is refused
DYNAMIC_ATTR_ROOTS = frozenset({"torch", "os", "sys", "builtins", "time", "threading"})
#: what a module-level ``try`` may call and still be a device query, not a kernel's fallback: it
#: runs at import, before any input exists, and launches nothing (``Screen._check_try``)
DEVICE_QUERIES: tuple[tuple[str, ...], ...] = (
    ("torch", "cuda", "get_device_properties"), ("torch", "cuda", "get_device_capability"),
    ("torch", "cuda", "get_device_name"), ("torch", "cuda", "is_available"), ("torch", "cuda", "device_count"),
    ("torch", "cuda", "current_device"), ("torch", "version"), ("triton", "runtime", "driver"),
    ("triton", "next_power_of_2"), ("triton", "cdiv"),
    ("builtins", "int"), ("builtins", "str"), ("builtins", "min"), ("builtins", "max"), ("builtins", "getattr"),
)

#: ``torch.Tensor`` itself and its C base: subclassing either makes a tensor subclass
TENSOR_CLASSES = frozenset({
    ("torch", "Tensor"), ("torch", "_C", "TensorBase"), ("torch", "_C", "_TensorBase"),
    ("torch", "nn", "Parameter"), ("torch", "nn", "parameter", "Parameter"),
})
SUBCLASS_METHODS = frozenset({"as_subclass", "_make_subclass", "_make_wrapper_subclass"})
#: methods that map a file, whatever they are reached through (a storage's ``from_file``: the page
#: cache of a file every worker reads carried bits from one worker to the next, red team)
FILE_METHODS = frozenset({"from_file"})
SUBCLASS_HOOKS = frozenset({"__torch_function__", "__torch_dispatch__"})


# --------------------------------------------------------------------------------------------
# Syntax helpers the screen's rules share (stateless: a node in, a fact out).


def is_getattr_const(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) == 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def mentions_aten(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split("::")[0].split(".")[0] == "aten"


def env_writable(nodes: list[ast.AST]) -> bool:
    return bool(nodes) and isinstance(nodes[0], ast.Constant) and nodes[0].value in ENV_WRITABLE


def target_key(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def receiver_key(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript)) and target_key(node) == "":
        node = node.value
    return target_key(node)


def flatten_targets(targets: Iterable[ast.AST]) -> Iterator[ast.AST]:
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            yield from flatten_targets(t.elts)
        elif isinstance(t, ast.Starred):
            yield from flatten_targets([t.value])
        else:
            yield t


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (*FUNCS, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def is_import_stmt(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    return isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)


def reraises(handler: ast.ExceptHandler) -> bool:
    """The handler ends by raising and has no way out other than raising."""
    if not handler.body or not isinstance(handler.body[-1], ast.Raise):
        return False
    return not any(isinstance(n, (ast.Return, ast.Break, ast.Continue)) for stmt in handler.body for n in [stmt, *own_nodes(stmt)])


def drop_main_block(tree: ast.Module) -> None:
    """Empty ``if __name__ == "__main__":`` bodies: the harness imports the module under another
    name, so they never run; unless the module assigns ``__name__`` itself."""
    if any(isinstance(n, ast.Name) and n.id == "__name__" and not isinstance(n.ctx, ast.Load) for n in ast.walk(tree)):
        return
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
                and isinstance(node.test.ops[0], ast.Eq):
            sides = [node.test.left, *node.test.comparators]
            names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
            consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
            if names and consts:
                node.body = [ast.Pass(lineno=node.lineno, col_offset=node.col_offset)]


def module_level_bindings(tree: ast.Module, name: str) -> Iterator[ast.AST]:
    """Statements outside any function or class body that bind ``name``."""
    for node in module_level_statements(tree.body):
        if isinstance(node, (ast.ClassDef, *FUNCS)):
            if node.name == name:
                yield node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                yield node
        else:
            targets: list[ast.AST] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                targets = [node.target]
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                yield node


def module_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.ClassDef, *FUNCS)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from module_level_statements(getattr(stmt, field, []))
        for handler in getattr(stmt, "handlers", []):
            yield from module_level_statements(handler.body)


def local_names(fn: ast.AST) -> set[str]:
    declared_global = {n for node in own_nodes(fn) if isinstance(node, ast.Global) for n in node.names}
    assigned = {n.id for n in own_nodes(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return assigned - declared_global


def returned_bases(expr: ast.AST, fn: ast.AST, depth: int) -> list[ast.AST]:
    """What a returned expression is made of, looking through tuples, conditionals, bookkeeping
    method calls (``.view``, ``.clone``...) and local names assigned in the same function."""
    if depth > 6:
        return []
    if isinstance(expr, (ast.Tuple, ast.List)):
        return [b for e in expr.elts for b in returned_bases(e, fn, depth + 1)]
    if isinstance(expr, ast.IfExp):
        return returned_bases(expr.body, fn, depth + 1) + returned_bases(expr.orelse, fn, depth + 1)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and is_bookkeeping(expr.func.attr):
        return returned_bases(expr.func.value, fn, depth + 1)
    if isinstance(expr, ast.Name):
        values = [n.value for n in own_nodes(fn) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
        return [b for v in values for b in returned_bases(v, fn, depth + 1)] or [expr]
    return [expr]


def callee(call: ast.Call, functions: dict[str, ast.AST], methods: dict[str, ast.AST]) -> ast.AST | None:
    f = call.func
    if isinstance(f, ast.Name):
        return functions.get(f.id)
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
        return methods.get(f.attr)
    return None


def container_read(node: ast.AST) -> str | None:
    """``C[k]``, ``C.get(k)``, ``C.setdefault(k, v)``, ``C.pop(k)``: the name of ``C``."""
    if isinstance(node, ast.Subscript):
        return target_key(node.value) or None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault", "pop"):
        return target_key(node.func.value) or None
    return None
