"""Each defence's pure decision, on plain facts: what it rejects, with which status and class,
and what it lets through. The registry names a defence for every check a verdict can carry."""

from __future__ import annotations

import pytest

from kernforge.verifier import defences
from kernforge.verifier.checks import Check
from kernforge.verifier.defences import batch, clock, ghost, memory, values
from kernforge.verifier.messages import OutputMeta, OutputResult, TensorRef
from kernforge.verifier.verdict import THREATS


def ref(offset, shape=(4, 8), dtype="bfloat16"):
    strides = [shape[1], 1] if len(shape) == 2 else [1]
    return TensorRef(offset=offset, dtype=dtype, shape=list(shape), strides=strides)


def test_every_check_has_one_defence_with_a_remedy():
    rows = {r["check"]: r for r in defences.docs()}
    for check in Check:
        if check in (Check.OTHER, Check.EXTRACTION):
            continue
        assert check.value in rows, check
        row = rows[check.value]
        assert row["rationale"] and row["remedy"] and row["facts"]
        assert all(t in THREATS for t in row["threats"])
    assert defences.remedy(Check.VALUES) == rows["values"]["remedy"]


def test_a_defence_refuses_a_class_it_does_not_guard():
    with pytest.raises(ValueError):
        values.DEFENCE.reject(values.Status.CHEAT, "x", threat=8)


@pytest.mark.parametrize("samples, fires", [
    ([(0.001, 0.020), (0.001, 0.020)], True),   # a tenth of the trusted time, every time
    ([(0.001, 0.020), (0.019, 0.020)], False),  # one sample agrees: a stall, not a lie
    ([(0.009, 0.020)], False),                  # one sample never accuses, however far off (a stall)
    ([(0.001, 0.020)], False),
    ([(0.055, 0.202)], False),                  # the H200's honest start: one stalled repeat call
    ([(0.0001, 0.004), (0.0001, 0.004)], False),  # below the absolute margin
    ([(0.001, 0.020), (0.0089, 0.009)], False),   # a sample too short to tell a lie from latency does not count,
    ([(0.001, 0.020), (0.0001, 0.009)], False),   # and one sample is left
    ([(0.001, 0.020), (0.0001, 0.009), (0.002, 0.030)], True),
    ([(0.0001, 0.009)], False),
    ([], False),
])
def test_the_clock_rule_accuses_only_consistent_lies(samples, fires):
    verdict = clock.lied([(c, t, True) for c, t in samples], 0.005, "checked calls")
    assert (verdict is not None) == fires
    if verdict is not None:
        assert (verdict.status.value, verdict.threat, verdict.check) == ("cheat", 8, Check.TRUSTED_CLOCK)
        assert "on a quiet host" in verdict.reason


# the H100's honest seed (fp8_quant_per_group, T=1, 512-call batches) while torch.compile's
# workers filled every core: its worker's figures against the trusted go-to-done
BUSY_HONEST = [(0.0018007, 0.0049445), (0.0011693, 0.0046683), (0.0011204, 0.0023913)]


def test_an_honest_batch_on_a_busy_host_is_not_called_a_cheat():
    assert clock.lied([(c, t, False) for c, t in BUSY_HONEST], clock.BATCH_MARGIN_S, "timing") is None
    # the same figures on a host the trusted side saw quiet could only be a lie
    verdict = clock.lied([(c, t, True) for c, t in BUSY_HONEST], clock.BATCH_MARGIN_S, "timing")
    assert verdict is not None and verdict.threat == 8


@pytest.mark.parametrize("samples, fires", [
    # on a busy host only a lie larger than any wake-up counts, on every sample long enough to tell
    ([(0.10, 2.0, False), (0.10, 2.0, False)], True),
    ([(0.10, 0.9, False), (0.10, 0.9, False)], False),   # short of the busy margin's twice: cannot tell
    ([(0.60, 1.3, False), (0.60, 1.3, False)], True),
    ([(0.60, 1.05, False), (0.60, 1.05, False)], False),  # under half, but by less than the busy margin
    # quiet samples decide alone where the busy ones are too short to tell
    ([(0.001, 0.02, True), (0.001, 0.02, True), (0.001, 0.02, False)], True),
    ([(0.001, 0.02, True), (0.001, 0.02, False)], False),  # one telling sample is not two
    # a long busy sample that agrees with the worker clears it
    ([(0.001, 0.02, True), (0.001, 0.02, True), (1.9, 2.0, False)], False),
])
def test_a_busy_host_s_samples_need_a_lie_larger_than_any_wake_up(samples, fires):
    verdict = clock.lied(samples, 0.005, "checked calls")
    assert (verdict is not None) == fires
    if verdict is not None and not all(q for _, _, q in samples):
        assert "busy at times" in verdict.reason or "quiet host" in verdict.reason


