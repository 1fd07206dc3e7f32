"""The offline proposer: knob analysis of every built-in seed, text rewriting that keeps everything
else (launch knobs and tl.load eviction hints), variants that still compute the right thing
(Triton interpreter), a seeded search that never repeats itself, follows the measurements, runs
out and says so, and how far it can reach from a kernel.
"""

from __future__ import annotations

import io
import math
import textwrap
import tokenize
from pathlib import Path

import pytest
import torch

from kernforge.archive.content import code_hash
from kernforge.loop.knobs import (EVICTION_DOMAIN, MAX_BLOCK, OPTION_DEFAULTS, KnobError, analyse, clusters_in, rewrite,
                                  template_key)
from kernforge.loop.offline import NoProposal, OfflineProposer, Proposal
from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier.compare import compare
from kernforge.verifier.reference import clone_inputs, collect_outputs, run_reference, strict_precision
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status, Verdict

BUILTIN = Path(__file__).resolve().parents[1] / "tasks" / "builtin"
SEEDS = sorted(p.parent.name for p in BUILTIN.glob("*/seed.py"))

#: What the analysis must find in seeds whose knobs are known (other seeds: generic checks only).
#: Every tl.load of a launched kernel has an eviction hint, absent ("") in every seed.
EXPECTED = {
    "rms_norm": {"x_ptr.eviction_policy": "", "w_ptr.eviction_policy": "", "num_warps": 8},
    "silu_and_mul": {"x_ptr.eviction_policy@18": "", "x_ptr.eviction_policy@19": "", "BLOCK": 1024, "num_warps": 4},
    "softmax": {"x_row.eviction_policy@29": "", "x_row.eviction_policy@39": "", "BLOCK": 4096, "num_warps": 8,
                "num_stages": 3},
    "gemm_small_m": {"x_ptr.eviction_policy": "", "w_ptr.eviction_policy": "", "BLOCK_M": 64, "BLOCK_N": 64,
                     "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
    "fp8_quant_per_token": {"x_row.eviction_policy@25": "", "x_row.eviction_policy@36": "", "BLOCK": 1024,
                            "num_warps": 4, "num_stages": 3},
}


def _seed(name: str) -> str:
    return (BUILTIN / name / "seed.py").read_text()


def _comments(source: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.string for t in tokens if t.type == tokenize.COMMENT]


def _launch_values(analysis) -> dict:
    """The knobs of the launches: eviction hints left out."""
    return {k.label: k.value for k in analysis.knobs if k.kind != "eviction"}


def _neighbours(analysis):
    """One assignment per knob: the next value of its domain (the previous one at the top)."""
    for knob in analysis.knobs:
        domain = knob.domain()
        i = domain.index(knob.value)
        yield knob, domain[i + 1] if i + 1 < len(domain) else domain[i - 1]


# --- analysis -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SEEDS)
def test_seed_knobs(name):
    analysis = analyse(_seed(name))
    if name in EXPECTED:
        assert analysis.values() == EXPECTED[name], analysis.notes
    if not analysis.knobs:
        # A seed without knobs must say why (see the report for which ones).
        assert analysis.reason.startswith("nothing to tune: "), analysis
        return
    assert not analysis.reason
    for knob in analysis.knobs:
        domain = knob.domain()
        assert knob.value in domain and len(domain) >= 3, knob
        if knob.kind == "eviction":
            assert domain == EVICTION_DOMAIN and knob.label.split("@")[0].endswith(".eviction_policy"), knob
        elif knob.kind == "option":
            assert set(domain) >= {1, 2, 4, 8} if knob.param == "num_warps" else set(domain) >= {1, 2, 3, 4}
        else:
            assert all(v & (v - 1) == 0 for v in domain if v != knob.value), f"{knob.label}: {domain}"


@pytest.mark.parametrize("name", SEEDS)
def test_seed_variants_differ_compile_and_read_back(name):
    source = _seed(name)
    analysis = analyse(source)
    if not analysis.knobs:
        pytest.skip(analysis.reason)
    variants = set()
    for knob, value in _neighbours(analysis):
        variant = rewrite(source, analysis, {knob.label: value})
        compile(variant, f"{name}/variant.py", "exec")
        assert variant != source and code_hash(variant) != code_hash(source)
        assert analyse(variant).values() == analysis.values() | {knob.label: value}
        assert template_key(variant, analyse(variant)) == template_key(source, analysis)
        assert _comments(variant) == _comments(source)
        variants.add(variant)
    assert len(variants) == len(analysis.knobs)


def test_computed_block_sizes_are_left_alone_with_a_reason():
    analysis = analyse(_seed("rms_norm"))
    assert [k.label for k in analysis.knobs] == ["x_ptr.eviction_policy", "w_ptr.eviction_policy", "num_warps"]
    assert any("BLOCK is computed at run time (`triton.next_power_of_2(hidden)`)" in n for n in analysis.notes)
    assert any("num_stages would change nothing" in n for n in analysis.notes)


def test_local_variable_is_edited_where_it_is_assigned_so_the_grid_follows():
    source = _seed("silu_and_mul")
    variant = rewrite(source, analyse(source), {"BLOCK": 256})
    assert "    block = 256\n" in variant and "BLOCK=block" in variant
    assert "grid = (rows, triton.cdiv(inter, block))" in variant


def test_tuple_assignment_and_cap():
    source = _seed("gemm_small_m")
    variant = rewrite(source, analyse(source), {"BLOCK_N": 128, "BLOCK_K": 32, "BLOCK_M": 32})
    assert "block_n, block_k = 128, 32\n" in variant
    assert "block_m = min(max(16, triton.next_power_of_2(m)), 32)\n" in variant
    # tl.dot needs 16: the floor max(16, ...) bounds the cap's domain
    assert min(analyse(source).knob("BLOCK_M").domain()) == 16


def _kernel_module(body: str) -> str:
    return textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def _k(x_ptr, y_ptr, N, BLOCK: tl.constexpr, GROUP_SIZE: tl.constexpr):
            for start in range(0, N, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)

        @triton.jit
        def _r(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)  # the whole row in one block: BLOCK >= N
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)

    ''') + textwrap.dedent(body)


@pytest.mark.parametrize("body, values, note", [
    # a module constant (plain, or wrapped in tl.constexpr) feeds the launch
    ("BLOCK_SIZE = 512\ndef f(x, y, n):\n    _k[(1,)](x, y, n, BLOCK=BLOCK_SIZE, GROUP_SIZE=128)\n",
     {"BLOCK": 512, "num_warps": 4, "num_stages": 3}, "GROUP_SIZE=128 is not named like a tiling parameter"),
    ("BLOCK_SIZE = tl.constexpr(256)\ndef f(x, y, n):\n    _k[(1,)](x, y, n, BLOCK_SIZE, 8, num_warps=2)\n",
     {"BLOCK": 256, "num_warps": 2, "num_stages": 3}, "GROUP_SIZE=8 is not named like a tiling parameter"),
    # the literal also sits in the grid: changing one without the other would be wrong
    ("def f(x, y, n):\n    _k[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024, GROUP_SIZE=1, num_stages=2)\n",
     {"num_warps": 4, "num_stages": 2}, "also appears in the grid"),
    # assigned twice, or a parameter: not a literal the tuner owns (and _r has no loop to cap)
    ("def f(x, y, n):\n    b = 64\n    if n > 4096:\n        b = 128\n    _r[(1,)](x, y, n, BLOCK=b)\n",
     {"num_warps": 4}, "assigned more than once"),
    ("def f(x, y, n, block):\n    _r[(1,)](x, y, n, BLOCK=block)\n",
     {"num_warps": 4}, "is a parameter of `f`"),
    ("def f(x, y, n):\n    _r[(1,)](x, y, n, BLOCK=triton.next_power_of_2(n))\n",
     {"num_warps": 4}, "does not only step through a loop with it"),
    # a launch inside a method resolves through the module, not the class body
    ("BLOCK_R = 256\nclass ModelNew:\n    BLOCK_R = 64\n    def forward(self, x, y):\n"
     "        _r[(1,)](x, y, 5, BLOCK=BLOCK_R, num_warps=2)\n",
     {"BLOCK": 256, "num_warps": 2}, "no loop that loads"),
    # **kwargs may hold the launch options already: adding them could pass them twice
    ("def f(x, y, n, **opts):\n    _k[(1,)](x, y, n, BLOCK=256, GROUP_SIZE=1, **opts)\n",
     {"BLOCK": 256}, "num_warps not added"),
    # the kernel only steps through a loop with BLOCK: a cap on the computed value is safe
    ("def f(x, y, n):\n    _k[(1,)](x, y, n, BLOCK=triton.next_power_of_2(n), GROUP_SIZE=1)\n",
     {"BLOCK": None, "num_warps": 4, "num_stages": 3}, ""),
    # ... but not when the grid is computed from the same variable
    ("def f(x, y, n):\n    b = triton.next_power_of_2(n)\n    _k[(triton.cdiv(n, b),)](x, y, n, BLOCK=b, GROUP_SIZE=1)\n",
     {"num_warps": 4, "num_stages": 3}, "is computed at run time"),
])
def test_analysis_cases(body, values, note):
    analysis = analyse(_kernel_module(body))
    assert _launch_values(analysis) == values, analysis.notes
    assert any(note in n for n in analysis.notes), analysis.notes


def test_introduced_cap_rewrites_to_min_and_back():
    source = _kernel_module("def f(x, y, n):\n    _k[(1,)](x, y, n, BLOCK=triton.next_power_of_2(n), GROUP_SIZE=1)\n")
    analysis = analyse(source)
    assert analysis.knob("BLOCK").kind == "new_cap" and None in analysis.knob("BLOCK").domain()
    variant = rewrite(source, analysis, {"BLOCK": 2048})
    assert "BLOCK=min(triton.next_power_of_2(n), 2048), GROUP_SIZE=1" in variant
    assert rewrite(source, analysis, {"BLOCK": None}) == source
    # the capped variant is a literal cap of the same family
    assert analyse(variant).values()["BLOCK"] == 2048
    assert template_key(variant, analyse(variant)) == template_key(source, analysis)


@pytest.mark.parametrize("source, why", [
    # KernelBench style: plain PyTorch, no Triton at all
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n",
     "no @triton.jit kernel in the source"),
    ("import triton\n@triton.jit\ndef k(x):\n    pass\nclass ModelNew:\n    pass\n",
     "no launch kernel[grid](...)"),
    ("import triton\n@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef k(x, n, BLOCK: 'tl.constexpr'):\n"
     "    pass\ndef f(x, n):\n    k[(1,)](x, n)\n", "is under @triton.autotune"),
    ("def broken(:\n", "the source does not parse"),
])
def test_nothing_to_tune_says_why(source, why):
    analysis = analyse(source)
    assert not analysis.knobs and analysis.reason.startswith("nothing to tune") and why in analysis.reason
    result = OfflineProposer(seed=0).propose(source)
    assert isinstance(result, NoProposal) and result.kind == "nothing_to_tune" and why in result.reason


def test_rewrite_keeps_every_other_byte():
    launch = "out.stride(0), BLOCK=4096, num_warps=8)"
    assert launch in _seed("softmax")
    source = _seed("softmax").replace(launch, "out.stride(0),\n        BLOCK=4096,  # a comment the tuner must keep\n        num_warps=8)")
    analysis = analyse(source)
    variant = rewrite(source, analysis, {"BLOCK": 8192, "num_warps": 4})
    assert "BLOCK=8192,  # a comment the tuner must keep" in variant
    # back to the original values: byte for byte the original
    assert rewrite(variant, analyse(variant), {"BLOCK": 4096, "num_warps": 8}) == source
    # an absent option is inserted after the last argument, nowhere else
    staged = rewrite(source, analysis, {"num_stages": 2})
    assert staged.replace(", num_stages=2", "", 1) == source
    # its default leaves the text alone
    assert rewrite(source, analysis, {"num_stages": OPTION_DEFAULTS["num_stages"]}) == source


@pytest.mark.parametrize("assignment, message", [
    ({"BLOCK": 0}, "not a positive integer"),
    ({"BLOCK": True}, "not a positive integer"),
    ({"BLOCK": None}, "only an introduced cap"),
    ({"BLOCK_Q": 64}, "no knob 'BLOCK_Q'"),
])
def test_rewrite_refuses_bad_assignments(assignment, message):
    source = _seed("softmax")
    with pytest.raises(KnobError, match=message):
        rewrite(source, analyse(source), assignment)


def test_rewrite_refuses_a_source_that_moved():
    source = _seed("softmax")
    analysis = analyse(source)
    with pytest.raises(KnobError, match="not what was analysed"):
        rewrite(source.replace("BLOCK=4096", "BLOCK=2048"), analysis, {"BLOCK": 8192})


# --- eviction hints and num_ctas ------------------------------------------------------------

_HINTED = '''\
import torch
import triton
import triton.language as tl
{head}
@triton.jit
def _helper(p, offs, n):
    return tl.load(p + offs, mask=offs < n, other=0.0)

