"""The static screen and the torch-ops policy.

Every rule is shown catching a small cheat, with its THREATS.md class and the line it names; honest
candidates (every built-in seed, CUDA through load_inline, NVRTC, KernelBench-style modules with
parameters, views, allocation, cached launch configuration) must pass. The cheat's offending line
is marked ``#!`` in its source, so each test knows which line the message must name.
"""

from __future__ import annotations

import ast
import re
import textwrap

import pytest
import torch

from kernforge.tasks.loader import builtin_names, load_task
from kernforge.verifier import screen as screen_module
from kernforge.verifier import screen_rules, torch_ops
from kernforge.verifier.screen import Finding, ScreenResult, screen
from kernforge.verifier.torch_ops import (
    is_allowed_aten,
    parse_op_name,
    tensor_method_is_compute,
    torch_reference_kind,
)

# A minimal honest candidate: a Triton copy kernel and its launcher. Cheats are written around it.
BASE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def launch(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
'''


def module(prelude: str = "", forward: str = "return launch(x)", init: str = "") -> str:
    """BASE, then ``prelude`` at module level, then ModelNew with the given bodies."""
    init_block = ""
    if init:
        init_block = "    def __init__(self):\n        super().__init__()\n" + textwrap.indent(textwrap.dedent(init), " " * 8) + "\n"
    return (BASE + textwrap.dedent(prelude) + "\n\nclass ModelNew(nn.Module):\n" + init_block
            + "    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(forward), " " * 8) + "\n")


def marked_line(source: str) -> int:
    lines = [i for i, text in enumerate(source.splitlines(), 1) if "#!" in text]
    assert len(lines) == 1, "a cheat marks exactly one line with #!"
    return lines[0]


CUDA_HEAD = 'SRC = r"""\n#include <cuda_runtime.h>\n__global__ void k(float* y) { y[threadIdx.x] = 1.f; }\nvoid run(cudaStream_t stream) {\n'
CUDA_TAIL = '\n}\n"""\n'


def cuda(body: str) -> str:
    return CUDA_HEAD + body + CUDA_TAIL


# (case id, rule, threat, source). The source forbids torch ops unless the id ends in "+ops".
CHEATS = [
    ("syntax", "syntax", None, BASE + "\nclass ModelNew(nn.Module):\n    def forward(self, x)  #!\n        return x\n"),
    ("missing ModelNew", "no-modelnew", None, "import torch  #!\n"),
    ("ModelNew alias", "modelnew-not-class", None, module() + "\nModelNew = nn.Identity  #!\n"),
    ("ModelNew function", "modelnew-not-class", None, BASE + "\ndef ModelNew():  #!\n    return launch\n"),
    ("torch.cuda.Stream", "side-stream", 5, module(forward="""\
        s = torch.cuda.Stream()  #!
        with torch.cuda.stream(s):
            return launch(x)""")),
    ("import Stream", "side-stream", 5, module("from torch.cuda import Stream  #!\n")),
    ("set_stream", "side-stream", 5, module(forward="torch.cuda.set_stream(torch.cuda.default_stream())  #!\nreturn launch(x)")),
    ("cudaStreamCreate", "side-stream", 5, module(cuda("  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);  #!"))),
    ("stream pool", "side-stream", 5, module(cuda("  auto s = at::cuda::getStreamFromPool();  #!"))),
    ("per-thread stream flag", "side-stream", 5, module('FLAGS = ["-O3", "--default-stream per-thread"]  #!\n')),
    ("cuda-python stream", "side-stream", 5, module("from cuda.bindings import driver\n", forward="err, s = driver.cuStreamCreate(0)  #!\nreturn launch(x)")),
    ("capture query", "cuda-graph", 13, module(forward="if torch.cuda.is_current_stream_capturing():  #!\n    return launch(x)\nreturn launch(x)")),
    ("capture query in C++", "cuda-graph", 13, module(cuda("  cudaStreamCaptureStatus st; cudaStreamIsCapturing(stream, &st);  #!"))),
    ("own graph", "cuda-graph", 13, module(init="self.graph = torch.cuda.CUDAGraph()  #!")),
    ("end the harness's capture", "cuda-graph", 13, module(cuda("  cudaGraph_t g; cudaStreamEndCapture(stream, &g);  #!"))),
    ("clock in forward", "clock", 13, module("import time\n", forward="start = time.perf_counter()  #!\nreturn launch(x)")),
    ("threading", "thread", 6, module("import threading\nT = threading.Thread(target=print)  #!\n")),
    ("threading star", "thread", 6, module("from threading import *  #!\n")),
    ("thread pool", "thread", 6, module("from concurrent.futures import ThreadPoolExecutor  #!\n")),
    ("asyncio", "thread", 6, module("import asyncio  #!\n")),
    ("multiprocessing", "thread", 6, module("import multiprocessing as mp  #!\n")),
    ("torch.jit.fork", "thread", 6, module(forward="fut = torch.jit.fork(launch, x)  #!\nreturn launch(x)")),
    ("std::thread", "thread", 6, module(cuda("  std::thread t([] {});  #!"))),
    ("host callback", "thread", 6, module(cuda("  cudaLaunchHostFunc(stream, nullptr, nullptr);  #!"))),
    ("subprocess", "process", 21, module("import subprocess  #!\n")),
    ("os.system", "process", 21, module("import os\n", forward="os.system('nvidia-smi')  #!\nreturn launch(x)")),
    ("os.fork", "process", 21, module("import os\n", forward="pid = os.fork()  #!\nreturn launch(x)")),
    ("system() in C++", "process", 21, module(cuda('  system("ls");  #!'))),
    ("ctypes", "ctypes", 21, module("import ctypes  #!\n")),
    ("cffi", "ctypes", 21, module("from cffi import FFI  #!\n")),
    ("cudart", "ctypes", 21, module(forward="torch.cuda.cudart().cudaProfilerStop()  #!\nreturn launch(x)")),
    ("dlsym", "ctypes", 21, module(cuda('  void* f = dlsym(RTLD_NEXT, "cudaEventRecord");  #!'))),
    ("sys._getframe", "introspection", 10, module("import sys\n", forward="frame = sys._getframe(1)  #!\nreturn launch(x)")),
    ("inspect", "introspection", 10, module("import inspect  #!\n")),
    ("gc", "introspection", 10, module("import gc  #!\n")),
    ("traceback", "introspection", 10, module("import traceback  #!\n")),
    ("importlib", "introspection", 10, module("import importlib  #!\n")),
    ("__import__", "introspection", 10, module(forward="m = __import__('kernforge')  #!\nreturn launch(x)")),
    ("globals()", "introspection", 10, module(forward="g = globals()  #!\nreturn launch(x)")),
    ("vars(torch)", "introspection", 10, module(forward="v = vars(torch)  #!\nreturn launch(x)")),
    ("f_back", "introspection", 10, module(forward="caller = self.frame.f_back  #!\nreturn launch(x)")),
    ("__globals__", "introspection", 10, module(forward="g = launch.__globals__  #!\nreturn launch(x)")),
    ("__dict__", "introspection", 10, module(forward="d = torch.cuda.__dict__  #!\nreturn launch(x)")),
    ("__builtins__", "introspection", 10, module(forward="b = __builtins__  #!\nreturn launch(x)")),
    ("sys.modules", "introspection", 10, module("import sys\n", forward="h = sys.modules['kernforge.verifier.harness']  #!\nreturn launch(x)")),
    ("import kernforge", "introspection", 10, module("from kernforge.verifier import digest  #!\n")),
    ("signal", "harness-hook", 10, module("import signal  #!\n")),
    ("atexit", "harness-hook", 10, module("import atexit  #!\n")),
    ("settrace", "harness-hook", 10, module("import sys\nsys.settrace(None)  #!\n")),
    ("perf_counter", "monkeypatch", 8, module("import time\ntime.perf_counter = lambda: 0.0  #!\n")),
    ("cuda.Event", "monkeypatch", 8, module("torch.cuda.Event = object  #!\n")),
    ("setattr synchronize", "monkeypatch", 8, module("setattr(torch.cuda, 'synchronize', lambda: None)  #!\n")),
    ("del elapsed_time", "monkeypatch", 8, module("del torch.cuda.Event.elapsed_time  #!\n")),
    ("aliased module", "monkeypatch", 8, module("cuda = torch.cuda\ncuda.synchronize = lambda: None  #!\n")),
    ("triton launch", "monkeypatch", 8, module("triton.runtime.jit.JITFunction.run = None  #!\n")),
    ("torch flag", "monkeypatch", 8, module("torch.backends.cuda.matmul.allow_tf32 = True  #!\n")),
    ("interposed CUDA API", "monkeypatch", 8, module('SRC = """\ncudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {  #!\n  *ms = 0.f; return cudaSuccess;\n}\n"""\n')),
    ("exec", "exec", None, module(forward="exec('y = 1')  #!\nreturn launch(x)")),
    ("eval", "exec", None, module(forward="k = eval('launch')  #!\nreturn k(x)")),
    ("compile", "exec", None, module(forward="c = compile('1', 'f', 'eval')  #!\nreturn launch(x)")),
    ("pickle", "exec", None, module("import pickle  #!\n")),
    ("computed getattr", "dynamic-attr", None, module(forward="op = getattr(torch, 'mat' + 'mul')  #!\nreturn op(x, x)")),
    ("open", "file-io", 21, module(forward="secret = open('/etc/passwd').read()  #!\nreturn launch(x)")),
    ("pathlib", "file-io", 21, module("from pathlib import Path  #!\n")),
    ("tempfile", "file-io", 21, module("import tempfile  #!\n")),
    ("os.listdir", "file-io", 21, module("import os\n", forward="names = os.listdir('.')  #!\nreturn launch(x)")),
    ("os.write", "file-io", 21, module("import os\n", forward="os.write(4, b'{}')  #!\nreturn launch(x)")),
    ("os.path.exists", "file-io", 21, module("import os\n", forward="if os.path.exists('/tests/hidden'):  #!\n    pass\nreturn launch(x)")),
    ("torch.load", "file-io", 21, module(forward="ref = torch.load('expected.pt')  #!\nreturn ref")),
    ("fopen", "file-io", 21, module(cuda('  FILE* f = fopen("/tmp/out", "w");  #!'))),
    ("socket", "network", 21, module("import socket  #!\n")),
    ("urllib", "network", 21, module("import urllib.request  #!\n")),
    ("torch.hub", "network", 21, module(forward="m = torch.hub.load('a/b', 'c')  #!\nreturn launch(x)")),
    ("os.environ read", "environ", 21, module("import os\n", forward="key = os.environ.get('OPENAI_API_KEY')  #!\nreturn launch(x)")),
    ("os.getenv", "environ", 21, module("import os\nMODE = os.getenv('TRITON_INTERPRET')  #!\n")),
    ("from os import environ", "environ", 21, module("from os import environ  #!\n")),
    ("os.environ write", "environ", 21, module("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'  #!\n")),
    ("getenv in C++", "environ", 21, module(cuda('  const char* key = getenv("OPENAI_API_KEY");  #!'))),
    ("access policy window", "l2-persist", 18, module(cuda("  cudaStreamAttrValue a; a.accessPolicyWindow.base_ptr = nullptr;  #!"))),
    ("persisting limit", "l2-persist", 18, module(cuda("  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);  #!"))),
    ("persisting reset", "l2-persist", 18, module(cuda("  cudaCtxResetPersistingL2Cache();  #!"))),
    ("torch.matmul", "torch-compute", 16, module(forward="return torch.matmul(x, x)  #!")),
    ("F.softmax", "torch-compute", 16, module("import torch.nn.functional as F\n", forward="return F.softmax(x, dim=-1)  #!")),
    ("tensor method", "torch-compute", 16, module(forward="y = launch(x)\nreturn y.sum(-1)  #!")),
    ("aten op", "torch-compute", 16, module(forward="return torch.ops.aten.mm.default(x, x)  #!")),
    ("torch.cat", "torch-compute", 16, module(forward="y = launch(x)\nreturn torch.cat([y, y])  #!")),
    ("torch.where", "torch-compute", 16, module(forward="return torch.where(x > 0, launch(x), x)  #!")),
    ("index_select", "torch-compute", 16, module(forward="return launch(x).index_select(0, self.idx)  #!")),
    ("Tensor.add", "torch-compute", 16, module(forward="return torch.Tensor.add(launch(x), 1)  #!")),
    ("linalg", "torch-compute", 16, module(forward="return torch.linalg.norm(x)  #!")),
    ("op under another module", "torch-compute", 16, module(forward="return torch.nn.modules.activation.F.relu(x)  #!")),
    ("imported op", "torch-compute", 16, module("from torch import matmul  #!\n", forward="return launch(x)")),
    ("star import", "torch-compute", 16, module("from torch.nn.functional import *  #!\n")),
    ("op stored at build time", "torch-compute", 16, module(init="self.act = torch.relu  #!", forward="return self.act(launch(x))")),
    ("lambda built at init", "torch-compute", 16, module(init="self.f = lambda t: t.softmax(-1)  #!", forward="return self.f(x)")),
    ("helper called from forward", "torch-compute", 16, module("def helper(t):\n    return t.exp()  #!\n", forward="return helper(launch(x))")),
    ("helper called from init and forward", "torch-compute", 16, module(
        "def mask(n):\n    return torch.tril(torch.ones(n, n))  #!\n", init="self.m = mask(4)", forward="return launch(x) * mask(4)")),
    ("at::matmul in C++", "torch-compute", 16, module(cuda("  auto out = at::matmul(a, b);  #!"))),
    ("@ operator", "torch-compute", 16, module(forward="return launch(x) @ self.w.T  #!")),
    ("nn.Linear call", "torch-layer", 16, module(init="self.lin = nn.Linear(4, 4)", forward="return self.lin(x)  #!")),
    ("layer built in forward", "torch-layer", 16, module(forward="return nn.ReLU()(x)  #!")),
    ("imported layer built in forward", "torch-layer", 16, module("from torch.nn import Linear\n", forward="return Linear(4, 4)(x)  #!")),
    ("ModuleList item", "torch-layer", 16, module(init="self.layers = nn.ModuleList([nn.Linear(4, 4)])", forward="return self.layers[0](x)  #!")),
    ("torch.compile", "torch-compile", 16, module("fast = torch.compile(launch)  #!\n")),
    ("torch.compile+ops", "torch-compile", 16, module("fast = torch.compile(launch)  #!\n")),
    ("torchscript", "torch-compile", 16, module("scripted = torch.jit.script(launch)  #!\n")),
    ("dynamo", "torch-compile", 16, module("import torch._dynamo  #!\n")),
    ("numpy()", "array-export", 16, module(forward="host = x.cpu().numpy()  #!\nreturn launch(x)")),
    ("tolist()", "array-export", 16, module(forward="values = x.tolist()  #!\nreturn launch(x)")),
    ("flash_attn", "foreign-kernels", 16, module("from flash_attn import flash_attn_func  #!\n")),
    ("vllm op", "foreign-kernels", 16, module(forward="return torch.ops._C.rms_norm(x)  #!")),
    ("except Exception", "try-fallback", 16, module(forward="try:\n    return launch(x)\nexcept Exception:  #!\n    return x")),
    ("bare except", "try-fallback", 16, module(forward="try:\n    return launch(x)\nexcept:  #!\n    return x")),
    ("except RuntimeError", "try-fallback", 16, module(forward="try:\n    return launch(x)\nexcept RuntimeError:  #!\n    return x")),
    ("except tuple", "try-fallback", 16, module(forward="try:\n    return launch(x)\nexcept (KeyError, ValueError):  #!\n    return x")),
    ("except triton error", "try-fallback", 16, module(forward="try:\n    return launch(x)\nexcept triton.CompilationError:  #!\n    return x")),
    ("except own error", "try-fallback", 16, module("class Unsupported(Exception):\n    pass\n", forward="try:\n    return launch(x)\nexcept Unsupported:  #!\n    return x")),
    ("except ImportError around a build", "try-fallback", 16, module(
        "from torch.utils.cpp_extension import load_inline\ntry:\n    ext = load_inline('e', cpp_sources='')\nexcept ImportError:  #!\n    ext = None\n")),
    ("suppress", "try-fallback", 16, module("import contextlib\n", forward="with contextlib.suppress(Exception):  #!\n    return launch(x)\nreturn x")),
    ("swallowing __exit__", "try-fallback", 16, module("class Quiet:\n    def __enter__(self):\n        return self\n    def __exit__(self, *exc):  #!\n        return True\n")),
    ("dict cache", "output-cache", 11, module("CACHE = {}\n", forward="key = x.data_ptr()\nif key not in CACHE:\n    CACHE[key] = launch(x)\nreturn CACHE[key].clone()  #!")),
    ("dict.get cache", "output-cache", 11, module("CACHE = {}\n", forward="out = CACHE.get(tuple(x.shape))  #!\nif out is None:\n    out = launch(x)\nreturn out")),
    ("self cache", "output-cache", 11, module(init="self.seen = {}", forward="key = tuple(x.shape)\nif key not in self.seen:\n    self.seen[key] = launch(x)\nreturn self.seen[key]  #!")),
    ("lru_cache on the output path", "output-cache", 11, module(
        "import functools\n\n\n@functools.lru_cache(maxsize=None)  #!\ndef cached(t):\n    return launch(t)\n", forward="return cached(x)")),
    ("cached output buffer", "output-cache", 11, module(
        "from functools import lru_cache\n\n\n@lru_cache(None)\ndef buffer(shape):\n    return torch.empty(shape)\n",
        forward="out = buffer(tuple(x.shape))  #!\n_copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)\nreturn out")),
    ("Tensor subclass", "tensor-subclass", 7, module("class Lazy(torch.Tensor):  #!\n    pass\n")),
    ("__torch_function__", "tensor-subclass", 7, module("class Proxy:\n    def __torch_function__(self, func, types, args=(), kwargs=None):  #!\n        return func(*args)\n")),
    ("as_subclass", "tensor-subclass", 7, module(forward="return launch(x).as_subclass(nn.Parameter)  #!")),
    ("__class__ swap", "tensor-subclass", 7, module(forward="y = launch(x)\ny.__class__ = nn.Parameter  #!\nreturn y")),
    ("dispatch mode", "dispatch-hook", 10, module("from torch.utils._python_dispatch import TorchDispatchMode  #!\n")),
    ("torch function mode", "dispatch-hook", 10, module("from torch.overrides import TorchFunctionMode  #!\n")),
    ("aten override", "dispatch-hook", 10, module("lib = torch.library.Library('aten', 'IMPL')  #!\n")),
    ("TORCH_LIBRARY_IMPL aten", "dispatch-hook", 10, module('SRC = """\nTORCH_LIBRARY_IMPL(aten, CUDA, m) {  #!\n}\n"""\n')),
    ("reseed in forward", "rng-seed", 10, module(forward="torch.manual_seed(0)  #!\nreturn launch(x)")),
]


@pytest.mark.parametrize("case,rule,threat,source", CHEATS, ids=[c[0] for c in CHEATS])
def test_cheat_is_caught(case, rule, threat, source):
    result = screen(source, allow_torch_ops=case.endswith("+ops"))
    line = marked_line(source)
    assert not result.ok
    hits = [f for f in result.findings if f.rule == rule]
    assert hits, f"expected rule {rule}, got: {result.reason}"
    hit = next((f for f in hits if f.line == line), None)
    assert hit is not None, f"{rule} found on lines {[f.line for f in hits]}, expected line {line}"
    assert hit.threat == threat
    assert hit.message.startswith(f"line {line}: ")
    if threat is not None:
        assert f"(THREATS #{threat})" in hit.message


# Cheats that only the torch-ops policy forbids: with allow_torch_ops=True they pass the screen.
POLICY_ONLY = [c for c in CHEATS if c[1] in screen_rules.TORCH_POLICY_RULES]


@pytest.mark.parametrize("case,rule,threat,source", POLICY_ONLY, ids=[c[0] for c in POLICY_ONLY])
def test_torch_policy_rules_follow_the_task(case, rule, threat, source):
    assert screen(source, allow_torch_ops=True).ok, screen(source, allow_torch_ops=True).reason


@pytest.mark.parametrize("case,rule,threat,source", CHEATS, ids=[c[0] for c in CHEATS])
def test_allowing_torch_ops_only_removes_policy_findings(case, rule, threat, source):
    strict = {(f.line, f.rule) for f in screen(source, allow_torch_ops=False).findings}
    lenient = {(f.line, f.rule) for f in screen(source, allow_torch_ops=True).findings}
    assert lenient <= strict
    assert {r for _, r in strict - lenient} <= screen_rules.TORCH_POLICY_RULES


def test_every_rule_has_a_cheat():
    assert {c[1] for c in CHEATS} == set(screen_rules.RULES)


# ------------------------------------------------------------------------------------ honest code

HONEST_CUDA = r'''
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
os.environ.setdefault("MAX_JOBS", "4")

cuda_src = """
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

// one block per row; partial sums in shared memory
template <typename scalar_t>
__global__ void softmax_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int cols) {
    extern __shared__ float smem[];
    int row = blockIdx.x;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, (float)x[row * cols + c]);
    smem[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = fmaxf(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    m = smem[0];
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += __expf((float)x[row * cols + c] - m);
    __syncthreads();
    smem[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
        __syncthreads();
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[row * cols + c] = (scalar_t)(__expf((float)x[row * cols + c] - m) / smem[0]);
}

torch::Tensor softmax(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(xc.scalar_type(), "softmax", [&] {
        softmax_kernel<scalar_t><<<xc.size(0), 256, 256 * sizeof(float), stream>>>(
            xc.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), xc.size(1));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("softmax", &softmax, "row softmax");
}
"""

_ext = None


def _extension():
    global _ext
    if _ext is None:
        _ext = load_inline(name="softmax_ext", cpp_sources="", cuda_sources=cuda_src,
                           extra_cuda_cflags=["-O3", "--use_fast_math"])
    return _ext


class ModelNew(nn.Module):
    def forward(self, x):
        try:
            return _extension().softmax(x)
        except RuntimeError as e:
            raise RuntimeError(f"softmax extension failed: {e}") from e
'''

# The way KernelBench candidates are usually written: a module-level extension, functions= list.
HONEST_KERNELBENCH_CUDA = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

elementwise_add_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        out[idx] = a[idx] + b[idx];
    }
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    auto size = a.numel();
    auto out = torch::zeros_like(a);
    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;
    elementwise_add_kernel<<<num_blocks, block_size>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), size);
    return out;
}
"""

elementwise_add_cpp_source = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"

elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=elementwise_add_cpp_source,
    cuda_sources=elementwise_add_source,
    functions=["elementwise_add_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.elementwise_add = elementwise_add

    def forward(self, a, b):
        return self.elementwise_add.elementwise_add_cuda(a, b)
'''

# KernelBench level 2/3 style: parameters owned by nn layers built in __init__, a causal mask
# computed with torch at build time, an lru_cache'd launch configuration, libdevice fallback import.
HONEST_PARAMETERS = '''
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:
    from triton.language.math import libdevice


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int

    def __post_init__(self):
        object.__setattr__(self, "block_m", max(16, self.block_m))


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=64)
def _config(m: int, n: int) -> Config:
    return Config(block_m=min(128, triton.next_power_of_2(m)), block_n=64 if n % 64 == 0 else 32)


TUNED = {(16, 4096): Config(16, 128)}


@triton.autotune(configs=[triton.Config({"BLOCK_K": 64}, num_warps=4)], key=["K"])
@triton.jit
def _linear_gelu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, b)
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    y = 0.5 * acc * (1.0 + libdevice.erf(acc * 0.7071067811865476))
    y = y.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear_gelu(x, weight, bias):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    try:
        cfg = TUNED[(m, n)]
    except KeyError:
        cfg = _config(m, n)
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _linear_gelu_kernel[grid](x2, weight, bias, y, m, n, k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    return y.view(*x.shape[:-1], n)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))
        self.scale = 1.0 / math.sqrt(in_features)
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        with torch.no_grad():
            w = self.linear.weight
            if not w.is_contiguous():
                w = w.contiguous()
            return linear_gelu(x, w, self.linear.bias)


batch_size = 16
in_features = 64


def get_inputs():
    return [torch.randn(batch_size, in_features).abs()]


def get_init_inputs():
    return [in_features, 32]


if __name__ == "__main__":
    import time

    model = ModelNew(*get_init_inputs()).cuda()
    x = get_inputs()[0].cuda()
    start = time.perf_counter()
    torch.testing.assert_close(model(x), torch.nn.functional.gelu(model.linear(x)))
    print(time.perf_counter() - start)
'''

# Raw CUDA through NVRTC with cuda-python, launched on torch's current stream.
HONEST_NVRTC = '''
import numpy as np
import torch
import torch.nn as nn
from cuda.bindings import driver, nvrtc

SRC = b"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


def _compile():
    err, prog = nvrtc.nvrtcCreateProgram(SRC, b"scale.cu", 0, [], [])
    (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90"])
    err, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
    err, module = driver.cuModuleLoadData(ptx)
    err, kernel = driver.cuModuleGetFunction(module, b"scale")
    return kernel


_KERNEL = None


class ModelNew(nn.Module):
    def forward(self, x):
        global _KERNEL
        if _KERNEL is None:
            _KERNEL = _compile()
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        args = [np.array([x.data_ptr()], dtype=np.uint64), np.array([y.data_ptr()], dtype=np.uint64),
                np.array([2.0], dtype=np.float32), np.array([n], dtype=np.int32)]
        ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        stream = torch.cuda.current_stream().cuda_stream
        driver.cuLaunchKernel(_KERNEL, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, ptrs.ctypes.data, 0)
        return y
'''

# Many bookkeeping ops around one kernel; a method named like a torch op; in-place output.
HONEST_BOOKKEEPING = '''
import math
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _kernel(x_ptr, acc_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(acc_ptr + offs % 4, tl.exp(x).sum(axis=0) if EVEN else tl.sum(x, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = 1024

    def softmax(self, x):
        rows = x.view(-1, x.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        acc = torch.zeros(4, device=x.device, dtype=torch.float32)
        out = x.new_empty(x.shape).flatten().unsqueeze(0).squeeze(0)
        out.zero_()
        out.fill_(0.0)
        half = x.narrow(-1, 0, max(1, x.shape[-1] // 2)).transpose(0, -1).permute(*range(x.dim()))
        parts = x.chunk(2, dim=0) + x.split(1, dim=0) + x.unbind(0)
        scale = torch.full((1,), 1.0 / math.sqrt(x.shape[-1]), device=x.device).expand(x.shape[0])
        idx = torch.arange(x.shape[0], device=x.device).to(torch.int32)
        _ = (half, parts, scale, idx, x.numel(), x.is_contiguous(), x.data_ptr(), x.element_size())
        _kernel[(triton.cdiv(rows.numel(), self.block),)](rows, acc, rows.numel(), BLOCK=self.block)
        return out.view_as(x)

    def forward(self, x):
        return self.softmax(x)
'''

# Allowed when the task allows torch ops as glue around the candidate's own kernel.
GLUE = module(forward="y = launch(x)\nreturn torch.cat([y, y.sum(-1, keepdim=True)], dim=-1)")

HONEST = {
    "cuda load_inline": HONEST_CUDA,
    "kernelbench load_inline": HONEST_KERNELBENCH_CUDA,
    "parameters and cached config": HONEST_PARAMETERS,
    "nvrtc": HONEST_NVRTC,
    "bookkeeping": HONEST_BOOKKEEPING,
    "base": module(),
    "reraise": module(forward="try:\n    return launch(x)\nexcept Exception as e:\n    raise RuntimeError('kernel failed') from e"),
    "narrow except": module("CONFIG = {}\n", forward="try:\n    block = CONFIG[x.shape[-1]]\nexcept (KeyError, IndexError):\n    block = 1024\nreturn launch(x)"),
    "reseed at build time": module(init="torch.manual_seed(0)\nself.w = nn.Parameter(torch.randn(4))"),
    "clock at import": module("import time\n\nBUILT_AT = time.time()\n"),
    "imported layer for its parameters": module("from torch.nn import Linear\n", init="self.proj = Linear(4, 4)",
                                                forward="return launch(self.proj.weight)"),
    "config cache read": module("BLOCKS = {}\n", forward="block = BLOCKS.get(x.shape[-1], 1024)\ny = launch(x)\nreturn y"),
    "stream passed to kernel": module(forward="stream = torch.cuda.current_stream()\ndev = torch.cuda.current_device()\nreturn launch(x)"),
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_candidate_passes(name):
    result = screen(HONEST[name], allow_torch_ops=False)
    assert result.ok, result.reason
    assert result.reason == "no red flags" and result.findings == ()


def test_glue_ops_follow_the_task():
    assert screen(GLUE, allow_torch_ops=True).ok
    strict = screen(GLUE, allow_torch_ops=False)
    assert {f.rule for f in strict.findings} == {"torch-compute"}
    assert {f.line for f in strict.findings} == {len(GLUE.splitlines())}


SEEDS = [n for n in builtin_names() if load_task(n).seed_path is not None]


@pytest.mark.parametrize("name", SEEDS)
def test_builtin_seed_passes(name):
    task = load_task(name)
    result = screen(task.seed_path.read_text(), allow_torch_ops=False)
    assert result.ok, f"{name}: {result.reason}"


#: every seed on a GPU; on the CPU those the Triton interpreter can run
RUNNABLE_SEEDS = [n for n in SEEDS if torch.cuda.is_available() or load_task(n).interpreter_unsupported is None]


@pytest.mark.parametrize("name", RUNNABLE_SEEDS)
def test_builtin_seed_runs_only_bookkeeping_torch_ops(name, device):
    """The policy seen from the runtime side: an honest seed's forward, traced op by op, uses
    only ops that is_allowed_aten accepts, and launches its kernel."""
    from kernforge.tasks import runtime
    from kernforge.verifier import trace

    trace.install_launch_hooks()
    task = load_task(name)
    shape = (task.cpu_public_shapes if device == "cpu" else task.public_shapes)[0]
    module = runtime.load_module(task.seed_path, fresh=True)
    inputs = runtime.make_inputs(task, shape, task.distributions[0], 0, device)
    model = runtime.build_model(module.ModelNew, runtime.make_init_inputs(task, shape), 0, device)
    with trace.recording() as rec:
        model(*inputs)
    assert rec.launches, "the seed launched no kernel"
    assert [op for op in rec.ops if not is_allowed_aten(op)] == []


@pytest.mark.parametrize("name", builtin_names())
def test_reference_copied_into_modelnew_follows_the_policy(name):
    """The KernelBench way to cheat: the task's own reference submitted as the candidate."""
    task = load_task(name)
    source = re.sub(r"\bclass Model\b", "class ModelNew", task.reference_source)
    result = screen(source, allow_torch_ops=task.allow_torch_ops)
    if task.allow_torch_ops:
        assert result.ok, result.reason
        return
    if not result.ok:
        assert {f.rule for f in result.findings} <= screen_rules.TORCH_POLICY_RULES, result.reason
        return
    # Only Python operators (x * y, x[idx]) left: those are judged by the runtime trace.
    forward = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert any(isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Subscript)) for n in ast.walk(forward))


