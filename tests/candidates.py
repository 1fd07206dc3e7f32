"""Candidate sources for the verifier's tests: one honest RMSNorm kernel, and cheats built from it.

Each cheat commits one THREATS.md class. ``SCREENED`` cheats are caught by the static screen;
``RUNTIME`` cheats are run with the static screen switched off, to show that the runtime
defence catches them on its own (defence in depth: each layer is tested alone).
"""

from __future__ import annotations

from dataclasses import dataclass

KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(x_ptr, w_ptr, y_ptr, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


def norm(x, w, rows=None):
    x = x.contiguous()
    y = torch.empty_like(x)
    _norm_kernel[(rows or x.shape[0],)](x, w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''

HONEST = KERNEL + '''

class ModelNew(nn.Module):
    def forward(self, x, w):
        return norm(x, w)
'''


RELU_KERNEL = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    _relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
'''

HONEST_RELU = RELU_KERNEL + '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu(x)
'''

#: The KernelBench way to cheat: the reference itself copied into ModelNew.
REFERENCE_COPY_RELU = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)
'''


def with_forward(body: str, prelude: str = "") -> str:
    """The honest kernel with another ``forward`` body (indented by the caller as 8 spaces)."""
    return KERNEL + prelude + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n" + body + "\n"


@dataclass(frozen=True)
class Cheat:
    """A cheating candidate and the verdict its runtime defence must give (status, threat).

    ``static_threat`` is set when the static screen also catches it: then the cheat is run twice,
    once as usual (expecting ``static_rejected`` with that class) and once with the screen off
    (expecting the runtime verdict)."""

    name: str
    source: str
    status: str
    threat: int | None
    static_threat: int | None = None
    #: which test task (tests/tasks/) it is written for
    task: str = "tiny_norm"
    #: other classes equally right: with the reference in another process there is nothing stale
    #: to inherit, and the rows never computed hold the poison (#1) or zeros (#3, "only part of
    #: the output was computed"), whichever memory the allocator handed out
    also: tuple[int, ...] = ()


CHEATS = [
    Cheat("degenerate_zeros", with_forward(
        "        y = norm(x, w)\n        y.zero_()\n        return y"), "incorrect", 2),
    Cheat("partial_rows", with_forward(
        "        y = torch.zeros_like(x)\n"
        "        _norm_kernel[(max(1, x.shape[0] // 2),)](x.contiguous(), w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))\n"
        "        return y"), "incorrect", 3),
    Cheat("mutates_input", with_forward(
        "        y = norm(x, w)\n        x.zero_()\n        return y"), "cheat", 4),
    Cheat("background_thread", with_forward(
        "        y = torch.empty_like(x)\n"
        "        def later():\n            time.sleep(0.005)\n            y.copy_(norm(x, w))\n"
        "        threading.Thread(target=later).start()\n        return y",
        prelude="\nimport threading, time\n"), "cheat", 6, static_threat=6),
    Cheat("lazy_subclass", with_forward(
        "        return norm(x, w).as_subclass(Lazy)",
        prelude="\n\nclass Lazy(torch.Tensor):\n    pass\n"), "cheat", 7, static_threat=7),
    Cheat("timer_patch", with_forward(
        "        return norm(x, w)", prelude="\nimport time\ntime.perf_counter = lambda: 0.0\n"), "cheat", 8, static_threat=8),
    Cheat("forged_result", with_forward(
        "        os.write(4, struct.pack('>I', 2) + b'{}')\n        return norm(x, w)",
        prelude="\nimport os, struct\n"), "cheat", 9, static_threat=21),
    Cheat("harness_tamper", with_forward(
        "        return norm(x, w)",
        prelude="\nimport kernforge.verifier.arena as _a\n_a.Arena.ref_of = lambda self, t: None\n"), "cheat", 10, static_threat=10),
    Cheat("cache_by_shape", with_forward(
        "        key = tuple(x.shape)\n"
        "        y = norm(x, w)  # a kernel runs every call, but the first answer is kept\n"
        "        return CACHE.setdefault(key, y)",
        prelude="\nCACHE = {}\n"), "incorrect", 11, static_threat=11),
    Cheat("defer_one_call", with_forward(
        "        key = tuple(x.shape)\n"
        "        y = norm(x, w)\n"
        "        out = PREVIOUS.get(key, y)\n"
        "        PREVIOUS[key] = y\n"
        "        return out",
        prelude="\nPREVIOUS = {}\n"), "incorrect", 12, static_threat=11),
    Cheat("phase_detect", with_forward(
        "        CALLS[0] += 1\n"
        "        y = norm(x, w)\n"
        "        if CALLS[0] > LIMIT:\n            y.zero_()\n"
        "        return y",
        prelude="\nCALLS = [0]\nLIMIT = 2 * 3  # the public checks: 2 shapes x (2 distributions + a repeat)\n"), "incorrect", 2),
    Cheat("public_shapes_only", with_forward(
        "        y = torch.empty_like(x)\n"
        "        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, 64 if x.shape[1] < 128 else 128, 1e-6, BLOCK=128)\n"
        "        return y"), "incorrect", 14),
    Cheat("bf16_inside", KERNEL.replace(
        "x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)",
        "x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.bfloat16).to(tl.float32)")
        + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        return norm(x, w)\n", "incorrect", 15),
    # tf32 by hand: x's float32 bit pattern cut to tf32's 10 mantissa bits, truncated (what a
    # tensor core does with a float32 operand it is not asked to round) and rounded to nearest
    Cheat("tf32_truncated_inside", KERNEL.replace(
        "x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)",
        "x = (tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)"
        " & -8192).to(tl.float32, bitcast=True)")
        + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        return norm(x, w)\n", "incorrect", 15),
    Cheat("tf32_rounded_inside", KERNEL.replace(
        "x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)",
        "x = ((tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32).to(tl.int32, bitcast=True)"
        " + 4096) & -8192).to(tl.float32, bitcast=True)")
        + "\n\nclass ModelNew(nn.Module):\n    def forward(self, x, w):\n        return norm(x, w)\n", "incorrect", 15),
    Cheat("torch_compute", with_forward(
        "        xf = x.float()\n        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)"),
        "cheat", 16, static_threat=16),
    Cheat("try_fallback", with_forward(
        "        try:\n            raise RuntimeError('pretend the kernel failed')\n        except Exception:\n"
        "            xf = x.float()\n            return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w"),
        "cheat", 16, static_threat=16),
    Cheat("ghost_passthrough", with_forward("        return x"), "cheat", 17),
    Cheat("ghost_clone", with_forward("        return x.clone()"), "cheat", 17),
    Cheat("nondeterministic", with_forward(
        "        STATE[0] += 1\n        y = torch.empty_like(x)\n"
        "        eps = 1e-6 if STATE[0] % 2 else 1.0\n"
        "        _norm_kernel[(x.shape[0],)](x.contiguous(), w, y, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))\n"
        "        return y",
        prelude="\nSTATE = [0]\n"), "incorrect", 19),
    Cheat("shrinks_task", RELU_KERNEL + """
from kernforge.tasks import runtime as _rt
for _m in list(_rt._MODULES.values()):
    if hasattr(_m, "batch_size"):
        _m.get_inputs = lambda: [torch.randn(1, 8)]


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
""", "cheat", 22, static_threat=10, task="kb_relu"),
]


#: GPU-only cheats: they need a device, streams or CUDA graphs to cheat at all.
GPU_CHEATS = [
    Cheat("side_stream", with_forward(
        "        y = torch.empty_like(x)\n"
        "        SIDE.wait_stream(torch.cuda.current_stream())  # inputs ready, but never joined back\n"
        "        with torch.cuda.stream(SIDE):\n"
        "            _norm_kernel[(x.shape[0],)](x, w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))\n"
        "        return y",
        prelude="\nSIDE = torch.cuda.Stream()\n"), "cheat", 5, static_threat=5),
    Cheat("host_thread", with_forward(
        "        y = torch.empty_like(x)\n"
        "        def later():\n            time.sleep(0.01)\n            y.copy_(norm(x, w))\n"
        "        threading.Thread(target=later).start()\n        return y",
        prelude="\nimport threading, time\n"), "cheat", 6, static_threat=6),
    Cheat("defer_one_call_gpu", with_forward(
        "        key = tuple(x.shape)\n"
        "        y = norm(x, w)\n"
        "        out = PREVIOUS.get(key, y)\n"
        "        PREVIOUS[key] = y\n"
        "        return out",
        prelude="\nPREVIOUS = {}\n"), "incorrect", 12, static_threat=11),
    Cheat("l2_pinning", with_forward(
        "        _CUDART.cudaDeviceSetLimit(6, ctypes.c_size_t(8 << 20))  # cudaLimitPersistingL2CacheSize\n"
        "        return norm(x, w)",
        prelude="\nimport ctypes\n_CUDART = ctypes.CDLL(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcudart' in l})[0])\n"),
        "cheat", 18, static_threat=21),
    Cheat("capture_detect", with_forward(
        "        if torch.cuda.is_current_stream_capturing():\n            return torch.empty_like(x)\n"
        "        return norm(x, w)"), "cheat", 13, static_threat=13),
    Cheat("stale_device_memory", with_forward(
        "        y = torch.empty_like(x)\n"
        "        _norm_kernel[(max(1, x.shape[0] // 2),)](x.contiguous(), w, y, x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))\n"
        "        return y"), "incorrect", 1, also=(3,)),
]

#: An honest float32 matrix-vector product that is out of tolerance all the same: every output is
#: one running float32 sum over K terms, term after term (numpy's cumsum under the interpreter, as
#: a GPU's FMA chain in ``tl.dot(..., input_precision="ieee")``). With K = 2^20 positive terms
#: the sum drifts by about 2^-12.7 relative, the size of a tf32 rounding, yet no precision was
#: lowered: it must be rejected as incorrect, never accused of THREATS #15.
SEQUENTIAL_MATVEC = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _matvec_kernel(a_ptr, b_ptr, y_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        inside = k + cols < K
        a = tl.load(a_ptr + rows[:, None] * K + k + cols[None, :], mask=(rows[:, None] < M) & inside[None, :], other=0.0)
        b = tl.load(b_ptr + k + cols, mask=inside, other=0.0)
        # The running total enters as the first term of the block, so the prefix sum carries one
        # float32 sum per row through the whole of K; its last column is the new total.
        terms = a * b[None, :] + tl.where(cols[None, :] == 0, acc[:, None], 0.0)
        running = tl.cumsum(terms, axis=1)
        acc = tl.sum(tl.where(cols[None, :] == BLOCK_K - 1, running, 0.0), axis=1)
    tl.store(y_ptr + rows, acc, mask=rows < M)


def matvec(a, b):
    a, b = a.contiguous(), b.contiguous()
    m, k = a.shape
    y = torch.empty(m, 1, device=a.device, dtype=torch.float32)
    _matvec_kernel[(triton.cdiv(m, 16),)](a, b, y, m, k, BLOCK_M=16, BLOCK_K=min(65536, triton.next_power_of_2(k)))
    return y


class ModelNew(nn.Module):
    def forward(self, A, B):
        return matvec(A, B)
'''

#: Honest kernels out of tolerance: rejected as incorrect, with no threat named (name, source, task).
INACCURATE = [("sequential_fp32_sum", SEQUENTIAL_MATVEC, "long_matvec")]

#: An honest CUDA C++ candidate (load_inline): kernels need not be Triton.
HONEST_CUDA = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

// One block per row; float accumulation whatever the storage type.
__global__ void rms_norm_rows(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int H, float eps) {
    extern __shared__ float partial[];
    const int row = blockIdx.x;
    float acc = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = __bfloat162float(x[row * H + i]);
        acc += v * v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = rsqrtf(partial[0] / H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = __bfloat162float(x[row * H + i]) * inv * __bfloat162float(w[i]);
        y[row * H + i] = __float2bfloat16(v);
    }
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int rows = xc.size(0), H = xc.size(1), threads = 256;
    rms_norm_rows<<<rows, threads, threads * sizeof(float), at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(xc.data_ptr()), reinterpret_cast<const __nv_bfloat16*>(w.data_ptr()),
        reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), H, 1e-6f);
    return y;
}
"""

_ext = load_inline(name="kf_rms_norm_cuda", cpp_sources="torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w);",
                   cuda_sources=CUDA_SRC, functions=["rms_norm"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x, w):
        return _ext.rms_norm(x, w)
'''