@triton.jit
def _unused(p):
    return tl.load(p)

@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
{body}
def f(x, y, n):
    {launch}
'''


def _hinted(body: str, launch: str = "_k[(1,)](x, y, n, BLOCK=256)", head: str = "") -> str:
    """A module with a kernel ``_k`` whose body is given, a helper it may call, one it never calls,
    and one launch."""
    return _HINTED.format(head=head, body=textwrap.indent(body, "    "), launch=launch)


def _hints(analysis) -> dict:
    return {k.label: k.value for k in analysis.knobs if k.kind == "eviction"}


@pytest.mark.parametrize("body, hints, note", [
    # absent: "" (Triton's evict_normal), inserted after the last argument whatever its keywords
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier='.cg'))\n",
     {"x_ptr.eviction_policy": ""}, ""),
    # already hinted: the literal is the knob's value, edited in place
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs, eviction_policy='evict_last', mask=offs < n))\n",
     {"x_ptr.eviction_policy": "evict_last"}, ""),
    # a hint the domain does not hold, or one the author computes: left alone
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs, eviction_policy='evict_normal'))\n",
     {}, "eviction_policy `'evict_normal'` of the tl.load at line"),
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs, eviction_policy=POLICY))\n", {}, "eviction_policy `POLICY`"),
    # a load in a @triton.jit helper the kernel calls is tuned there; an uncalled one is not
    ("tl.store(y_ptr + offs, _helper(x_ptr, offs, n))\n", {"p.eviction_policy": ""}, ""),
    # volatile loads, splatted arguments and Triton 3.0-3.4's positional hint are left alone
    ("tl.store(y_ptr, tl.load(x_ptr, volatile=True))\n", {}, "is volatile"),
    ("tl.store(y_ptr, tl.load(*(x_ptr,)))\n", {}, "passes *args/**kwargs"),
    ("tl.store(y_ptr, tl.load(x_ptr, None, None, None, '', '', 'evict_last'))\n", {}, "by position"),
    # two loads of one pointer on one line: each its own knob
    ("tl.store(y_ptr + offs, tl.load(x_ptr + offs) + tl.load(x_ptr + offs + 1))\n",
     {"x_ptr.eviction_policy@16.1": "", "x_ptr.eviction_policy@16.2": ""}, ""),
])
def test_eviction_hint_cases(body, hints, note):
    analysis = analyse(_hinted(body))
    assert _hints(analysis) == hints, analysis.notes
    assert _launch_values(analysis) == {"BLOCK": 256, "num_warps": 4}
    assert not note or any(note in n for n in analysis.notes), analysis.notes


@pytest.mark.parametrize("head, call", [
    ("from triton.language import load as ld\n", "ld"),
    ("import triton.language as language\n", "language.load"),
    ("from triton import language\n", "language.load"),
])
def test_eviction_hints_follow_how_the_module_spells_load(head, call):
    analysis = analyse(_hinted(f"tl.store(y_ptr + offs, {call}(x_ptr + offs))\n", head=head))
    assert _hints(analysis) == {"x_ptr.eviction_policy": ""}, analysis.notes


def test_an_autotuned_kernel_keeps_its_loads():
    source = _hinted("tl.store(y_ptr + offs, _helper(x_ptr, offs, n))\n").replace(
        "@triton.jit\ndef _k(", "@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef _k(")
    analysis = analyse(source)
    assert not analysis.knobs and "is under @triton.autotune" in analysis.reason


def test_eviction_hint_rewrites_in_place_and_back():
    source = _hinted("a = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\n"
                     "b = tl.load(y_ptr + offs, eviction_policy=\"evict_last\")  # read again by the next program\n"
                     "tl.store(y_ptr + offs, a + b)\n")
    analysis = analyse(source)
    assert _hints(analysis) == {"x_ptr.eviction_policy": "", "y_ptr.eviction_policy": "evict_last"}
    variant = rewrite(source, analysis, {"x_ptr.eviction_policy": "evict_first", "y_ptr.eviction_policy": ""})
    assert 'a = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")\n' in variant
    assert 'b = tl.load(y_ptr + offs, eviction_policy="")  # read again by the next program\n' in variant
    compile(variant, "variant.py", "exec")
    again = analyse(variant)
    assert _hints(again) == {"x_ptr.eviction_policy": "evict_first", "y_ptr.eviction_policy": ""}
    assert template_key(variant, again) == template_key(source, analysis)
    # the analysed values again: the written hint is written back; the inserted one stays, as ""
    back = rewrite(variant, again, {"x_ptr.eviction_policy": "", "y_ptr.eviction_policy": "evict_last"})
    assert back == source.replace("a = tl.load(x_ptr + offs, mask=offs < n, other=0.0)",
                                  'a = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="")')
    assert rewrite(source, analysis, {"x_ptr.eviction_policy": ""}) == source


_DOT = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def _mm(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], {dot})


def f(a, b, c):
    _mm[(1,)](a, b, c, BLOCK=16)
'''


