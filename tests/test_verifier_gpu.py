"""The verifier on a GPU: the cheats that need a device (side streams, host threads, deferral,
L2 pinning, graph-capture detection, stale device memory, a time below the roofline floor) are
rejected with the right class; honest Triton and CUDA C++ kernels are accepted with real
timings and baselines measured side by side."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

import candidates as C
from kernforge.loop.evaluate import open_judge
from kernforge.tasks.loader import load_task
from kernforge.verifier import late_reads
from kernforge.verifier.judge import JudgeOptions
from kernforge.verifier.screen import screen

# timer attacks are called cheats on a quiet host (conftest.quiet_host)
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("quiet_host")]
TASKS = Path(__file__).parent / "tasks"


def _describe(verdict) -> str:
    return f"{verdict.status.value} #{verdict.threat}: {verdict.reason}"


def _options(tmp_path_factory, **kw) -> JudgeOptions:
    """Each judge's share of the GPU's memory: a night gives one judge a GPU; here pytest-xdist
    workers share one (two judges each, one of them judging at a time)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = JudgeOptions().arena_share / workers
    return JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), time_shapes="largest", batches=2, arena_share=share, **kw)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = _options(tmp_path_factory, baselines=True)
    with open_judge("cuda:0", pool_size=2, options=options) as j:
        yield j


@pytest.fixture(scope="module")
def runtime_judge(tmp_path_factory):
    # one timed shape, two batches: every defence of the timed batch runs, in seconds per verdict
    options = _options(tmp_path_factory, baselines=False, static_screen=False)
    with open_judge("cuda:0", pool_size=2, options=options) as j:
        yield j


@pytest.mark.parametrize("cheat", C.GPU_CHEATS, ids=[c.name for c in C.GPU_CHEATS])
def test_gpu_cheat_rejected_at_runtime(runtime_judge, cheat):
    verdict = runtime_judge.verify(cheat.source, load_task(TASKS / cheat.task))
    assert verdict.status.value == cheat.status and verdict.threat in (cheat.threat,) + cheat.also, _describe(verdict)


@pytest.mark.parametrize("cheat", [c for c in C.GPU_CHEATS if c.static_threat], ids=lambda c: c.name)
def test_gpu_cheat_rejected_by_static_screen(judge, cheat):
    verdict = judge.verify(cheat.source, load_task(TASKS / cheat.task))
    assert (verdict.status.value, verdict.threat) == ("static_rejected", cheat.static_threat), _describe(verdict)


