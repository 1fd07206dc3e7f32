"""kernforge's GEMM for the Inductor start (loop/inductor_gemm.py), under the Triton interpreter:
against torch on odd sizes, transposed strides, a batch axis and addmm's bias broadcast, in one
pass and split along K (the CPU's split thresholds are small enough for a test to reach); a long
K summed in slices is more accurate than in one pass; its block sizes are knobs the offline tuner
finds."""

from __future__ import annotations

import ast

import pytest
import torch
import triton
import triton.language as tl

from kernforge.loop import inductor_gemm, knobs
from kernforge.loop.inductor_start import translate

#: the interpreter on a machine without a GPU (conftest sets TRITON_INTERPRET there)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class _Spy:
    """Stands in for a kernel in the launcher's module and records the grid of each launch."""

    def __init__(self, name, kernel, launches: list) -> None:
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        self.launches.append((self.name, grid))
        return self.kernel[grid]


def _launcher(launches: list | None = None):
    """The launcher of ``inductor_gemm.source(DEVICE)`` as the start runs it; ``launches`` collects
    (kernel, grid) of each launch."""
    space = {"torch": torch, "triton": triton, "tl": tl}
    exec(compile(inductor_gemm.source(DEVICE), "kf_gemm", "exec"), space)
    if launches is not None:
        for name in ("_kf_gemm", "_kf_gemm_any", "_kf_gemm_sum"):
            space[name] = _Spy(name, space[name], launches)
    return space[inductor_gemm.LAUNCHER]


@pytest.fixture(scope="module")
def gemm():
    return _launcher()


@pytest.fixture
def spied():
    """The launcher and the launches it made, fresh for each test."""
    launches: list = []
    return _launcher(launches), launches


def _close(out: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-4) -> None:
    err = (out.double() - want.double()).abs()
    worst = int(err.argmax())
    assert torch.allclose(out.double(), want.double(), atol=tol, rtol=tol), (
        f"{what}: max error {err.max().item():.3g} at {list(torch.unravel_index(torch.tensor(worst), out.shape))}")