def _precisions(analysis) -> dict:
    return {k.label: k.value for k in analysis.knobs if k.kind == "precision"}


@pytest.mark.parametrize("dot, precisions, note", [
    ('tl.dot(a, b, input_precision="ieee")', {"a.input_precision": "ieee"}, ""),
    ("tl.dot(a, b, input_precision='tf32x3')", {"a.input_precision": "tf32x3"}, ""),
    # one TF32 product is not a float32 product: never offered, never moved to
    ('tl.dot(a, b, input_precision="tf32")', {}, "input_precision `\"tf32\"` of the tl.dot at line"),
    ("tl.dot(a, b, input_precision=PRECISION)", {}, "input_precision `PRECISION`"),
    # no precision written: Triton's default (TF32 for float32, nothing for 16-bit inputs) stays
    ("tl.dot(a, b)", {}, ""),
])
def test_a_dots_precision_is_a_knob_only_where_written_as_a_float32_product(dot, precisions, note):
    analysis = analyse(_DOT.format(dot=dot))
    assert _precisions(analysis) == precisions, analysis.notes
    assert not note or any(note in n for n in analysis.notes), analysis.notes


def test_a_dots_precision_rewrites_in_place_within_one_family():
    source = _DOT.format(dot='tl.dot(a, b, input_precision="ieee")').replace("def f(", "# float32 on the CUDA cores\ndef f(")
    analysis = analyse(source)
    variant = rewrite(source, analysis, {"a.input_precision": "tf32x3"})
    assert variant == source.replace('input_precision="ieee"', 'input_precision="tf32x3"')
    again = analyse(variant)
    assert _precisions(again) == {"a.input_precision": "tf32x3"}
    assert template_key(variant, again) == template_key(source, analysis)
    assert not analysis.knob("a.input_precision").grows_shared_memory
    with pytest.raises(KnobError, match="is not one of"):
        rewrite(source, analysis, {"a.input_precision": "tf32"})