@pytest.mark.parametrize("source", [C.HONEST, C.HONEST_CUDA], ids=["triton", "cuda_cpp"])
def test_honest_kernel_accepted_with_timings(judge, source):
    verdict = judge.verify(source, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, _describe(verdict)
    for s in verdict.shapes:
        assert s.timing in ("graph", "eager") and s.time_us > 0
        assert s.eager_us and s.eager_us > 0, "the eager baseline is measured in the same run"


@pytest.mark.parametrize("name, parts", [("fused_add_rms_norm", 4), ("reshape_and_cache", 4), ("rms_norm", 2)])
def test_seeds_with_large_or_in_place_outputs_are_accepted_with_their_second_reads_deferred(runtime_judge, name, parts):
    """The built-in tasks at their own shapes (256-512 MiB of outputs a call, over late_reads.DEFER_BYTES):
    on a GPU with room the heap keeps two more calls' outputs, and an in-place task's calls rotate
    through four parts of the input region, so every second read waits for a later compare
    (late_reads.Deferral); the honest seed is accepted all the same."""
    task = load_task(Path(__file__).parents[1] / "tasks" / "builtin" / name)
    verdict = runtime_judge.verify(task.seed_source, task)
    assert verdict.accepted, _describe(verdict)
    deferred = verdict.environment["deferred_reads"]
    assert deferred["input_parts"] == parts and deferred["defer_bytes"] > late_reads.DEFER_BYTES, deferred


def test_a_routine_verdict_times_the_public_shapes_and_an_audit_the_hidden_ones_too(tmp_path_factory):
    """Every verdict checks the hidden shapes; a routine one times the public shapes only, the
    audit's second verdict the hidden ones as well (JudgeOptions.time_hidden), and the audit
    compares like shapes and says the hidden speedup."""
    from kernforge.verifier.audit import audit

    options = replace(_options(tmp_path_factory, baselines=True), time_shapes="all")
    task = load_task(TASKS / "tiny_norm")
    with open_judge("cuda:0", pool_size=2, options=options) as judge:
        routine = judge.verify(C.HONEST, task)
        assert routine.accepted, _describe(routine)
        assert sorted((dict(s.shape)["T"], s.hidden) for s in routine.shapes) == [(4, False), (8, False)]
        result = audit(judge, C.HONEST, task, routine, tolerance=1.0)  # time-sliced by xdist's workers: not the point here
    assert result.verdict is not None and sorted(s.hidden for s in result.verdict.shapes) == [False, False, True, True]
    assert result.details["shapes"] == 2 and "hidden_x_compile" in result.details, result.details


def test_the_public_shapes_are_timed_before_any_hidden_shape_is_sent(tmp_path_factory):
    """A process that has seen a hidden shape never produces a figure a prompt shows: the public
    shapes are checked and timed first; an audit's hidden shapes are timed after their checks."""
    from kernforge.verifier.audit import audit

    options = replace(_options(tmp_path_factory, baselines=False), time_shapes="all")
    task = load_task(TASKS / "tiny_norm")
    with open_judge("cuda:0", pool_size=2, options=options) as judge:
        steps, check, time_all = [], judge._check_all, judge._time_all

        def checking(session, task, hidden, *args):
            steps.append("check " + ("hidden" if hidden else "public"))
            return check(session, task, hidden, *args)

        def timing(session, task, init_seed, own, sizes, plan, timed, arena_size):
            steps.append("time " + ",".join(sorted({"hidden" if h else "public" for _, h in timed})))
            return time_all(session, task, init_seed, own, sizes, plan, timed, arena_size)

        judge._check_all, judge._time_all = checking, timing
        routine = judge.verify(C.HONEST, task)
        assert routine.accepted, _describe(routine)
        assert steps == ["check public", "time public", "check hidden"]
        del steps[:]
        result = audit(judge, C.HONEST, task, routine, tolerance=1.0)
    assert result.verdict is not None and result.verdict.accepted, result.details
    assert steps[-4:] == ["check public", "time public", "check hidden", "time hidden"], steps


def test_torch_compile_is_compiled_before_the_gpu_is_taken_alone(tmp_path_factory):
    """The baseline's compile (seconds of Inductor and Triton on the CPU) is asked for while the
    judge holds the GPU shared; under the exclusive hold the baseline times that very compile.
    Both before the candidate's worker exists: nothing of it can run beside the baseline."""
    options = _options(tmp_path_factory, baselines=True)
    with open_judge("cuda:0", pool_size=1, options=options) as j:
        asked, ask, start = [], j._ask_ref, j._candidate_session

        def recording(reply_type, msg, **kw):
            got = ask(reply_type, msg, **kw)
            if msg["op"] in ("compile_baseline", "baseline"):
                asked.append((msg["op"], j.gate._writer == threading.get_ident(), got))
            return got

        def starting(*args, **kw):
            asked.append(("worker", False, None))
            return start(*args, **kw)

        j._ask_ref, j._candidate_session = recording, starting
        verdict = j.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted and all(s.compile_us for s in verdict.shapes), _describe(verdict)
    assert [(op, alone) for op, alone, _ in asked] == [("compile_baseline", False), ("baseline", True), ("worker", False)]
    assert asked[1][2]["compile"]["compile_seconds"] == asked[0][2]["seconds"], "compiled once, ahead"


def test_time_below_the_roofline_floor_is_rejected(runtime_judge, tmp_path):
    """THREATS #20: a task whose roofline says each shape must move a terabyte: any measured time
    is below the floor, and a time below the floor is rejected, never flagged and accepted."""
    folder = tmp_path / "tiny_norm"
    folder.mkdir()
    (folder / "reference.py").write_text((TASKS / "tiny_norm" / "reference.py").read_text())
    meta = (TASKS / "tiny_norm" / "meta.py").read_text()
    (folder / "meta.py").write_text(meta + "\n\ndef roofline(shape, dtype):\n    return 1e12, 0.0\n")
    verdict = runtime_judge.verify(C.HONEST, load_task(folder))
    assert (verdict.status.value, verdict.threat) == ("cheat", 20), _describe(verdict)


@pytest.mark.parametrize("name", ["rms_norm", "silu_and_mul", "fp8_quant_per_token", "fused_add_rms_norm"])
def test_builtin_seed_accepted_on_gpu(runtime_judge, name):
    """Seeds pass the static screen and the full runtime verification (baselines off: bench/verify.py
    measures those)."""
    task = load_task(name)
    assert screen(task.seed_source, allow_torch_ops=task.allow_torch_ops).ok
    verdict = runtime_judge.verify(task.seed_source, task)
    assert verdict.accepted, _describe(verdict)


def test_a_candidate_slower_than_the_bar_is_timed_at_the_largest_shape_only(runtime_judge):
    """With a bar at a tenth of the seed's own times, the judge times the largest public shape, sees
    it cannot lead, and leaves the other shapes untimed (verifier/contender.py); without a bar, and
    with a bar it clears, every shape is timed. A tenth, not a half: gputestx runs three pytest
    workers on one GPU, and on the H100 (session 46) the seed cleared a halved bar: its two
    verdicts' times, taken beside other workers' kernels, differed by more than 1.8x."""
    from kernforge.tasks import runtime
    from kernforge.verifier import contender
    from kernforge.verifier.verdict import NOT_TIMED

    task = load_task("rms_norm")
    whole = runtime_judge.verify(task.seed_source, task)
    assert whole.accepted and all(s.timing != NOT_TIMED for s in whole.shapes), _describe(whole)
    bar = contender.bar_of(whole)
    beaten = runtime_judge.verify(task.seed_source, task, {k: v / 10 for k, v in bar.items()})
    assert beaten.accepted, _describe(beaten)
    largest = runtime.largest_shape(task, "cuda").as_dict()
    timed = [s for s in beaten.shapes if s.timing != NOT_TIMED]
    assert [(dict(s.shape), s.hidden) for s in timed] == [(largest, False)], _describe(beaten)
    assert any(f.startswith(contender.NOT_A_CONTENDER) for f in beaten.flags), _describe(beaten)
    cleared = runtime_judge.verify(task.seed_source, task, {k: v * 10 for k, v in bar.items()})
    assert all(s.timing != NOT_TIMED for s in cleared.shapes), _describe(cleared)


# ---- the red-team corpus on the GPU (redteam.py) --------------------------------------------------
import redteam as R  # noqa: E402

GPU_ATTACKS = [a for a in R.ATTACKS if a.where in ("gpu", "both")]


@pytest.mark.parametrize("attack", GPU_ATTACKS, ids=[a.name for a in GPU_ATTACKS])
def test_redteam_attack_on_gpu(runtime_judge, attack):
    verdict = runtime_judge.verify(attack.source, load_task(TASKS / attack.task))
    got = (verdict.status.value, verdict.threat)
    if attack.cpu_limit:  # the routine verdict cannot see it; the audit's kernel list does (test_audit_*)
        return
    assert got == attack.expect or got in attack.also, _describe(verdict)


@pytest.mark.parametrize("name, source, where", R.HONEST + [("host_sync", R.HOST_SYNC, "gpu")], ids=[h[0] for h in R.HONEST] + ["host_sync"])
def test_unusual_honest_kernels_accepted_on_gpu(runtime_judge, name, source, where):
    verdict = runtime_judge.verify(source, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, _describe(verdict)
    for s in verdict.shapes:
        assert s.timing in ("graph", "eager") and s.time_us > 0 and s.batch_calls >= 1


# ---- the audit's Nsight Compute record (verifier/ncu.py) -------------------------------------------
def _ncu_or_skip(judge):
    from kernforge.verifier import ncu

    if ncu.available() is None:
        pytest.skip("ncu is not installed")
    return ncu


def test_audit_of_a_seed_reads_the_nsight_compute_record(runtime_judge):
    from kernforge.verifier.audit import TOLERANCE, audit

    _ncu_or_skip(runtime_judge)
    task = load_task("rms_norm")
    recorded = runtime_judge.verify(task.seed_source, task)
    assert recorded.accepted, _describe(recorded)
    # the audit's time check holds on a GPU of its own; pytest-xdist workers time-slice it (one
    # such audit came out more than 15% slower than its verdict, another 149% in session 36: the
    # gate orders one process's judges, not three), and this test is about ncu's record
    shared = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
    result = audit(runtime_judge, task.seed_source, task, recorded, tolerance=4.0 if shared else TOLERANCE)
    assert result.passed, result.reason
    record = result.details["ncu"]
    assert record["ran"], record["note"]
    assert record["per_call_us"] > 0 and any("rms" in k for k in record["kernels"]), record


def test_kernel_list_sees_torch_compute_behind_a_decoy_launch(runtime_judge):
    """The attack the routine verdict cannot see (its trace is scrubbed, a decoy kernel runs):
    the driver's own list of kernels shows torch computing."""
    ncu = _ncu_or_skip(runtime_judge)
    attack = next(a for a in R.ATTACKS if a.name == "decoy_launch_hides_torch_compute")
    task = load_task(TASKS / attack.task)
    profile = runtime_judge.profile(attack.source, task)
    assert profile.ran, profile.note
    from kernforge.verifier.kernels import own_kernel_names

    why = ncu.judge(profile, own_kernel_names(attack.source), task.allow_torch_ops, None)
    assert why is not None and "#16" in why, profile.to_dict()


# ---- the time of record by two batch sizes (defences/clock.per_call) --------------------------------
#: The attack on the difference: forward reads, from the harness's frame, how many calls the batch
#: being captured holds, and pads the short batch with wasted launches, so that the short window
#: grows and the difference between the two shrinks.
PADS_THE_SHORT_BATCH = C.with_forward('''        import inspect
        frame, sets = inspect.currentframe().f_back, None
        while frame is not None and sets is None:
            sets = frame.f_locals.get("sets") if frame.f_code.co_name == "_prepare_batch" else None
            frame = frame.f_back
        if sets is not None:
            SIZES.append(len(sets))
        if sets is not None and len(sets) < max(SIZES):
            for _ in range(30):
                norm(x, w)
        return norm(x, w)''', "\nSIZES = [0]\n")


def test_a_padded_short_batch_gains_at_most_the_guard(runtime_judge):
    from kernforge.verifier.defences import clock

    task = load_task(TASKS / "tiny_norm")
    honest = runtime_judge.verify(C.HONEST, task)
    padded = runtime_judge.verify(PADS_THE_SHORT_BATCH, task)
    assert honest.accepted and padded.accepted, (_describe(honest), _describe(padded))
    h, p = honest.shapes[0], padded.shapes[0]
    assert h.method in ("difference", "difference, bounded") and h.short_calls
    assert p.method == "difference, bounded", p
    # the padding moves the record at most by the guard below the long batch's own figure
    assert p.time_us >= (1 - clock.DIFFERENCE_GUARD) * p.single_us * 0.999, p
    # which the padding cannot lower: against the honest verdict's, less 5% for the two verdicts'
    # noise; only on a GPU of its own (pytest-xdist workers time-slice it: 70% spreads were seen)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) == 1:
        assert p.time_us >= (1 - clock.DIFFERENCE_GUARD) * h.single_us * 0.95, (p, h)


def test_the_fused_comparison_builds_and_agrees_for_every_output_dtype():
    """The timed batches' pass/fail kernel is used on this GPU for every dtype an output and its
    references come in: its self-check built and agreed with the PyTorch ops. A kernel Triton's
    code generator refused fell back to those ops silently, for every dtype, several times slower."""
    import torch

    from kernforge.verifier import compare_kernel

    device = torch.device("cuda", 0)
    floats = [(torch.bfloat16, torch.float32, torch.bfloat16), (torch.float16, torch.float32, torch.float16),
              (torch.float32, torch.float32, torch.float32), (torch.float32, torch.float64, torch.float32),
              (torch.bfloat16, torch.float64, torch.bfloat16), (torch.float32, torch.float64, None),
              (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e4m3fn), (torch.float8_e5m2, torch.float32, None)]
    refused = {key: why for key, why in compare_kernel.NOT_USED.items()}
    for c_dtype, h_dtype, lo_dtype in floats:
        if not compare_kernel._self_checked(c_dtype, h_dtype, lo_dtype, device):
            refused[(c_dtype, h_dtype, lo_dtype)] = compare_kernel.NOT_USED.get((c_dtype, h_dtype, lo_dtype, str(device)), "?")
    assert not refused, refused


def test_a_seed_given_its_kernels_compiled_ahead_is_accepted(runtime_judge, monkeypatch):
    """Its worker, warmed up with Triton's own modules loaded from its cache, is given the files
    of its kernels compiled ahead at the public shapes (verifier/triton_ahead.py) and must judge
    as without them: the first H100 run wrote the worker ahead's copies of those modules over the
    loaded ones, and every verdict crashed. Its audit is given them too, its second verdict's
    worker and the profiled one (loop/devices.py)."""
    from kernforge.verifier import ncu, triton_ahead
    from kernforge.verifier.audit import TOLERANCE, audit

    monkeypatch.setattr(triton_ahead, "READY_WAIT_S", 120.0)  # the pool refills beside other tests
    task = load_task("rms_norm")
    ahead = runtime_judge.kernels_ahead(task.seed_source, task)
    files = ahead.run()
    assert ahead.shapes == len(task.shapes("cuda", hidden=False))
    assert ahead.decoys == triton_ahead.DECOYS, ahead.outcome  # and at the shapes drawn as decoys
    assert any(name.endswith(".cubin") for name in files), sorted(files)
    # where Triton builds a launcher per kernel (a C compile at its first launch: Triton 3.6), each
    # kernel's comes too, alone under its key, and never Triton's driver module (loaded already)
    from triton.backends.nvidia import driver as nvidia_driver
    from kernforge.verifier.triton_files import launcher_file

    shared_objects = [name for name in files if name.endswith(".so")]
    assert all(launcher_file(name.split("/")[1]) for name in shared_objects), shared_objects
    if hasattr(nvidia_driver, "make_launcher"):
        assert shared_objects, sorted(files)
    verdict = runtime_judge.verify(task.seed_source, task, compiled=files)
    assert verdict.accepted, _describe(verdict)
    shared = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1
    result = audit(runtime_judge, task.seed_source, task, verdict, tolerance=4.0 if shared else TOLERANCE, compiled=files)
    assert result.passed, result.reason
    if ncu.available() is not None:
        assert result.details["ncu"]["ran"], result.details["ncu"]["note"]