# ------------------------------------------------------------------------------- result format


def test_reason_is_one_line_and_names_the_first_finding():
    source = module("import threading\nT = threading.Thread(target=print)\nimport socket\n", forward="return torch.relu(x)")
    result = screen(source, allow_torch_ops=False)
    assert "\n" not in result.reason
    assert result.reason.startswith(result.findings[0].message)
    assert "and 2 more" in result.reason and "network" in result.reason and "torch-compute" in result.reason
    assert result.threat == result.findings[0].threat == 6
    assert [f.line for f in result.findings] == sorted(f.line for f in result.findings)


def test_finding_round_trips_to_dict():
    result = screen(module("from threading import Thread  #!\n"), allow_torch_ops=False)
    data = result.to_dict()
    assert data["ok"] is False and data["reason"] == result.reason
    assert Finding(**data["findings"][0]) == result.findings[0]
    assert ScreenResult.of([]) == ScreenResult(True, "no red flags")


def test_message_quotes_the_code_and_the_threat():
    source = module(forward="s = torch.cuda.Stream()  #!\nreturn launch(x)")
    line = marked_line(source)
    (finding,) = screen(source, allow_torch_ops=True).findings
    assert finding.message == (f"line {line}: `torch.cuda.Stream()` creates or switches to a side stream "
                               "(THREATS #5): work on another stream escapes the timer")