def test_the_first_move_of_a_float32_gemm_is_its_precision():
    """The Inductor start's GEMM (loop/inductor_gemm.py) multiplies float32 on the CUDA cores;
    three TF32 tensor-core products are its largest lever, so they are proposed first, whatever
    the seed, before any of its 16 other knobs moves."""
    from kernforge.loop import inductor_gemm

    source = "import torch\nimport triton\nimport triton.language as tl\n" + inductor_gemm.source("cuda")
    assert len(analyse(source, clusters=True).knobs) > 10
    for seed in range(4):
        proposal = OfflineProposer(seed=seed, clusters=True).propose(source)
        assert isinstance(proposal, Proposal)
        changed = {k: v for k, v in proposal.config.items() if proposal.base[k] != v}
        assert changed == {"a.input_precision": "tf32x3"}, proposal.description


@pytest.mark.parametrize("value", ["evict_normal", None, 1, ".cg"])
def test_rewrite_refuses_a_hint_outside_the_domain(value):
    source = _seed("rms_norm")
    with pytest.raises(KnobError, match="is not one of"):
        rewrite(source, analyse(source), {"x_ptr.eviction_policy": value})


@pytest.mark.parametrize("env, clusters", [
    ({"cuda": "12.8", "capability": "9.0"}, True),  # H100, H200
    ({"cuda": "12.8", "capability": "10.0"}, True),  # B200
    ({"cuda": "12.8", "capability": "8.0"}, False),  # A100: no thread-block clusters
    ({"cuda": None, "capability": "9.4"}, False),  # MI300 under ROCm reports 9.4 too
    ({"torch": "2.x"}, False),  # the CPU interpreter
])
def test_clusters_in(env, clusters):
    assert clusters_in(env) is clusters