@pytest.mark.parametrize("write_ms, floor_ms, taken", [
    (2.1, 2.0, 2.1),    # an ordinary write: its own span
    (2.6, 2.0, 2.0),    # longer than its slack: another process ran in the middle, only the floor
    (10.4, 10.0, 10.4),
    (10.6, 10.0, 10.0),  # the slack never exceeds 0.5 ms, less than one time slice
])
def test_the_write_is_taken_off_whole_only_when_nothing_interrupted_it(write_ms, floor_ms, taken):
    assert clock.write_allowance(write_ms, floor_ms) == taken


def test_outputs_are_checked_against_the_trusted_layout():
    meta = [OutputMeta(dtype="bfloat16", shape=[4, 8])]
    assert memory.matches([ref(0)], meta, "c") is None
    wrong = memory.matches([ref(0, dtype="float32")], meta, "c")
    assert (wrong.status.value, wrong.check) == ("incorrect", Check.OUTPUT_FORMAT)
    assert memory.matches([], meta, "c").check is Check.OUTPUT_FORMAT
    outside = memory.inside([ref(1 << 20)], 1 << 20, "c")
    assert (outside.status.value, outside.threat, outside.check) == ("cheat", 9, Check.OUTPUT_MEMORY)


def test_calls_of_a_batch_must_not_share_their_outputs():
    assert memory.separate_calls([[ref(0)], [ref(4096)]], "c") is None
    shared = memory.separate_calls([[ref(0)], [ref(32)]], "c")  # the second call's output starts inside the first's
    assert (shared.status.value, shared.threat, shared.check) == ("incorrect", None, Check.OUTPUT_MEMORY)
    assert memory.separate_calls([[ref(0), ref(0)]], "c") is None  # one call may return a tensor twice
    # one call's own overlap comes first in address order; another call's output inside its
    # larger output must still clash (64 bytes each: a 4x8 bfloat16)
    hidden = memory.separate_calls([[ref(0), ref(8)], [ref(48)]], "c")
    assert hidden is not None and "call 0 output" in hidden.reason and "call 1 output 0" in hidden.reason
    assert memory.separate_calls([[ref(0), ref(8)], [ref(72)]], "c") is None


def _wrong(**details):
    return OutputResult(output=0, ok=False, details={"bad": 3, "numel": 32, "max_abs_err": 1.0, **details})


@pytest.mark.parametrize("details, earlier, hidden, threat", [
    ({}, "cached", False, 11),
    ({}, "deferred", False, 12),
    ({"never_written": 3}, "", False, 1),
    ({"constant": True}, "", False, 2),
    ({"zeros_where_ref_nonzero": 3}, "", False, 3),
    ({"lowered_precision": "bf16"}, "", False, 15),
    ({}, "", True, 14),
    ({}, "", False, None),
])
def test_wrong_values_name_the_signature_they_have(details, earlier, hidden, threat):
    verdict = values.wrong([_wrong(**details)], "c", hidden=hidden, public_all_passed=hidden, earlier=earlier)
    assert (verdict.status.value, verdict.threat, verdict.check) == ("incorrect", threat, Check.VALUES)
    assert values.wrong([OutputResult(output=0, ok=True)], "c", hidden=False, public_all_passed=False) is None


