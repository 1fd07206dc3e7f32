"""kernforge's Triton GEMM, standing in for the ATen GEMMs Inductor's wrapper calls.

Inductor hands a matmul to ATen (``extern_kernels.mm / addmm / bmm / baddbmm`` with an ``out=``
buffer) unless it autotunes its own templates, which a capture without a GPU does not. An
Inductor start must be Triton throughout, so each such call becomes a launch of the one GEMM
kernel written here (``SOURCE``: the kernel and its launcher, put into the start once):

* tiles of ``BLOCK_M x BLOCK_N``, stepping ``BLOCK_K`` along K, programs in grouped order
  (``GROUP_M`` rows of tiles are walked column by column, so the B tiles a group shares are
  still in L2 when its next row of tiles reads them);
* the accumulator is float32 whatever the inputs; float32 inputs multiply with
  ``input_precision="ieee"``: TF32 (Triton's default for float32 on a GPU) keeps 10 mantissa
  bits and misses the judge's float32 tolerance (bench/kernelbench/README.md); 16-bit inputs use
  the default (their tensor-core product is exact into float32);
* every size is masked (any M, N, K), every stride is an argument (``reinterpret_tensor``'s
  transposed weight views work as they are), and pointer offsets are int64: KernelBench operands
  hold more than 2**31 elements in places;
* a batch axis (program id 1) for ``bmm``/``baddbmm``; ``mm``/``addmm`` are a batch of one;
* ``out = alpha * (a @ b) + beta * bias``, the bias broadcast to ``out`` by ``expand`` (its
  broadcast axes get stride 0); ``beta == 0`` reads no bias (ATen ignores it then, NaNs included).

Split-K, where K is long for the number of output tiles (a matrix-vector product: M=2048,
K=2**20, N=1 is 16 tiles of 128 rows). One program walking all of K leaves the GPU nearly idle,
and its float32 sum over a million products drifts past the judge's 1e-4 relative tolerance
(about 2e-4 on an H200, where cuBLAS's split reduction is accurate). Program id 2 then takes a
slice of ``TILE_K`` along K; each program writes its float32 partial tile, before alpha and the
bias, to a workspace of ``(split, batch, M, N)`` (``torch.empty`` in the launcher), and a second
kernel, ``_kf_gemm_sum``, adds each element's partials in split order (fixed: the same sum every
run) and applies the epilogue: alpha, the bias as above, the output's dtype and strides. Where K
needs no split the one kernel stores the epilogue itself, with no workspace and no second launch.
``TILE_K`` is the slice that gives about ``SPLIT_PROGRAMS`` programs in all, a power of two held
between ``TILE_K_MIN`` and the cap ``TILE_K`` of ``BLOCKS``; why those bounds: in the launcher.

Compiles. Triton compiles a kernel afresh for each pattern of its integer arguments (a multiple of
16, equal to 1, or neither) and each set of its constexprs, 1-3 s apiece for this GEMM; the hidden
shapes of one KernelBench GEMM made seven or eight, 12-17 s of every verdict's and every audit's
checked calls on the H200. A start's static path (the timed shape alone) launches ``_kf_gemm``,
specialised; its dynamic path (every other shape) launches ``_kf_gemm_any`` (``general=True``), the
same kernel with no specialisation on sizes and strides, and a call that does not split K passes
the cap as ``TILE_K``, so those share one compile: two to four compiles per verdict
(bench/kernelbench/README.md).

The block sizes are literals in the launcher, one assignment each, so the offline tuner's knob
analysis (``loop/knobs.py``) finds and moves them like an Inductor kernel's ``XBLOCK``; they
start from ``BLOCKS`` for the device: small on the CPU interpreter (fewer, larger numpy steps, and
split thresholds small enough for a test to reach), 128 x 128 x 32 with 8 warps and 3 pipeline
stages on an H100/H200. ``TILE_K``'s cap is a knob too (``min(..., cap)``, with ``TILE_K_MIN``
its floor); ``SPLIT_PROGRAMS`` and ``TILE_K_MIN`` are fixed: the knob analysis moves only what
feeds a kernel's constexpr or launch option, and each is one term of the computed ``TILE_K``.
"""

from __future__ import annotations

import ast

#: Starting tile sizes and launch options per device kind; the offline tuner moves them from here.
#: ``TILE_K``, ``TILE_K_MIN`` and ``SPLIT_PROGRAMS`` bound split-K (the launcher says why); on the CPU
#: they are small so that the interpreter takes the split path at sizes a test can afford.
BLOCKS = {"cpu": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 1,
                  "TILE_K": 4096, "TILE_K_MIN": 512, "SPLIT_PROGRAMS": 8},
          "cuda": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
                   "TILE_K": 16384, "TILE_K_MIN": 1024, "SPLIT_PROGRAMS": 264}}
LAUNCHER = "_launch_kf_gemm"
#: ATen's argument order for each call Inductor emits (after the bias, keywords alpha/beta/out)
CALLS = {"extern_kernels.mm": ("a", "b"), "extern_kernels.bmm": ("a", "b"),
         "extern_kernels.addmm": ("bias", "a", "b"), "extern_kernels.baddbmm": ("bias", "a", "b")}