def test_num_ctas_only_where_clusters_exist_and_the_kernel_calls_dot():
    gemm = _seed("gemm_small_m")
    assert "num_ctas" not in analyse(gemm).values()
    analysis = analyse(gemm, clusters=True)
    knob = analysis.knob("num_ctas")
    assert knob.value == 1 and knob.domain() == (1, 2, 4, 8) and not knob.grows_shared_memory
    variant = rewrite(gemm, analysis, {"num_ctas": 2})
    assert variant.replace(", num_ctas=2", "", 1) == gemm
    assert analyse(variant, clusters=True).values() == analysis.values() | {"num_ctas": 2}
    assert template_key(variant, analyse(variant, clusters=True)) == template_key(gemm, analysis)
    # a row kernel reduces within one CTA: nothing for a cluster to share
    norm = analyse(_seed("rms_norm"), clusters=True)
    assert "num_ctas" not in norm.values() and any("has no tl.dot" in n for n in norm.notes)
    # written by the author for a target without clusters: left as it is
    written = analyse(_hinted("tl.store(y_ptr + offs, tl.load(x_ptr + offs))\n",
                              launch="_k[(1,)](x, y, n, BLOCK=256, num_ctas=2)"))
    assert "num_ctas" not in written.values() and any("needs thread-block clusters" in n for n in written.notes)


def test_only_tiles_and_stages_count_for_shared_memory():
    analysis = analyse(_seed("gemm_small_m"), clusters=True)
    grows = {k.label for k in analysis.knobs if k.grows_shared_memory}
    assert grows == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"}


def test_reach_counts_what_the_search_can_propose():
    source = _seed("silu_and_mul")
    analysis = analyse(source)
    proposer = OfflineProposer(seed=0)
    total = math.prod(len(k.domain()) for k in analysis.knobs)
    reach = proposer.reach(source)
    assert (reach.total, reach.tried, reach.left) == (total, 0, total)
    assert reach.labels == tuple(analysis.values())
    # a GPU's times move the search: block sizes may widen to every power of two up to MAX_BLOCK
    widest = proposer.reach(source, widening=True)
    assert widest.total == 3 * 3 * MAX_BLOCK.bit_length() * 5 > total
    proposer.record(source, None)
    assert proposer.reach(source).tried == 1  # the parent: judged by the loop, it is tried
    proposer.propose(source)
    assert proposer.reach(source).tried == 2  # a proposal counts as soon as it is made
    assert OfflineProposer().reach("import torch\n") is None