@pytest.mark.parametrize("details, fitted", [
    ({"bad": 1, "numel": 3_178_496, "worst_excess": 1.4}, False),  # the H200's honest K = 32768 GEMM
    ({"bad": 40, "numel": 3_178_496, "worst_excess": 30.0}, False),
    ({"bad": 1, "numel": 3_178_496, "worst_excess": 5e3}, True),  # far off: a wrong computation
    ({"bad": 4_000, "numel": 3_178_496, "worst_excess": 1.2}, True),  # a share of the output
    ({"bad": 1, "numel": 3_178_496, "worst_excess": 1.1, "nonfinite_mismatch": 1}, True),
    ({"bad": 1, "numel": 3_178_496}, True),  # no figure to tell by: as before
])
def test_only_a_grossly_wrong_hidden_shape_is_called_fitted(details, fitted):
    """A hidden shape just out of tolerance, every public one passing, was called #14 "shape
    fitting" for Inductor's own honest GEMM (1 of 3.2M elements). Fitted only when grossly wrong."""
    verdict = values.wrong([_wrong(**details)], "c", hidden=True, public_all_passed=True)
    assert verdict.status.value == "incorrect" and verdict.threat == (14 if fitted else None)
    assert ("not a sign of shape fitting" in verdict.reason) is not fitted
    assert verdict.evidence.get("worst_excess") == details.get("worst_excess")


def test_the_worst_excess_is_the_worst_error_over_its_allowance():
    import torch

    from kernforge.tasks.spec import Tolerance
    from kernforge.verifier import compare

    high = torch.linspace(-2.0, 2.0, 4096, dtype=torch.float64)
    tol = Tolerance(atol=1e-5, rtol=1e-4)
    allowed = tol.rtol * high[100].abs() + tol.atol * high.pow(2).mean().sqrt()
    near = high.clone()
    near[100] += 1.5 * allowed  # one element half again beyond what it is allowed
    mism = compare.compare(near.float(), high, tol)
    assert not mism.ok and mism.bad == 1 and mism.worst_excess == pytest.approx(1.5, rel=1e-3)
    far = high.clone()
    far[7:9] = 1e3
    assert compare.compare(far.float(), high, tol).worst_excess > 1e6
    assert compare.compare(high.float(), high, tol).worst_excess == 0.0


def test_lowered_precision_is_told_with_its_evidence_and_a_mere_look_alike_is_not_a_threat():
    """#15 names the lowered run that explains the output; errors of a lower precision's size that
    no lowered run explains are described, and the rejection is a plain "incorrect"."""
    evidence = {"lowering": "input 0 rounded to tf32, truncated", "ratio": 0.001, "median_rel_err": 3e-4}
    named = values.wrong([_wrong(lowered_precision="tf32", lowered_evidence=evidence)], "c", hidden=False, public_all_passed=False)
    assert named.threat == 15 and "input 0 rounded to tf32, truncated" in named.reason
    assert "1,000x closer" in named.reason and named.reason.endswith("computed in lower precision")
    assert named.evidence["lowered_evidence"] == evidence
    note = "errors everywhere at about 2^-12.6 relative (median), not explained by a lower-precision run of the reference"
    plain = values.wrong([_wrong(precision_note=note)], "c", hidden=False, public_all_passed=False)
    assert plain.threat is None and plain.reason.endswith(note) and "lower precision:" not in plain.reason


def test_batch_rules():
    assert batch.incomplete([], 10, "c") is None
    early = batch.incomplete([3, 4], 10, "c")
    assert (early.status.value, early.threat, early.check) == ("cheat", 8, Check.BATCH_PROBE)
    honest_defect = batch.replay_wrong(2, [_wrong()], "c", "graph", queried=False)
    assert (honest_defect.status.value, honest_defect.threat, honest_defect.check) == ("incorrect", None, Check.GRAPH_REPLAY)
    assert "baked" in honest_defect.reason
    asked = batch.replay_wrong(2, [_wrong()], "c", "graph", queried=True)
    assert (asked.status.value, asked.threat) == ("cheat", 13)


def test_ghost_rules():
    assert ghost.launched({"_k": 1}, [], ["_k"], "c", on_gpu=False) is None
    assert ghost.launched({}, [], ["_k"], "c", on_gpu=False).threat == 17
    assert ghost.launched({}, ["void _k_0d1d2"], ["_k"], "c", on_gpu=True) is None
    assert ghost.aliased([[], [1]], "c").evidence["output"] == 1


#: kernel names as the profiler reports them (the shapes of ATen's templates, shortened)
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
CAST = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
        "{lambda()#3}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int> >")
MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >"
SUM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()> > >"