def test_syntax_error_names_its_line():
    result = screen("import torch\n\ndef f(:\n    pass\n", allow_torch_ops=True)
    assert [f.rule for f in result.findings] == ["syntax"]
    assert result.findings[0].line == 3 and result.reason.startswith("line 3: syntax error")


def test_main_block_is_screened_when_name_is_reassigned():
    source = module('__name__ = "__main__"\nif __name__ == "__main__":\n    import socket\n')
    rules = {f.rule for f in screen(source, allow_torch_ops=True).findings}
    assert {"network", "introspection"} <= rules


def test_kernel_bodies_are_not_torch_code():
    # Triton tensors have methods named like torch ops (.to, .sum); inside a kernel they are Triton.
    source = BASE.replace("tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)",
                          "v = tl.load(x_ptr + offs, mask=offs < n)\n    tl.store(y_ptr + offs, v.exp().to(tl.float32), mask=offs < n)")
    assert "v.exp()" in source
    assert screen(source + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return launch(x)\n",
                  allow_torch_ops=False).ok


# ---------------------------------------------------------------------------- the rule table


def _documented_rules() -> set[str]:
    doc = screen_module.__doc__ or ""
    table = doc.split("=" * 19, 1)[1]
    return {m.group(1) for m in re.finditer(r"^([a-z0-9-]+)\s+(?:\d+|-)\s", table, re.M)}