def test_interpreter_runs_an_all_hinted_seed_bit_for_bit(tmp_path):
    """Hints are cache policies: the same loads, the same arithmetic, the same bits."""
    source = _seed("rms_norm")
    analysis = analyse(source)
    variant = rewrite(source, analysis, {"x_ptr.eviction_policy": "evict_first", "w_ptr.eviction_policy": "evict_last"})
    assert variant.count("eviction_policy=") == 2
    (tmp_path / "seed.py").write_text(source)
    (tmp_path / "variant.py").write_text(variant)
    x = torch.randn(3, 37, dtype=torch.float32)  # an odd row: masked lanes in the block
    w = torch.randn(37, dtype=torch.float32)
    outputs = [runtime.load_module(tmp_path / f"{n}.py").ModelNew()(x, w) for n in ("seed", "variant")]
    assert torch.equal(outputs[0], outputs[1])


# --- variants still compute the right thing (Triton interpreter on the CPU) --------------------

@pytest.mark.parametrize("name, assignment", [
    ("silu_and_mul", {"BLOCK": 128, "num_warps": 2}),
    ("softmax", {"BLOCK": 1024, "num_warps": 4, "num_stages": 2}),
    ("rms_norm", {"num_warps": 2}),
    ("rms_norm", {"x_ptr.eviction_policy": "evict_first", "w_ptr.eviction_policy": "evict_last", "num_warps": 4}),
    ("softmax", {"x_row.eviction_policy@29": "evict_last", "x_row.eviction_policy@39": "evict_first"}),
])
def test_variant_matches_reference_under_the_interpreter(name, assignment, tmp_path, device):
    task = load_task(name)
    source = _seed(name)
    variant = rewrite(source, analyse(source), assignment)
    path = tmp_path / "variant.py"
    path.write_text(variant)
    strict_precision()
    module = runtime.load_module(path)
    reference = runtime.reference_module(task)
    device_kind = "cuda" if device == "cuda" else "cpu"
    for shape in task.shapes(device_kind, hidden=False) + task.shapes(device_kind, hidden=True):
        init = runtime.make_init_inputs(task, shape)
        ref_model = runtime.build_model(reference.Model, init, 0, device)
        model = runtime.build_model(module.ModelNew, init, 0, device)
        inputs = runtime.make_inputs(task, shape, task.distributions[0], 7, device)
        high, low = run_reference(ref_model, inputs, task.mutated_inputs)
        cand = clone_inputs(inputs)
        outs = collect_outputs(model(*cand), cand, task.mutated_inputs)
        for c, h, lo in zip(outs, high, low, strict=True):
            result = compare(c, h, task.tolerance(str(lo.dtype).removeprefix("torch.")), low=lo)
            assert result.ok, f"{shape}: {result.describe()}"


# --- search ---------------------------------------------------------------------------------

def _verdict(time_us: float | None, shapes=(("T", 1), ("T", 64)), timing: str = "graph") -> Verdict:
    """A verifier verdict: accepted with times (CUDA-graph times unless told), or rejected."""
    if time_us is None:
        return Rejected(Status.COMPILE_ERROR, "out of resources")
    return Accepted(shapes=tuple(ShapeResult({k: v}, False, "bfloat16", timing, time_us=time_us * (1 + i))
                                 for i, (k, v) in enumerate(shapes)))


def _silu_time(config) -> float | None:
    """A made-up cost with its minimum at BLOCK=4096, num_warps=8 and both loads evict_first (each
    is read once); BLOCK=16384 fails to compile."""
    if config["BLOCK"] >= 16384:
        return None
    hints = sum(EVICTION_DOMAIN.index(v) for k, v in config.items() if ".eviction_policy" in k)
    return 10 + 3 * abs(math.log2(config["BLOCK"]) - 12) + 2 * abs(math.log2(config["num_warps"]) - 3) + 0.5 * hints


SILU_BEST = {"x_ptr.eviction_policy@18": "evict_first", "x_ptr.eviction_policy@19": "evict_first", "BLOCK": 4096,
             "num_warps": 8}


def _run(name, seed=0, limit=1000, cost=_silu_time):
    source = _seed(name)
    proposer = OfflineProposer(seed=seed)
    feedback = _verdict(cost(analyse(source).values()))
    proposals, last = [], None
    for _ in range(limit):
        last = proposer.propose(source, feedback)
        if isinstance(last, NoProposal):
            break
        proposals.append(last)
        proposer.record(last.source, _verdict(cost(last.config)))
    return proposals, last