# 1x1x1, smaller than one tile, tails on every side (130 = 2 x 64 + 2, K=70 = 2 x 32 + 6) and
# more tile rows than one GROUP_M group (9 x 64 rows)
SHAPES = [(1, 1, 1), (5, 3, 7), (130, 70, 129), (577, 33, 65)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("b_layout", ["contiguous", "transposed"])
def test_mm_matches_torch(gemm, m, k, n, b_layout):
    """A transposed weight is what reinterpret_tensor gives a Linear's addmm: (K, N) with strides (1, K)."""
    a = torch.randn(m, k, device=DEVICE)
    b = torch.randn(k, n, device=DEVICE) if b_layout == "contiguous" else torch.randn(n, k, device=DEVICE).t()
    out = torch.empty(m, n, device=DEVICE)
    gemm(a, b, out)
    _close(out, a @ b, f"mm {m}x{k}x{n} ({b_layout} B)")


# Triton 3.9's interpreter multiplies bfloat16 tiles wrong (a bare tl.dot of two 16x16 tiles is off
# by 1e10): bfloat16 is checked on a GPU only.
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-2), pytest.param(
    torch.bfloat16, 3e-2, marks=pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter's bfloat16 tl.dot is wrong"))])
def test_mm_of_16_bit_inputs_accumulates_in_float32(gemm, dtype, tol):
    """16-bit inputs take tl.dot's default precision; the float32 accumulator is rounded once, at
    the store, so the result is torch's float32 product rounded to the output's dtype."""
    a, b = torch.randn(130, 70, device=DEVICE).to(dtype), torch.randn(70, 129, device=DEVICE).to(dtype)
    out = torch.empty(130, 129, device=DEVICE, dtype=dtype)
    gemm(a, b, out)
    _close(out, (a.float() @ b.float()).to(dtype), f"mm {dtype}", tol)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("bias_shape", ["row", "full", "column"])
def test_addmm_bias_broadcast_alpha_beta(gemm, m, k, n, bias_shape):
    a = torch.randn(k, m, device=DEVICE).t()  # a transposed A as well
    b = torch.randn(k, n, device=DEVICE)
    bias = torch.randn({"row": (n,), "full": (m, n), "column": (m, 1)}[bias_shape], device=DEVICE)
    out = torch.empty(m, n, device=DEVICE)
    gemm(a, b, out, bias, alpha=0.5, beta=2.0)
    _close(out, torch.addmm(bias, a, b, alpha=0.5, beta=2.0), f"addmm {m}x{k}x{n} ({bias_shape} bias)")


def test_beta_zero_reads_no_bias(gemm):
    """ATen ignores the bias when beta is 0, NaNs included."""
    a, b = torch.randn(9, 5, device=DEVICE), torch.randn(5, 11, device=DEVICE)
    out = torch.empty(9, 11, device=DEVICE)
    gemm(a, b, out, torch.full((11,), float("nan"), device=DEVICE), alpha=1, beta=0)
    _close(out, a @ b, "addmm beta=0")


@pytest.mark.parametrize("batch,m,k,n", [(1, 1, 1, 1), (3, 70, 33, 129), (4, 5, 3, 7)])
def test_bmm_and_baddbmm_match_torch(gemm, batch, m, k, n):
    a = torch.randn(batch, m, k, device=DEVICE)
    b = torch.randn(batch, n, k, device=DEVICE).transpose(1, 2)
    out = torch.empty(batch, m, n, device=DEVICE)
    gemm(a, b, out)
    _close(out, torch.bmm(a, b), f"bmm {batch}x{m}x{k}x{n}")
    bias = torch.randn(m, n, device=DEVICE)
    out = torch.empty(batch, m, n, device=DEVICE)
    gemm(a, b, out, bias, alpha=1, beta=1)
    _close(out, torch.baddbmm(bias, a, b), f"baddbmm {batch}x{m}x{k}x{n}")


def test_output_view_with_strides(gemm):
    """Inductor may hand an out= view of a larger buffer: the kernel writes through its strides only."""
    a, b = torch.randn(17, 9, device=DEVICE), torch.randn(9, 13, device=DEVICE)
    buf = torch.zeros(13, 17, device=DEVICE)
    gemm(a, b, buf.t())
    _close(buf.t(), a @ b, "mm into a transposed out")


# Shapes whose K is long for their tiles on the CPU's thresholds (SPLIT_PROGRAMS 8, TILE_K_MIN 512,
# TILE_K 4096): 5x4099x3 is one tile in slices of 1024 (the last of 3), 70x2053x33 two tiles in
# slices of 1024 (the last of 5): tails on every side, of K and of the slices.
SPLIT_SHAPES = [(5, 4099, 3), (70, 2053, 33)]


def _split(launches: list) -> int:
    """How many slices of K the GEMM ran in, checking that the sum ran exactly when it split."""
    grids = [grid for name, grid in launches if name in ("_kf_gemm", "_kf_gemm_any")]
    sums = [grid for name, grid in launches if name == "_kf_gemm_sum"]
    assert len(grids) == 1, launches
    split = grids[0][2]
    assert len(sums) == (split > 1), f"{split} slices of K, {len(sums)} sums"
    return split


@pytest.mark.parametrize("m,k,n", [(33, 70, 17), SPLIT_SHAPES[0]])
def test_a_general_launch_takes_the_kernel_compiled_once_for_any_sizes_and_computes_the_same(spied, m, k, n):
    """A start's dynamic path launches ``general=True``: _kf_gemm_any, the same kernel with no
    specialisation on its sizes and strides (one compile for every hidden shape), same results."""
    gemm, launches = spied
    a, b = torch.randn(m, k, device=DEVICE), torch.randn(n, k, device=DEVICE).t()
    bias = torch.randn(n, device=DEVICE)
    outs = {}
    for general in (False, True):
        launches.clear()
        outs[general] = torch.empty(m, n, device=DEVICE)
        gemm(a, b, outs[general], bias, alpha=0.5, beta=2.0, general=general)
        assert {name for name, _ in launches} - {"_kf_gemm_sum"} == {"_kf_gemm_any" if general else "_kf_gemm"}
    assert torch.equal(outs[False], outs[True])
    _close(outs[True], 0.5 * (a.double() @ b.double()) + 2.0 * bias.double(), f"general addmm {m}x{k}x{n}")


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_tile_k_is_one_value_wherever_k_is_not_split_and_the_slices_are_as_before(device_kind):
    """TILE_K is a key of the kernel's compile: every call that does not split K passes the cap,
    one compile for them all, while the slices (how many, how long) stay those of the plain rule
    ``min(max(TILE_K_MIN, fill), cap)``. Launches recorded on meta tensors, none run."""
    blocks = inductor_gemm.BLOCKS[device_kind]
    seen = []

    class _Record:
        def __getitem__(self, grid):
            return lambda *args, **meta: seen.append((grid, meta))

    space = {"torch": torch, "triton": triton, "tl": tl}
    exec(compile(inductor_gemm.source(device_kind), "kf_gemm", "exec"), space)
    for name in ("_kf_gemm", "_kf_gemm_any", "_kf_gemm_sum"):
        space[name] = _Record()
    unsplit: set[int] = set()
    for batch, m, k, n in [(1, 2048, 8192, 4096), (1, 2048, 6145, 3073), (1, 1, 8192, 4096), (1, 2048, 1, 4096),
                           (1, 2048, 2**20, 1), (128, 512, 1024, 2048), (1, 5, 4099, 3), (1, 70, 2053, 33),
                           (1, 64, 600, 64), (3, 7, 50000, 9)]:
        seen.clear()
        a = torch.empty(batch, m, k, device="meta")
        space[inductor_gemm.LAUNCHER](a, torch.empty(batch, k, n, device="meta"), torch.empty(batch, m, n, device="meta"))
        grid, meta = seen[0]
        tiles = triton.cdiv(m, blocks["BLOCK_M"]) * triton.cdiv(n, blocks["BLOCK_N"])
        fill = triton.next_power_of_2(triton.cdiv(k * tiles * batch, blocks["SPLIT_PROGRAMS"]))
        plain = min(max(blocks["TILE_K_MIN"], fill), blocks["TILE_K"])
        split = max(1, triton.cdiv(k, plain))
        assert grid[2] == split, (batch, m, k, n)
        assert meta["TILE_K"] == (plain if split > 1 else blocks["TILE_K"]), (batch, m, k, n)
        unsplit |= {meta["TILE_K"]} if split == 1 else set()
    assert unsplit == {blocks["TILE_K"]}, unsplit


#: compiled without the interpreter (the suite's conftest turns it on), for sm_90 to the binary: the
#: GEMM specialised as at a timed shape of multiples of 16, and as _kf_gemm_any compiles it (no
#: specialisation), whose list must name every integer argument
HOPPER_BUILD = """
import importlib.util, json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("kf_gemm_build", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = module._kf_gemm
floats, pointers = {"alpha", "beta"}, {"a_ptr", "b_ptr", "c_ptr", "bias_ptr"}
constexprs = {"HAS_BIAS": True, "IEEE": True, "SPLIT": False, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32,
              "GROUP_M": 8, "TILE_K": 16384}
ints = [n for n in fn.arg_names if n not in floats | pointers | set(constexprs)]
signature = {**{n: "*fp32" for n in pointers}, **{n: "i32" for n in ints}, **{n: "fp32" for n in floats},
             **{n: "constexpr" for n in constexprs}}
sizes = []
for specialised in (pointers | set(ints), pointers):
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in specialised}
    built = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    sizes.append(len(built.asm["cubin"]))
print(json.dumps({"cubins": sizes, "ints": ints, "unspecialised": list(module._kf_gemm_any.do_not_specialize)}))
"""


def test_the_gemm_builds_for_hopper_specialised_and_as_its_general_twin(tmp_path):
    """The interpreter ignores specialisation: this compiles both for sm_90, to the binary."""
    import json
    import os
    import subprocess
    import sys

    module = tmp_path / "kf_gemm_build.py"
    module.write_text("import torch\nimport triton\nimport triton.language as tl\n" + inductor_gemm.source("cuda"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", HOPPER_BUILD, str(module)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(size > 0 for size in built["cubins"])
    assert sorted(built["unspecialised"]) == sorted(built["ints"])  # M, N, K and all 13 strides


@pytest.mark.parametrize("m,k,n", SPLIT_SHAPES)
@pytest.mark.parametrize("b_layout", ["contiguous", "transposed"])
def test_split_k_mm_matches_float64(spied, m, k, n, b_layout):
    gemm, launches = spied
    a = torch.randn(m, k, device=DEVICE)
    b = torch.randn(k, n, device=DEVICE) if b_layout == "contiguous" else torch.randn(n, k, device=DEVICE).t()
    out = torch.empty(m, n, device=DEVICE)
    gemm(a, b, out)
    assert _split(launches) > 1
    _close(out, a.double() @ b.double(), f"split-K mm {m}x{k}x{n} ({b_layout} B)")


@pytest.mark.parametrize("m,k,n", SPLIT_SHAPES)
@pytest.mark.parametrize("bias_shape", ["row", "full", "column"])
def test_split_k_addmm_applies_alpha_and_the_bias_once(spied, m, k, n, bias_shape):
    """The slices' partial sums are raw: alpha and beta * bias are applied once, by the sum."""
    gemm, launches = spied
    a = torch.randn(k, m, device=DEVICE).t()
    b = torch.randn(k, n, device=DEVICE)
    bias = torch.randn({"row": (n,), "full": (m, n), "column": (m, 1)}[bias_shape], device=DEVICE)
    out = torch.empty(m, n, device=DEVICE)
    gemm(a, b, out, bias, alpha=0.5, beta=2.0)
    assert _split(launches) > 1
    want = torch.addmm(bias.double(), a.double(), b.double(), alpha=0.5, beta=2.0)
    _close(out, want, f"split-K addmm {m}x{k}x{n} ({bias_shape} bias)")


def test_split_k_beta_zero_reads_no_bias(spied):
    gemm, launches = spied
    a, b = torch.randn(5, 4099, device=DEVICE), torch.randn(4099, 3, device=DEVICE)
    out = torch.empty(5, 3, device=DEVICE)
    gemm(a, b, out, torch.full((3,), float("nan"), device=DEVICE), alpha=1, beta=0)
    assert _split(launches) > 1
    _close(out, a.double() @ b.double(), "split-K addmm beta=0")


def test_split_k_bmm_and_baddbmm_match_float64(spied):
    """Program id 1 is still the batch; the slices are id 2. 3 x 5x4099x7: three tiles in slices of 2048."""
    gemm, launches = spied
    a = torch.randn(3, 5, 4099, device=DEVICE)
    b = torch.randn(3, 7, 4099, device=DEVICE).transpose(1, 2)
    out = torch.empty(3, 5, 7, device=DEVICE)
    gemm(a, b, out)
    assert _split(launches) > 1
    _close(out, torch.bmm(a.double(), b.double()), "split-K bmm 3x5x4099x7")
    launches.clear()
    bias = torch.randn(5, 7, device=DEVICE)
    gemm(a, b, out, bias, alpha=1, beta=1)
    assert _split(launches) > 1
    _close(out, torch.baddbmm(bias.double(), a.double(), b.double()), "split-K baddbmm 3x5x4099x7")


def test_split_k_writes_an_out_view_through_its_strides_and_dtype(spied):
    """The sum writes the output's strides and dtype: a transposed float16 view of a larger buffer."""
    gemm, launches = spied
    a = torch.randn(5, 4099, device=DEVICE).half()
    b = torch.randn(4099, 3, device=DEVICE).half()
    buf = torch.zeros(3, 5, device=DEVICE, dtype=torch.float16)
    gemm(a, b, buf.t())
    assert _split(launches) > 1
    _close(buf.t(), (a.float() @ b.float()).half(), "split-K float16 mm into a transposed out", 1e-2)


@pytest.mark.parametrize("m,k,n", [(5, 0, 3), (130, 70, 129), (5, 511, 3)])
def test_short_k_keeps_one_pass_without_a_sum(spied, m, k, n):
    """K no longer than TILE_K_MIN (or no K at all: out = beta * bias) is one launch, as before the split."""
    gemm, launches = spied
    a, b, bias = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE), torch.randn(n, device=DEVICE)
    out = torch.empty(m, n, device=DEVICE)
    gemm(a, b, out, bias, alpha=0.5, beta=2.0)
    assert _split(launches) == 1
    _close(out, torch.addmm(bias.double(), a.double(), b.double(), alpha=0.5, beta=2.0), f"addmm {m}x{k}x{n}")


def test_split_k_sums_a_long_k_more_accurately_than_one_pass(monkeypatch):
    """A matrix-vector product of uniform [0, 1) inputs, as KernelBench's 4 (K=2**20 there, 2**16
    here: the interpreter's time grows with the length of one program's sum, as the drift does):
    one float32 accumulator for all of K drifts from the float64 sum (every term adds, the sum is
    large next to each: 1.7e-6 here, 2e-4 on an H200 at 2**20), slices of K summed apart do not
    (2e-7). Thresholds that never split give the one-pass sum to compare with."""
    m, k = 61, 1 << 16
    a, b = torch.rand(m, k, device=DEVICE), torch.rand(k, 1, device=DEVICE)
    want = a.double() @ b.double()

    def error() -> float:
        out = torch.empty(m, 1, device=DEVICE)
        _launcher()(a, b, out)
        return ((out.double() - want) / want).abs().max().item()

    split = error()
    monkeypatch.setitem(inductor_gemm.BLOCKS, DEVICE,
                        inductor_gemm.BLOCKS[DEVICE] | {"TILE_K": 1 << 30, "TILE_K_MIN": 1 << 30})
    one_pass = error()
    assert split < 1e-4 and split < one_pass / 4, (
        f"max relative error of K={k} in slices {split:.3g}, in one pass {one_pass:.3g}")


@pytest.mark.parametrize("call,want", [
    ("extern_kernels.mm(arg0_1, arg1_1, out=buf0)", "_launch_kf_gemm(arg0_1, arg1_1, buf0)"),
    ("extern_kernels.addmm(arg1_1, arg5_1, torch.as_strided(arg3_1, (s32, s50), (1, s32), 0), alpha=1, beta=1, out=buf0)",
     "_launch_kf_gemm(arg5_1, torch.as_strided(arg3_1, (s32, s50), (1, s32), 0), buf0, arg1_1, alpha=1, beta=1)"),
    ("extern_kernels.baddbmm(c, a, b, out=buf1)", "_launch_kf_gemm(a, b, buf1, c, alpha=1, beta=1)"),
])
def test_launch_maps_aten_arguments(call, want):
    node = ast.parse(call, mode="eval").body
    assert inductor_gemm.launch(ast.unparse(node.func), node) == want


def test_launch_refuses_a_call_without_out():
    node = ast.parse("extern_kernels.mm(a, b)", mode="eval").body
    with pytest.raises(ValueError, match="not ATen's"):
        inductor_gemm.launch("extern_kernels.mm", node)


_MM_WRAPPER = '''
def call(args):
    arg0_1, arg1_1, arg2_1, arg3_1, arg4_1 = args
    args.clear()
    buf0 = empty_strided_cpu((arg0_1, arg3_1), (arg3_1, 1), torch.float32)
    extern_kernels.mm(arg2_1, arg4_1, out=buf0)
    return (buf0, )
'''
_MM_BINDINGS = [("arg0_1", "inputs[0].shape[0]"), ("arg1_1", "inputs[0].shape[1]"), ("arg2_1", "inputs[0]"),
                ("arg3_1", "inputs[1].shape[1]"), ("arg4_1", "inputs[1]")]


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_gemm_launcher_block_sizes_are_knobs(device_kind):
    """The offline tuner moves the GEMM's tiles and launch options like an Inductor kernel's XBLOCK."""
    source, kernels = translate(_MM_WRAPPER, _MM_BINDINGS, 2, device_kind)
    assert kernels == ("_kf_gemm",)
    found = {k.param: k for k in knobs.analyse(source).knobs if k.kernel == "_kf_gemm"}
    blocks = inductor_gemm.BLOCKS[device_kind]
    for param in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "TILE_K"):
        assert param in found, f"{param} is no knob: {sorted(found)}"
        assert found[param].value == blocks[param]
    # split-K's slice: its cap moves, never below the floor
    assert found["TILE_K"].kind == "cap" and found["TILE_K"].lo == blocks["TILE_K_MIN"]
    summed = {k.param for k in knobs.analyse(source).knobs if k.kernel == "_kf_gemm_sum"}
    assert {"BLOCK", "num_warps"} <= summed, sorted(summed)
    # moving one keeps the rest of the source and the grid computed from it
    analysis = knobs.analyse(source)
    half = blocks["TILE_K"] // 2
    moved = knobs.rewrite(source, analysis, {found["BLOCK_M"].label: 32, found["TILE_K"].label: half})
    assert "BLOCK_M = 32" in moved and "triton.cdiv(M, BLOCK_M)" in moved
    assert f"TILE_K = min(max({blocks['TILE_K_MIN']}, fill if max(fill, {blocks['TILE_K_MIN']}) < K else 1 << 62), {half})" in moved