#: where each reporting call takes its rule id: report(node, RULE, ...), _finding(line, col, RULE, ...),
#: _add(RULE, what, ...), _tok(regex, RULE, ...)
_RULE_ARG = {"report": 1, "_finding": 2, "_add": 0, "_tok": 1}


def _emitted_rules() -> tuple[set[str], list[str]]:
    """Rule ids written literally where the screen reports, plus those its tables hold; and the
    reporting calls whose rule is neither a literal nor taken from a table (must be none)."""
    emitted: set[str] = set()
    for mod in (screen_module, screen_rules):
        tree = ast.parse(open(mod.__file__).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                pos = _RULE_ARG.get(name)
                if pos is not None and len(node.args) > pos and isinstance(node.args[pos], ast.Constant):
                    emitted.add(node.args[pos].value)
            if isinstance(node, ast.FunctionDef) and node.name == "os_rule":
                emitted.update(r.value.elts[0].value for r in ast.walk(node)
                               if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple))
    emitted.update(rule for rule, _ in screen_rules.PATH_RULES.values())
    emitted.update(t.rule for t in screen_rules.CUDA_TOKENS)
    return emitted


def test_every_rule_is_documented():
    documented = _documented_rules()
    assert documented == set(screen_rules.RULES), "the docstring table and RULES disagree"
    emitted = _emitted_rules()
    assert emitted <= set(screen_rules.RULES), f"undeclared rule ids: {sorted(emitted - set(screen_rules.RULES))}"
    assert set(screen_rules.RULES) <= emitted, f"rules nothing emits: {sorted(set(screen_rules.RULES) - emitted)}"
    for rule, spec in screen_rules.RULES.items():
        line = next(l for l in (screen_module.__doc__ or "").splitlines() if l.startswith(rule + " "))
        assert line.split()[1] == (str(spec.threat) if spec.threat is not None else "-"), rule