def test_search_never_repeats_and_runs_out():
    proposals, last = _run("silu_and_mul")
    configs = [tuple(p.config.items()) for p in proposals]
    assert len(set(configs)) == len(configs)
    assert len({p.code_hash for p in proposals}) == len(proposals)
    assert isinstance(last, NoProposal) and last.kind == "exhausted"
    # every configuration within reach was proposed once, the parent's excepted
    labels = "x_ptr.eviction_policy@18, x_ptr.eviction_policy@19, BLOCK, num_warps"
    assert f"all {len(proposals) + 1} configurations of {labels}" in last.reason
    assert "best: x_ptr.eviction_policy@18=evict_first x_ptr.eviction_policy@19=evict_first BLOCK=4096 num_warps=8 at" \
        in last.reason


def test_search_follows_the_measurements():
    proposals, _ = _run("silu_and_mul")
    found = next(i for i, p in enumerate(proposals) if p.config == SILU_BEST)
    assert found < 20, [p.description for p in proposals[:found + 1]]
    # the base of a proposal is never a rejected configuration
    assert all(_silu_time(p.base) is not None for p in proposals)
    assert proposals[1].description.startswith("offline tuning of _silu_and_mul_kernel: ")


def test_small_space_is_exhausted_and_says_so():
    proposer = OfflineProposer(seed=0)
    source = _seed("rms_norm")  # 5 num_warps x 3 hints x 3 hints: 45 configurations, the parent's one of them
    configs = []
    for _ in range(44):
        result = proposer.propose(source)
        assert isinstance(result, Proposal)
        configs.append(tuple(result.config.values()))
    hints = [(x, w) for x in EVICTION_DOMAIN for w in EVICTION_DOMAIN]
    everything = {(x, w, n) for x, w in hints for n in (1, 2, 4, 8, 16)}
    assert sorted(configs, key=repr) == sorted(everything - {("", "", 8)}, key=repr)
    # nearest first: a step is one place along a domain, (evict_first, "", evict_last) for a hint,
    # so the six configurations one step away (a hint either way, 4 or 16 warps) come first
    def steps(c):
        return abs(EVICTION_DOMAIN.index(c[0]) - 1) + abs(EVICTION_DOMAIN.index(c[1]) - 1) + abs(math.log2(c[2] / 8))
    assert [steps(c) for c in configs[:6]] == [1] * 6, configs[:6]
    assert all(steps(c) == 2 for c in configs[6:6 + 13]), configs[6:6 + 13]
    result = proposer.propose(source)
    assert isinstance(result, NoProposal) and result.kind == "exhausted"
    assert "all 45 configurations of x_ptr.eviction_policy, w_ptr.eviction_policy, num_warps" in result.reason
    assert "nothing measured" in result.reason


def test_search_is_deterministic_under_a_seed():
    def sequence(seed):
        return [p.source for p in _run("gemm_small_m", seed=seed, limit=12, cost=_gemm_time)[0]]

    assert sequence(0) == sequence(0)
    assert sequence(0) != sequence(1)


def _gemm_time(config) -> float:
    return 20 + abs(math.log2(config["BLOCK_N"]) - 7) + config["num_stages"] * 0.5


def test_configurations_bigger_than_one_out_of_shared_memory_are_skipped():
    source = _kernel_module("def f(x, y, n):\n    _k[(1,)](x, y, n, BLOCK=256, GROUP_SIZE=1)\n")
    proposer = OfflineProposer(seed=0)
    out_of_memory = Rejected(Status.COMPILE_ERROR, "compiling failed while loading: OutOfResources: out of resource: "
                                                   "shared memory, Required: 245760, Hardware limit: 232448.")
    failed, proposed = [], []
    p = proposer.propose(source, _verdict(30.0))
    while isinstance(p, Proposal):
        grows = ("BLOCK", "num_stages")
        assert not any(all(p.config[k] >= f[k] for k in grows) for f in failed), p.config
        proposed.append(p.config)
        if p.config["BLOCK"] * p.config["num_stages"] >= 2048:
            failed.append(p.config)
            proposer.record(p.source, out_of_memory)
        else:
            proposer.record(p.source, _verdict(30 - math.log2(p.config["BLOCK"]) - p.config["num_warps"] / 4))
        p = proposer.propose(source)
    assert failed and len(failed) < len(proposed) / 4
    assert "skipped" in p.reason and "need more shared memory" in p.reason