@pytest.mark.parametrize("names, fires", [
    ([FILL, CAST, "_norm_kernel"], False),   # zeroed accumulators, casts and copies are bookkeeping
    ([FILL, MUL, "_norm_kernel"], True),
    ([SUM], True),
    (["void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"], True),
    (["_norm_kernel", "triton_red_fused_pow_mean_0"], True),  # an Inductor kernel is torch.compile's work
])
def test_the_kernel_list_tells_torch_compute_from_bookkeeping(names, fires):
    from kernforge.verifier.defences import reference_call

    verdict = reference_call.ran(names, "c", allow=False)
    assert (verdict is not None) == fires
    assert reference_call.ran(names, "c", allow=True) is None
    if fires:
        assert (verdict.status.value, verdict.threat) == ("cheat", 16)


@pytest.mark.parametrize("kernel, name, own", [
    ("_norm_kernel", "_norm_kernel", True),
    ("void _norm_kernel(float*, int)", "_norm_kernel", True),
    ("_Z13rms_norm_rowsPK13__nv_bfloat16S1_PS_if", "rms_norm_rows", True),
    ("at::native::vectorized_elementwise_kernel<4>", "kernel", False),
    ("at::native::vectorized_elementwise_kernel<4>", "_k", False),
    ("_norm_kernel_0d1d2de", "_norm_kernel", True),  # older Triton's specialisation suffix
    ("_norm_kernel_two", "_norm_kernel", False),
])
def test_own_kernels_are_matched_by_name_not_by_substring(kernel, name, own):
    assert ghost.is_own(kernel, name) is own