_KERNEL = '''
# ---- kernforge's GEMM (loop/inductor_gemm.py), for the ATen GEMMs in Inductor's wrapper ----
@triton.jit
def _kf_gemm(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
             stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
             stride_cs, stride_cb, stride_cm, stride_cn, stride_xb, stride_xm, stride_xn,
             alpha, beta, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, SPLIT: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
             TILE_K: tl.constexpr):
    # Grouped order: GROUP_M rows of tiles are walked column by column, so the B tiles a group
    # shares are still in L2 when its next row reads them.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    # int64 offsets: one operand can hold more than 2**31 elements.
    batch = tl.program_id(1).to(tl.int64)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    a_rows = a_ptr + batch * stride_ab + rm[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + rn[None, :] * stride_bn
    k_lo = 0
    k_hi = K
    if SPLIT:  # program id 2 takes one slice of K; its partial sum goes to the workspace c
        k_lo = tl.program_id(2) * TILE_K
        k_hi = tl.minimum(k_lo + TILE_K, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        # masked tails: a row, column or k past the end (of K or of the slice) reads 0 and adds nothing
        a = tl.load(a_rows + rk.to(tl.int64)[None, :] * stride_ak, mask=(rm[:, None] < M) & (rk[None, :] < k_hi),
                    other=0.0)
        b = tl.load(b_cols + rk.to(tl.int64)[:, None] * stride_bk, mask=(rk[:, None] < k_hi) & (rn[None, :] < N),
                    other=0.0)
        if IEEE:  # float32 inputs: full float32 products, not TF32's 10-bit mantissa
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    c = c_ptr + tl.program_id(2).to(tl.int64) * stride_cs + batch * stride_cb
    c += rm[:, None] * stride_cm + rn[None, :] * stride_cn
    if SPLIT:  # the float32 partial as it is: alpha, the bias and the cast wait for the sum of the slices
        tl.store(c, acc, mask=inside)
    else:
        acc = acc * alpha
        if HAS_BIAS:
            bias = tl.load(bias_ptr + batch * stride_xb + rm[:, None] * stride_xm + rn[None, :] * stride_xn,
                           mask=inside, other=0.0)
            acc += beta * bias.to(tl.float32)
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=inside)


# The same kernel, compiled once for any sizes and strides. Triton compiles a kernel afresh for each
# pattern of its integer arguments (a multiple of 16, equal to 1, or neither): 1-3 s each for this
# GEMM, and the hidden shapes of one KernelBench GEMM make seven patterns, 12-17 s of a verdict's
# checked calls on the H200. A start's dynamic path, which serves every shape but the timed one,
# launches this; its static path, taken at the timed shape alone, the specialised _kf_gemm.
_kf_gemm_any = triton.jit(_kf_gemm.fn, do_not_specialize=[
    "M", "N", "K", "stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn", "stride_cs",
    "stride_cb", "stride_cm", "stride_cn", "stride_xb", "stride_xm", "stride_xn"])


@triton.jit
def _kf_gemm_sum(ws_ptr, c_ptr, bias_ptr, N, numel, splits, stride_ws, stride_wb,
                 stride_cb, stride_cm, stride_cn, stride_xb, stride_xm, stride_xn,
                 alpha, beta, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # Split-K's second pass: each output's partials (contiguous (M, N) planes, one per slice of K)
    # are added in slice order, a fixed order, so a result never depends on scheduling.
    batch = tl.program_id(1).to(tl.int64)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < numel
    rm = i // N
    rn = i % N
    w = ws_ptr + batch * stride_wb + i
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, splits):
        acc += tl.load(w, mask=inside, other=0.0)
        w += stride_ws
    acc = acc * alpha
    if HAS_BIAS:
        bias = tl.load(bias_ptr + batch * stride_xb + rm * stride_xm + rn * stride_xn, mask=inside, other=0.0)
        acc += beta * bias.to(tl.float32)
    tl.store(c_ptr + batch * stride_cb + rm * stride_cm + rn * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=inside)
'''