def test_clusters_at_least_as_large_as_one_that_failed_to_compile_are_skipped():
    """A configuration that launches a cluster (num_ctas > 1) and that Triton's compiler refused
    (as Triton 3.6 refused fused_moe's gate-up kernel at num_ctas=2 on an H100) rules out that
    cluster and larger ones for the kernel; smaller clusters and the other knobs are still tried."""
    source = _seed("gemm_small_m")
    proposer = OfflineProposer(seed=0, clusters=True)
    refused = Rejected(Status.RUNTIME_ERROR, "running failed while checking the public shape M=1 N=6144 K=4096, normal "
                                             "inputs: RuntimeError: PassManager::run failed",
                       evidence={"check": "runtime", "error": "File \"triton/compiler/compiler.py\", in compile\n"
                                                              "RuntimeError: PassManager::run failed"})
    proposed, failed_at = [], None
    p = proposer.propose(source, _verdict(30.0))
    while isinstance(p, Proposal) and len(proposed) < 400:
        ctas = p.config["num_ctas"]
        assert failed_at is None or ctas < failed_at, (p.config, failed_at)
        proposed.append(p.config)
        if ctas >= 4 and failed_at is None:
            failed_at = ctas
            proposer.record(p.source, refused)
        else:
            proposer.record(p.source, _verdict(30.0 + len(proposed) * 0.01))
        p = proposer.propose(source)
    assert failed_at == 4 and any(c["num_ctas"] == 2 for c in proposed), "a smaller cluster is still tried"
    assert sum(c["num_ctas"] >= 4 for c in proposed) == 1
    if isinstance(p, NoProposal):
        assert "as large as one that failed to compile" in p.reason
    # a rejection for another reason rules nothing out
    other = OfflineProposer(seed=0, clusters=True)
    q = other.propose(source, _verdict(30.0))
    while isinstance(q, Proposal) and q.config["num_ctas"] == 1:
        other.record(q.source, _verdict(31.0))
        q = other.propose(source)
    other.record(q.source, Rejected(Status.INCORRECT, "wrong output at the public shape M=1"))
    assert not next(iter(other._families.values())).no_cluster


def test_proposals_in_flight_are_not_repeated():
    proposer = OfflineProposer(seed=3)
    source = _seed("softmax")
    pending = [proposer.propose(source) for _ in range(30)]
    assert len({p.code_hash for p in pending}) == 30 and all(isinstance(p, Proposal) for p in pending)


def test_history_from_an_earlier_run_is_not_proposed_again():
    first = OfflineProposer(seed=0)
    source = _seed("silu_and_mul")
    history = []
    for _ in range(6):
        p = first.propose(source, _verdict(20.0), history)
        history.append((p.source, _verdict(_silu_time(p.config))))
    resumed = OfflineProposer(seed=0)
    before = {tuple(analyse(s).values().items()) for s, _ in history}
    for _ in range(10):
        p = resumed.propose(source, _verdict(20.0), history)
        assert tuple(p.config.items()) not in before
    # the resumed proposer centres on the best configuration the history measured
    best = min(history, key=lambda h: h[1].shapes[0].time_us if h[1].accepted else math.inf)
    assert p.base == analyse(best[0]).values()


def test_a_new_best_within_noise_does_not_move_the_search():
    proposer = OfflineProposer(seed=0)
    source = _seed("rms_norm")
    first = proposer.propose(source, _verdict(10.0))
    proposer.record(first.source, _verdict(9.95))  # 0.5% faster: noise
    assert proposer.propose(source).base == analyse(source).values()
    third = proposer.propose(source)
    proposer.record(third.source, _verdict(9.0))  # 10% faster: a real improvement
    assert proposer.propose(source).base == third.config


def test_interpreter_times_never_move_the_search():
    """On a CPU every verdict is the interpreter's: accepted, but its times rank nothing, so the
    search stays centred on the parent and walks its neighbourhood in its own seeded order."""
    source = _seed("silu_and_mul")
    on_cpu, unmeasured = OfflineProposer(seed=0), OfflineProposer(seed=0)
    parent = analyse(source).values()
    cpu_bases, plain_bases = [], []
    for _ in range(12):
        p = on_cpu.propose(source, _verdict(50.0, timing="interpreter"))
        q = unmeasured.propose(source)
        assert p.config == q.config  # the same order as with nothing measured at all
        cpu_bases.append(p.base)
        plain_bases.append(q.base)
        fast = 1.0 if p.config["BLOCK"] == 4096 else 40.0  # would be a new best if times counted
        on_cpu.record(p.source, _verdict(fast, timing="interpreter"))
        unmeasured.record(q.source, None)
    assert cpu_bases == plain_bases == [parent] * 12
    assert "nothing measured on a GPU yet" in p.description


def test_times_in_descriptions_read_as_the_display_shows_them():
    """One unit per time, never an exponent: `23.6 ms` beside `23.6 ms`, not `2.359e+04 µs`."""
    proposer = OfflineProposer(seed=0)
    source = _seed("rms_norm")
    first = proposer.propose(source, _verdict(23_590.0))
    proposer.record(first.source, _verdict(23_590.0))
    second = proposer.propose(source)
    assert "e+0" not in second.description and "µs" not in second.description
    assert "ms, geometric mean over" in second.description