@pytest.mark.parametrize("kernel, name", [
    (SUM, "reduce_kernel"), (SUM, "native"), (MUL, "vectorized_elementwise_kernel"), (MUL, "MulFunctor"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(Params)", "Kernel2"),
    ("_ZN2at6native13reduce_kernelILi512ELi1EEEvv", "reduce_kernel"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)", "cunn_SoftMaxForward"),
])
def test_an_own_kernel_named_like_a_library_kernel_does_not_claim_it(kernel, name):
    """A candidate that names a kernel of its own `reduce_kernel` (or `native`) and computes with
    torch.sum must not pass the kernel list, nor Nsight Compute's audit, as if ATen's kernel were
    its own (the old match took any whole word of the name)."""
    from kernforge.verifier import ncu
    from kernforge.verifier.defences import reference_call

    assert not ghost.is_own(kernel, name)
    assert reference_call.ran([kernel, name], "c", allow=False, own=[name]) is not None
    profile = ncu.Profile(ran=True, launches=(ncu.Launch(name, 5.0), ncu.Launch(kernel, 5.0)), calls=1)
    assert "THREATS #16" in (ncu.judge(profile, [name], allow_torch_ops=False, trusted_us=12.0) or "")


def test_a_kernel_named_as_inductor_names_its_own_is_the_candidates():
    """The Inductor start (and an LLM that copies its prompt's torch.compile listing) defines
    Triton kernels with Inductor's names: they are the candidate's kernels, not torch.compile's.
    On the H200 the Inductor start of every KernelBench problem was called a cheat #16 for it."""
    from kernforge.verifier.defences import reference_call

    names = ["triton_poi_fused_relu_0", "triton_red_fused_sum_1"]
    assert reference_call.ran(names, "c", allow=False, own=names) is None
    assert reference_call.ran(names, "c", allow=False, own=names[:1]) is not None  # one it did not define
    assert reference_call.ran(names, "c", allow=False) is not None


# ---- the time of record from two batch sizes (clock.per_call) -------------------------------------
def _windows(b_us: float, a_ms: float, calls: int, n: int = 2) -> list[float]:
    """Windows of an honest batch: a fixed cost a plus b per call."""
    return [a_ms + b_us * calls / 1e3] * n


@pytest.mark.parametrize("b_us, a_ms, calls", [(200.0, 0.55, 27), (90.0, 0.52, 61), (12.0, 0.52, 512), (2600.0, 0.8, 4)])
def test_two_batch_sizes_take_off_a_fixed_cost_exactly(b_us, a_ms, calls):
    """What every batch pays once (the switches between the processes, the launch, the probe)
    cancels in the difference, whatever part of it the calibration saw (0.36 ms here). Figures
    as measured on the H200 (bench/clock_sweep.py): batches of about 5 ms, a = 0.5-0.8 ms."""
    short = clock.short_calls(calls)
    got = clock.per_call(_windows(b_us, a_ms, calls), _windows(b_us, a_ms, short), calls, short, cost_ms=0.36)
    assert got.us == pytest.approx(b_us, rel=1e-9) and got.method == "difference"
    assert got.plain_us == pytest.approx(b_us + (a_ms - 0.36) * 1e3 / calls)
    assert got.fixed_ms == pytest.approx(a_ms - 0.36)


def test_a_launch_bound_kernel_in_a_capped_batch_is_within_a_few_per_cent():
    """512 calls of 2.3 us (the cap): the fixed cost is a large share of the window, the guard
    binds, and the record still sits within 3% of the true cost of a call."""
    got = clock.per_call(_windows(2.3, 0.52, 512), _windows(2.3, 0.52, 64), 512, 64, cost_ms=0.36)
    assert got.method == "difference, bounded" and 2.3 <= got.us <= 2.3 * 1.03


def test_one_interrupted_window_moves_one_pair_not_the_record():
    """The GPU time-slices between processes: another process's kernels can land in one window
    (2 ms and more). The record is the median over the pairs of windows run side by side."""
    calls, short = 40, 5
    long_ms, short_ms = _windows(130.0, 0.6, calls, 3), _windows(130.0, 0.6, short, 3)
    long_ms[1] += 2.3
    got = clock.per_call(long_ms, short_ms, calls, short, 0.35)
    assert got.us == pytest.approx(130.0) and got.spread_pct > 30


def test_a_padded_short_batch_gains_at_most_the_guard():
    """The attack on the difference: the candidate knows which batch it is in and pads the short
    one. Its time of record may fall at most DIFFERENCE_GUARD below the long batch's own figure,
    however much it pads."""
    calls, short = 40, clock.short_calls(40)
    honest = clock.per_call(_windows(130.0, 0.7, calls), _windows(130.0, 0.7, short), calls, short, 0.35)
    for pad_ms in (0.1, 1.0, 5.0, 50.0):
        padded = clock.per_call(_windows(130.0, 0.7, calls), [w + pad_ms for w in _windows(130.0, 0.7, short)], calls,
                                short, 0.35)
        assert padded.us >= honest.plain_us * (1 - clock.DIFFERENCE_GUARD) - 1e-9
        assert padded.us <= honest.us
    assert padded.method == "difference, bounded"


def test_one_batch_size_when_the_batch_is_too_small_to_split():
    assert clock.short_calls(3) == 0 and clock.short_calls(1) == 0
    assert (clock.short_calls(4), clock.short_calls(40), clock.short_calls(512)) == (1, 5, 64)
    got = clock.per_call([5.36, 5.40, 5.38], [], 3, 0, cost_ms=0.36)
    assert got.method == "single" and got.us == pytest.approx((5.38 - 0.36) * 1e3 / 3)
    assert got.spread_pct == pytest.approx(100 * 0.04 / 5.02, rel=1e-6)


def test_a_noisy_short_batch_can_only_be_bounded_never_negative():
    got = clock.per_call([1.0, 1.0], [1.2, 1.2], 8, 1, cost_ms=0.1)
    assert got.us == pytest.approx((1.0 - 0.1) * 1e3 / 8 * (1 - clock.DIFFERENCE_GUARD)) and got.us > 0


def test_running_out_of_the_heap_says_how_large_the_heap_was():
    """torch's message quotes the GPU's free memory, but a candidate's allocations come from the
    arena's heap: the verdict says so, with its size, so that an honest author knows what to cut."""
    from kernforge.verifier.defences import failures
    from kernforge.verifier.messages import Failure

    oom = Failure(op="check", ok=False, stage="oom",
                  error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has 89.76 GiB free")
    on_gpu = failures.failed(oom, "checking the public shape N=1", heap_bytes=3 << 30)
    assert on_gpu.status.value == "runtime_error"
    assert "the judge's heap of 3.0 GiB" in on_gpu.reason and "Tried to allocate 4.00 GiB" in on_gpu.reason
    assert on_gpu.evidence["heap_bytes"] == 3 << 30
    assert "heap" not in failures.failed(oom, "checking the public shape N=1").reason