# ---------------------------------------------------------------------------- torch ops policy


@pytest.mark.parametrize("spelling,expected", [
    ("aten::mm", ("aten", "mm", "")),
    ("aten::mm.out", ("aten", "mm", "out")),
    ("aten.mm.default", ("aten", "mm", "default")),
    ("torch.ops.aten.add_.Tensor", ("aten", "add_", "Tensor")),
    ("mm", ("aten", "mm", "")),
    ("myext::fused_norm", ("myext", "fused_norm", "")),
])
def test_parse_op_name(spelling, expected):
    assert parse_op_name(spelling) == expected


def test_parse_op_name_accepts_op_overloads():
    assert parse_op_name(torch.ops.aten.mm.default) == ("aten", "mm", "")
    assert not is_allowed_aten(torch.ops.aten.mm.default)
    assert is_allowed_aten(torch.ops.aten.view.default)


@pytest.mark.parametrize("op", [
    "aten::empty.memory_format", "aten::empty_like", "aten::empty_strided", "aten::zeros", "aten::full",
    "aten::arange.start_step", "aten::new_empty", "aten::view", "aten::_reshape_alias", "aten::_unsafe_view",
    "aten::as_strided", "aten::permute", "aten::transpose.int", "aten::t", "aten::expand", "aten::squeeze.dim",
    "aten::unsqueeze", "aten::select.int", "aten::slice.Tensor", "aten::split.Tensor", "aten::unbind.int",
    "aten::detach", "aten::alias", "aten::clone", "aten::copy_", "aten::_to_copy", "aten::fill_.Scalar",
    "aten::zero_", "aten::lift_fresh", "aten::_local_scalar_dense", "aten.view.dtype",
    "prims::view_of", "higher_order.triton_kernel_wrapper_mutation", "mylib::my_kernel",
])
def test_bookkeeping_aten_ops_are_allowed(op):
    assert is_allowed_aten(op)