_LAUNCHER = '''
def _launch_kf_gemm(a, b, out, bias=None, alpha=1, beta=1, general=False):
    """out = alpha * (a @ b) + beta * bias: ATen's mm, addmm (2-d) and bmm, baddbmm (3-d).
    ``general``: launch _kf_gemm_any, compiled once for any sizes and strides."""
    if a.dim() == 2:  # a batch of one
        a, b, out = a[None], b[None], out[None]
    batch, M, K = a.shape
    N = b.shape[2]
    if out.numel() == 0:
        return
    has_bias = bias is not None and beta != 0
    bias = bias.expand(out.shape) if has_bias else out  # broadcast axes get stride 0; unread without a bias
    BLOCK_M = {BLOCK_M}
    BLOCK_N = {BLOCK_N}
    BLOCK_K = {BLOCK_K}
    GROUP_M = {GROUP_M}
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    # Split-K, when K is long for the number of tiles: slices of K sized for about SPLIT_PROGRAMS
    # programs in all (on a GPU two per SM of an H100/H200's 132; the slice rounded up to a power of
    # two gives between half that and that many, one per SM at least). The floor: a slice of fewer
    # than ~32 BLOCK_K steps spends much of its time filling and draining the pipeline, and its
    # partial tile's round trip through memory is no longer small next to the operands it reads.
    # The cap bounds the float32 error, which grows with the length of each sequential sum: 2**20
    # products in one accumulator (KernelBench's matrix-vector K) drifted 2e-4 on an H200, twice
    # the judge's 1e-4; sums of 2**14 are 64 times shorter, a drift of about 3e-6 if it grows
    # linearly with the length (2.5e-5 as its square root), and the second pass adds K / TILE_K
    # partials (64 there). Powers of two: few compiled variants, each a whole number of BLOCK_K steps.
    SPLIT_PROGRAMS = {SPLIT_PROGRAMS}
    fill = triton.next_power_of_2(triton.cdiv(K * tiles * batch, SPLIT_PROGRAMS))
    # A slice that would hold all of K takes the cap: the same slices as the plain min(max(floor,
    # fill), cap) (one, or the cap's where K is longer), and TILE_K, a key of the kernel's compile,
    # one value for every call that does not split.
    TILE_K = min(max({TILE_K_MIN}, fill if max(fill, {TILE_K_MIN}) < K else 1 << 62), {TILE_K})
    split = max(1, triton.cdiv(K, TILE_K))
    # the split's float32 partials, one (M, N) plane per slice; without a split the kernel writes out
    c = torch.empty((split, batch, M, N), device=out.device, dtype=torch.float32) if split > 1 else out[None]
    grid = (tiles, batch, split)
    num_warps = {num_warps}
    num_stages = {num_stages}
    # two literal launches, not one of a chosen kernel: the tuner finds a launch's knobs by the
    # @triton.jit kernel it names (loop/knobs.py), and both launches share the assignments above
    if not general:
        _kf_gemm[grid](a, b, c, bias, M, N, K,
                       a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
                       c.stride(0), c.stride(1), c.stride(2), c.stride(3), bias.stride(0), bias.stride(1), bias.stride(2),
                       float(alpha), float(beta), HAS_BIAS=has_bias, IEEE=a.dtype == torch.float32, SPLIT=split > 1,
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, TILE_K=TILE_K,
                       num_warps=num_warps, num_stages=num_stages)
    else:
        _kf_gemm_any[grid](a, b, c, bias, M, N, K,
                           a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2),
                           c.stride(0), c.stride(1), c.stride(2), c.stride(3), bias.stride(0), bias.stride(1),
                           bias.stride(2), float(alpha), float(beta), HAS_BIAS=has_bias, IEEE=a.dtype == torch.float32,
                           SPLIT=split > 1, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
                           TILE_K=TILE_K, num_warps=num_warps, num_stages=num_stages)
    if split > 1:
        BLOCK = 1024
        _kf_gemm_sum[(triton.cdiv(M * N, BLOCK), batch)](
            c, out, bias, N, M * N, split, c.stride(0), c.stride(1),
            out.stride(0), out.stride(1), out.stride(2), bias.stride(0), bias.stride(1), bias.stride(2),
            float(alpha), float(beta), HAS_BIAS=has_bias, BLOCK=BLOCK, num_warps=4)
'''


def source(device_kind: str) -> str:
    """The GEMM kernel and its launcher, with the device's starting block sizes."""
    return _KERNEL + _LAUNCHER.format(**BLOCKS.get(device_kind, BLOCKS["cuda"]))


def general(line: str) -> str:
    """``line`` of a start's path, its launcher call (``launch``) made general: the path serves
    many shapes, and _kf_gemm_any is compiled once for all of them."""
    if line.startswith(LAUNCHER + "(") and line.endswith(")"):
        return line[:-1] + ", general=True)"
    return line


def launch(func: str, call: ast.Call) -> str:
    """The launcher call for Inductor's ``extern_kernels.<gemm>(...)`` call ``call`` (its arguments
    already rewritten to run in the candidate)."""
    names = CALLS[func]
    if len(call.args) > len(names) or any(k.arg is None for k in call.keywords):
        raise ValueError(f"`{ast.unparse(call)[:120]}`: arguments other than ATen's")
    given = dict(zip(names, (ast.unparse(a) for a in call.args)))
    given |= {k.arg: ast.unparse(k.value) for k in call.keywords}
    unknown = set(given) - {*names, "alpha", "beta", "out"}
    if unknown or not {*names, "out"} <= set(given):
        raise ValueError(f"`{ast.unparse(call)[:120]}`: not ATen's ({', '.join(names)}, out=) arguments")
    args = [given["a"], given["b"], given["out"]]
    if "bias" in given:
        args += [given["bias"], f"alpha={given.get('alpha', '1')}", f"beta={given.get('beta', '1')}"]
    return f"{LAUNCHER}({', '.join(args)})"