@pytest.mark.parametrize("op", [
    "aten::mm", "aten::bmm", "aten::addmm", "aten::linear", "aten::add.Tensor", "aten::mul_.Tensor",
    "aten::sum.dim_IntList", "aten::_softmax", "aten::relu", "aten::gelu", "aten::index_put_", "aten::scatter.src",
    "aten::gather", "aten::index_select", "aten::index.Tensor", "aten::cat", "aten::stack", "aten::sort",
    "aten::topk", "aten::where.self", "aten::masked_fill_.Scalar", "aten::flip", "aten::constant_pad_nd",
    "aten::_scaled_dot_product_flash_attention", "prims::mul", "quantized::linear", "_C::rms_norm",
    "flash_attn::fwd", "higher_order.cond",
])
def test_compute_aten_ops_are_forbidden(op):
    assert not is_allowed_aten(op)


def test_every_allowed_aten_name_is_a_real_op():
    """No typos: each name is a registered op, or (metadata calls such as ``numel`` that some
    torch versions answer without the dispatcher) a torch function or tensor method."""
    registered = {n.split(".")[0] for n in torch._C._dispatch_get_all_op_names()}
    unknown = {n for n in torch_ops.ALLOWED_ATEN
               if f"aten::{n}" not in registered and not hasattr(torch.Tensor, n) and not hasattr(torch, n)}
    assert unknown == set()
    assert {n for n in torch_ops.ALLOWED_PRIMS if f"prims::{n}" not in registered} == set()


class _Trace(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def _traced(fn) -> list[str]:
    trace = _Trace()
    with trace:
        fn()
    return trace.ops


X = torch.randn(4, 6)
BOOKKEEPING_CALLS = {
    "reshape": lambda: X.reshape(2, 12), "reshape copy": lambda: X.t().reshape(24),
    "contiguous": lambda: X.t().contiguous(), "empty_like": lambda: torch.empty_like(X),
    "empty": lambda: torch.empty((3, 4), dtype=torch.float16), "zeros": lambda: torch.zeros(3),
    "full": lambda: torch.full((2,), 3.0), "arange": lambda: torch.arange(10), "view": lambda: X.view(-1),
    "to": lambda: X.to(torch.float64), "half": lambda: X.half().float(), "narrow": lambda: X.narrow(0, 1, 2),
    "chunk": lambda: X.chunk(2), "split": lambda: X.split(2), "unbind": lambda: X.unbind(0),
    "flatten": lambda: X.flatten(), "expand": lambda: X[0].expand(4, 6), "unsqueeze": lambda: X.unsqueeze(0),
    "new_zeros": lambda: X.new_zeros(3), "new_empty": lambda: X.new_empty(3),
    "fill_": lambda: torch.empty(3).fill_(1), "zero_": lambda: torch.empty(3).zero_(),
    "clone": lambda: X.clone(), "copy_": lambda: torch.empty(4, 6).copy_(X), "detach": lambda: X.detach(),
    "item": lambda: X[0, 0].item(), "tensor": lambda: torch.tensor([1, 2, 3]), "index int": lambda: X[0],
    "slice": lambda: X[:, 1:3], "permute": lambda: X.permute(1, 0), "transpose": lambda: X.transpose(0, 1),
    "as_strided": lambda: X.as_strided((2, 2), (1, 1)), "empty_strided": lambda: torch.empty_strided((2, 2), (1, 2)),
    "randn": lambda: torch.randn(3), "view dtype": lambda: X.view(torch.int32), "movedim": lambda: X.movedim(0, 1),
    "unflatten": lambda: X.unflatten(1, (2, 3)), "select": lambda: X.select(1, 0), "ellipsis": lambda: X[..., None],
    "type": lambda: X.type(torch.float64), "linspace": lambda: torch.linspace(0, 1, 5), "eye": lambda: torch.eye(3),
    "uniform_": lambda: torch.empty(3).uniform_(), "resize_": lambda: torch.empty(0).resize_(3),
}
COMPUTE_CALLS = {
    "add": lambda: X + 1, "matmul": lambda: X @ X.t(), "sum": lambda: X.sum(), "cat": lambda: torch.cat([X, X]),
    "index": lambda: X[torch.tensor([0, 1])], "mask": lambda: X[X > 0], "softmax": lambda: X.softmax(-1),
    "where": lambda: torch.where(X > 0, X, 0), "linear": lambda: torch.nn.functional.linear(X, X),
    "flip": lambda: X.flip(0), "setitem": lambda: X.clone().__setitem__(torch.tensor([0]), 1.0),
    "compare": lambda: X > 0, "neg": lambda: -X, "pad": lambda: torch.nn.functional.pad(X, (1, 1)),
    "stack": lambda: torch.stack([X, X]), "topk": lambda: X.topk(2), "gather": lambda: X.gather(1, torch.zeros(4, 1, dtype=torch.long)),
}


@pytest.mark.parametrize("name", sorted(BOOKKEEPING_CALLS))
def test_python_bookkeeping_reaches_only_allowed_aten_ops(name):
    ops = _traced(BOOKKEEPING_CALLS[name])
    assert all(is_allowed_aten(op) for op in ops), ops


@pytest.mark.parametrize("name", sorted(COMPUTE_CALLS))
def test_python_compute_reaches_a_forbidden_aten_op(name):
    ops = _traced(COMPUTE_CALLS[name])
    assert any(not is_allowed_aten(op) for op in ops), ops


@pytest.mark.parametrize("dotted,kind", [
    ("torch.matmul", "compute"), ("torch.cat", "compute"), ("torch.where", "compute"),
    ("torch.nn.functional.relu", "compute"), ("torch.nn.functional.pad", "compute"),
    ("torch.special.erf", "compute"), ("torch.linalg.norm", "compute"), ("torch.Tensor.sort", "compute"),
    ("torch.ops.aten.mm.default", "compute"), ("torch._C._nn.linear", "compute"),
    ("torch.autograd.grad", "compute"), ("torch.nn.Linear", "layer"), ("torch.nn.GELU", "layer"),
    ("torch.nn.modules.linear.Linear", "layer"), ("torch.nn.modules.activation.F.gelu", "compute"),
    ("torch.functional.F.softmax", "compute"),
    ("torch.empty_like", None), ("torch.empty", None), ("torch.zeros", None), ("torch.arange", None),
    ("torch.tensor", None), ("torch.as_strided", None), ("torch.Tensor.view", None), ("torch.Tensor", None),
    ("torch.float8_e4m3fn", None), ("torch.cuda.current_stream", None), ("torch.no_grad", None),
    ("torch.finfo", None), ("torch.Size", None), ("torch.nn.Module", None), ("torch.nn.Parameter", None),
    ("torch.nn.ModuleList", None), ("torch.nn.init.normal_", None), ("torch.nn.functional", None),
    ("torch.ops.aten.view.default", None), ("torch.ops.mylib.fused", None), ("torch.autograd.Function", None),
    ("torch.utils.cpp_extension.load_inline", None), ("torch.library.custom_op", None),
])
def test_torch_reference_kind(dotted, kind):
    assert torch_reference_kind(dotted.split(".")) == kind


def test_every_named_utility_exists():
    assert [n for n in torch_ops.TORCH_UTILITIES if not hasattr(torch, n)] == []
    assert [n for n in torch_ops.NN_CONTAINERS if not hasattr(torch.nn, n)] == []


def test_every_functional_op_is_compute():
    import torch.nn.functional as F

    names = [n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n))
             and not isinstance(getattr(F, n), type) and getattr(getattr(F, n), "__module__", "").startswith("torch")]
    assert len(names) > 50
    not_compute = [n for n in names if torch_reference_kind(("torch", "nn", "functional", n)) != "compute"]
    assert not_compute == []


@pytest.mark.parametrize("name,compute", [
    ("sum", True), ("mean", True), ("exp", True), ("matmul", True), ("softmax", True), ("masked_fill_", True),
    ("index_select", True), ("view", False), ("reshape", False), ("contiguous", False), ("to", False),
    ("float", False), ("item", False), ("copy_", False), ("numel", False), ("data_ptr", False),
    ("stride", False), ("split", False),
    # names Python's own types share (set.add, list.sort): only the runtime trace can tell
    ("add", False), ("sort", False),
    # operators are judged by the runtime trace
    ("__add__", False),
])
def test_tensor_method_is_compute(name, compute):
    assert tensor_method_is_compute(name) is compute
