"""kernforge export: choosing entries from the archive, the dispatcher, the CLI, and the whole flow
(archive -> package -> wheel -> fresh virtual environment -> the package's own tests).

The archive is filled through the Archive API with one run of rms_norm, silu_and_mul (two
accepted kernels each: the seed and a retuned seed) and fused_add_rms_norm (the seed; it writes
its inputs in place), verified under the Triton interpreter (what a CPU machine can check) and
on an H200 (sm_90, measured with CUDA graphs), plus a rejected attempt and a reuse row per task
and environment that must never be exported. Per-shape numbers are shaped like the
verifier's: interpreter times in milliseconds with no speedups, GPU times near the bandwidth
floor with eager and torch.compile baselines. Interpreter verdicts are correctness only: their
times are never ranked, so none is ever exported, and an archive with nothing else exports
nothing and says so. On a machine with a GPU the package's tests run the sm_90 entries on CUDA;
without one they skip every entry and test the fallbacks, opcheck and torch.compile.
"""

from __future__ import annotations

import json
import sys
import tempfile
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from kernforge.archive import export
from kernforge.archive.export import (
    ExportError,
    ExportOptions,
    NothingToExport,
    plan_export,
)
from kernforge.archive import export_check, synthetic
from kernforge.archive.export_check import PackageCheckFailed, check_package
from kernforge.sandbox.confine import confine_command
from kernforge.archive.records import NewAttempt
from kernforge.archive.store import Archive
from kernforge.cli import app
from kernforge.tasks import runtime
from kernforge.tasks.loader import load_task
from kernforge.verifier.audit import Audit
from kernforge.verifier.verdict import Accepted, Rejected, ShapeResult, Status
from typer.testing import CliRunner

TEMPLATE = Path(export.__file__).with_name("export_template")
INTERPRETER = {"python": "3.11.7", "torch": torch.__version__, "triton": "3.6.0", "cuda": None, "gpu": None,
               "device": "cpu", "arch": "interpreter", "cpu": "x86_64"}
H200 = {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "gpu": "NVIDIA H200",
        "capability": "9.0", "arch": "sm_90", "sms": 132, "memory_gib": 139.8, "l2_bytes": 62914560,
        "driver": "580.159.03", "device": "cuda"}
BANDWIDTH = 4.3e12  # bytes/s measured on the H200
#: the shape (per task) where the GPU seed is launch-bound and slower than eager: the reference stays
SLOW_GPU_SHAPE = {"rms_norm": {"T": 1, "H": 4096}, "silu_and_mul": {"T": 1, "I": 1407}}
#: each task's accepted kernels: the seed, then a retuned seed (another launch configuration)
RETUNE = {"rms_norm": ("num_warps=8", "num_warps=4"), "silu_and_mul": ("block = 1024", "block = 512")}
TASKS = ("rms_norm", "silu_and_mul", "fused_add_rms_norm")


def kernels(task: str) -> list[str]:
    seed = load_task(task).seed_source
    return [seed] + ([seed.replace(*RETUNE[task])] if task in RETUNE else [])


def interpreter_shapes(task: str, variant: int) -> tuple[ShapeResult, ...]:
    t = load_task(task)
    out = []
    for i, shape in enumerate(t.cpu_public_shapes + t.cpu_hidden_shapes):
        elems = 1
        for _, v in shape.params:
            elems *= v
        # the interpreter runs a program per row in numpy: milliseconds; each variant wins half the shapes
        time_ms = 1.5 + elems * 2e-4 * (1.0 + 0.3 * ((i + variant) % 2))
        out.append(ShapeResult(shape=shape.as_dict(), hidden=shape in t.cpu_hidden_shapes, dtype=t.dtype("cpu"),
                               timing="interpreter", time_us=time_ms * 1e3, spread_pct=4.0 + i,
                               max_abs_err=2.4e-7 * (i + 1), max_rel_err=1.1e-7 * (i + 1)))
    return tuple(out)


def gpu_shapes(task: str, variant: int) -> tuple[ShapeResult, ...]:
    t = load_task(task)
    out = []
    for i, shape in enumerate(t.public_shapes + t.hidden_shapes):
        line = runtime.roofline(t, shape, t.dtype("cuda"))
        floor = 1e6 * line.bytes / (BANDWIDTH * 1.2)
        time = 2.2 + 1e6 * line.bytes / BANDWIDTH / (0.85 if (i + variant) % 2 else 0.78)
        eager, compiled = 5.0 + 3.0 * time, 3.5 + 1.25 * time
        if shape.as_dict() == SLOW_GPU_SHAPE.get(task):
            time, eager, compiled = 9.0 + variant, 8.1, 6.0
        out.append(ShapeResult(
            shape=shape.as_dict(), hidden=shape in t.hidden_shapes, dtype=t.dtype("cuda"), timing="graph",
            time_us=time, spread_pct=0.8, eager_us=eager, compile_us=compiled, speedup_eager=eager / time,
            speedup_compile=compiled / time, gbps=line.bytes / time / 1e3, tflops=line.flops / time / 1e6,
            pct_bandwidth=100 * line.bytes / time / 1e3 / (BANDWIDTH / 1e9), pct_flops=0.1, floor_us=floor,
            max_abs_err=3.9e-3, max_rel_err=7.8e-3))
    return tuple(out)


def passed(task: str, variant: int, verdict) -> Audit | None:
    """Every GPU kernel's audit: judged again, 3% slower (within the audit's tolerance)."""
    return synthetic.audit(verdict, ratio=1.03)


def fill(path: Path, *, environments=(INTERPRETER, H200), tasks=TASKS, audit=passed) -> Path:
    """The archive described above; ``audit(task, variant, verdict)`` gives each accepted GPU
    kernel's audit (None: never audited)."""
    with Archive.create(path) as archive:
        run = archive.start_run({"model": "seed", "tasks": list(tasks)})
        attempts, seq, audits = [], 0, {}
        for name in tasks:
            task_id = archive.register_task(load_task(name))
            for env in environments:
                shapes = interpreter_shapes if env is INTERPRETER else gpu_shapes
                for variant, code in enumerate(kernels(name)):
                    verdict = Accepted(shapes=shapes(name, variant), environment=env)
                    attempts.append(NewAttempt(run_id=run, seq=seq, task_id=task_id, code=code, proposer="seed",
                                               verdict=verdict))
                    if env is not INTERPRETER and audit(name, variant, verdict) is not None:
                        audits[seq] = audit(name, variant, verdict)
                    seq += 1
                # wrong code, rejected: never exported
                broken = code.replace("mean_sq + eps", "mean_sq").replace("* up", "* gate")
                attempts.append(NewAttempt(run_id=run, seq=seq, task_id=task_id, code=broken, proposer="llm",
                                           verdict=Rejected(Status.INCORRECT, "max abs err 0.4 at index (3, 17)",
                                                            environment=env)))
                seq += 1
                # a later proposal of the same code: a reuse row, with no measurements of its own
                attempts.append(NewAttempt(run_id=run, seq=seq, task_id=task_id, code=code, proposer="llm",
                                           verdict=Accepted(shapes=(), environment=env)))
                seq += 1
        ids = archive.record_attempts(attempts)
        for i, a in audits.items():
            archive.record_audit(ids[i], a, run_id=run)
        archive.finish_run(run)
    return path


@pytest.fixture(scope="module")
def full_archive(tmp_path_factory) -> Path:
    return fill(tmp_path_factory.mktemp("archive") / "k.db")


def plan(db: Path, **options):
    with Archive.open(db, readonly=True) as archive:
        return plan_export(archive, ExportOptions(**options))


def by_op(p):
    return {op.op: op for op in p.ops}


def ids(db: Path) -> dict[tuple[str, str, int], int]:
    """(task, arch, variant) -> attempt id, in recording order."""
    with Archive.open(db, readonly=True) as archive:
        rows = archive.sql("SELECT a.id, t.name, a.gpu FROM attempts a JOIN tasks t ON t.id = a.task_id"
                           " WHERE a.accepted = 1 AND a.reuse_of IS NULL ORDER BY a.id")[1]
    out, seen = {}, {}
    for attempt, task, gpu in rows:
        arch = "interpreter" if gpu == "cpu" else "sm_90"
        variant = seen.setdefault((task, arch), 0)
        seen[(task, arch)] += 1
        out[(task, arch, variant)] = attempt
    return out


# ---- choosing entries ---------------------------------------------------------------------
def test_each_bucket_takes_the_fastest_accepted_kernel_of_its_group(full_archive):
    p = plan(full_archive, gpus=("H200",))
    attempt = ids(full_archive)
    ops = by_op(p)
    assert sorted(ops) == sorted(TASKS)
    for name, op in ops.items():
        assert [(g.arch, g.dtype, g.gpu) for g in op.groups] == [("sm_90", "bfloat16", "NVIDIA H200")]
        variants = len(kernels(name))
        (gpu,) = op.groups
        shapes = gpu_shapes(name, 0)
        assert len(gpu.buckets) == len(shapes)
        for bucket in gpu.buckets:
            i = next(k for k, s in enumerate(shapes) if s.shape == bucket.shape)
            if bucket.kernel is not None:
                # variant 1 is faster on even shape indices, variant 0 on odd ones
                assert bucket.kernel == f"a{attempt[(name, 'sm_90', (i + 1) % variants)]}", bucket.shape
                assert bucket.evidence["timing"] == "graph" and bucket.evidence["speedup_eager"] > 1
        assert gpu.fixed == {}  # every size varied across the verified shapes
        slow = [b.shape for b in gpu.buckets if b.kernel is None]
        assert slow == ([SLOW_GPU_SHAPE[name]] if name in SLOW_GPU_SHAPE else [])
        assert all("speedup vs eager" in b.reason for b in gpu.buckets if b.kernel is None)
        assert {b.kernel for b in gpu.buckets if b.kernel} == {f"a{attempt[(name, 'sm_90', v)]}" for v in range(variants)}
        assert set(op.kernels) == {b.kernel for g in op.groups for b in g.buckets if b.kernel}
        assert all(a.verdict.accepted and a.reuse_of is None for a in op.kernels.values())
    fused = ops["fused_add_rms_norm"].signature
    assert (fused.mutated, fused.n_outputs) == (("x", "residual"), 0)


def test_interpreter_verdicts_are_never_exported(full_archive, tmp_path):
    attempt = ids(full_archive)
    interpreted = {a for (_, arch, _), a in attempt.items() if arch == "interpreter"}
    default = plan(full_archive)
    assert {g.arch for op in default.ops for g in op.groups} == {"sm_90"}
    exported = {int(b.kernel[1:]) for op in default.ops for g in op.groups for b in g.buckets if b.kernel}
    measured = {b.evidence["attempt_id"] for op in default.ops for g in op.groups for b in g.buckets}
    assert exported and not (exported | measured) & interpreted
    cpu_only = fill(tmp_path / "cpu.db", environments=(INTERPRETER,))
    with pytest.raises(NothingToExport) as nothing:
        plan(cpu_only)
    for task in TASKS:
        assert f"{task}: no GPU-verified kernel; its {len(kernels(task))} accepted kernel(s) were verified under " \
               "the Triton interpreter only" in str(nothing.value)
    for pattern in ("cpu", "interpreter"):
        with pytest.raises(ExportError, match=f"--gpu {pattern}: kernels verified under the Triton interpreter are "
                                              "checked for correctness only"):
            ExportOptions(gpus=("H200", pattern))


def test_only_audited_kernels_are_exported_and_the_manifest_records_each_audit(tmp_path):
    def audit(task, variant, verdict):
        if task == "silu_and_mul":
            return None  # never audited (a run stopped before its audit, or an archive from before audits)
        if task == "rms_norm" and variant == 0:
            return synthetic.audit(verdict, ratio=1.5)  # its time did not hold: demoted
        return passed(task, variant, verdict)

    db = fill(tmp_path / "k.db", audit=audit)
    attempt = ids(db)
    p = plan(db, gpus=("H200",))
    ops = by_op(p)
    assert sorted(ops) == ["fused_add_rms_norm", "rms_norm"]
    demoted, kept = attempt[("rms_norm", "sm_90", 0)], attempt[("rms_norm", "sm_90", 1)]
    assert set(ops["rms_norm"].kernels) == {f"a{kept}"}  # every bucket the demoted kernel won went to the other
    assert all(b.evidence["attempt_id"] == kept for b in ops["rms_norm"].groups[0].buckets)
    notes = " ".join(p.notes)
    assert "rms_norm: 1 of 2 accepted GPU kernel(s) have no passing audit (1 failed their audit)" in notes
    assert "silu_and_mul: 2 of 2 accepted GPU kernel(s) have no passing audit (2 never audited)" in notes
    assert "kernforge archive audit --task silu_and_mul" in notes
    with Archive.open(db, readonly=True) as archive:
        assert {(b.task, b.attempt_id) for b in archive.best(gpu="H200")} == {
            ("rms_norm", kept), ("fused_add_rms_norm", attempt[("fused_add_rms_norm", "sm_90", 0)])}
        assert demoted not in {r.attempt_id for r in archive.best_per_shape(gpu="H200")}

    result = export.export(db, tmp_path / "pkg", ExportOptions(name="kf_audited", gpus=("H200",)))
    manifest = json.loads((result.out / "src" / "kf_audited" / "manifest.json").read_text())
    for op in manifest["ops"].values():
        for kernel in op["kernels"].values():
            assert kernel["audit"]["passed"] and kernel["audit"]["measured_us"] > kernel["audit"]["recorded_us"]
    entries = [e for e in manifest["entries"] if e["kernel"]]
    assert entries and all(e["audit"]["passed"] and "accepted again" in e["audit"]["reason"] for e in entries)
    assert {e["attempt_id"] for e in entries} >= {kept}
    with pytest.raises(NothingToExport, match="silu_and_mul: 2 of 2 accepted GPU kernel"):
        plan(db, tasks=("silu_and_mul",))


def test_min_speedup_and_baseline_decide_which_buckets_keep_the_reference(full_archive):
    for baseline, least in (("eager", 3.5), ("compile", 1.5)):
        for op in plan(full_archive, min_speedup=least, baseline=baseline).ops:
            kept = [b.kernel is None for b in op.groups[0].buckets]
            assert any(kept) and not all(kept)  # the threshold splits the shapes
            for b in op.groups[0].buckets:
                assert (b.kernel is None) == (b.evidence["speedup_" + baseline] < least)
    nothing = r"rms_norm sm_90/bfloat16: no kernel reaches 50x vs eager on any shape \(best \d"
    with pytest.raises(NothingToExport, match=nothing):
        plan(full_archive, min_speedup=50)


def test_tasks_selects_and_unknown_names_are_errors(full_archive):
    assert [op.op for op in plan(full_archive, tasks=("silu_and_mul",)).ops] == ["silu_and_mul"]
    with pytest.raises(ExportError, match="the archive has no task named 'softmax'"):
        plan(full_archive, tasks=("softmax",))
    with pytest.raises(ExportError, match="no such built-in task or path"):
        plan(full_archive, tasks=("no_such_task",))
    with pytest.raises(ExportError, match="Python identifier"):
        ExportOptions(name="my-kernels")
    with pytest.raises(ExportError, match="baseline"):
        ExportOptions(baseline="cudnn")


# ---- the dispatcher, on its own -------------------------------------------------------------
@pytest.fixture(scope="module")
def dispatch():
    """The template's _dispatch.py as a module (compiled by hand: no __pycache__ in the template)."""
    path = TEMPLATE / "package" / "_dispatch.py"
    module = types.ModuleType("_export_dispatch_under_test")
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def group(dispatch, fixed=None):
    buckets = [{"shape": {"T": t, "H": h}, "vector": [t, h, h], "kernel": k}
               for t, h, k in ((1, 4096, None), (32, 4096, "a1"), (4096, 4096, "a2"), (4096, 8192, "a3"))]
    return dispatch.Group({"arch": "sm_90", "inputs": [{"dtype": "bfloat16", "ndim": 2}, {"dtype": "bfloat16", "ndim": 1}],
                           "fixed": fixed or {}, "buckets": buckets})


@pytest.mark.parametrize("t, h, kernel", [
    (1, 4096, None), (3, 4096, None), (8, 4096, "a1"), (33, 4096, "a1"), (600, 4096, "a2"),
    (5000, 4096, "a2"), (5000, 7000, "a3"), (100000, 8192, "a3"), (1, 1000, None),
])
def test_nearest_bucket_in_log_space(dispatch, t, h, kernel):
    assert group(dispatch).nearest((t, h, h))["kernel"] == kernel


def test_inputs_and_fixed_axes_are_checked_before_the_bucket(dispatch):
    g = group(dispatch, fixed={"2": 4096})
    x, w = torch.empty(8, 4096, dtype=torch.bfloat16), torch.empty(4096, dtype=torch.bfloat16)
    cpu = torch.device("cpu")
    assert g.check([x, w], cpu, (8, 4096, 4096)) is None
    assert g.check([x, w.float()], cpu, (8, 4096, 4096)) == "inputs"
    assert g.check([x.t(), w], cpu, (4096, 8, 4096)) == "inputs"
    assert g.check([x[:, :2048], w[:2048]], cpu, (8, 2048, 2048)) == "inputs"  # a strided view
    x2, w2 = torch.empty(8, 2048, dtype=torch.bfloat16), torch.empty(2048, dtype=torch.bfloat16)
    assert g.check([x2, w2], cpu, (8, 2048, 2048)) == "size"


# ---- the command line -----------------------------------------------------------------------
runner = CliRunner()


def said(result) -> str:
    """The command's output with the console's line wrapping undone."""
    return " ".join(result.output.split())


def test_cli_says_clearly_when_the_archive_is_empty(tmp_path):
    Archive.create(tmp_path / "empty.db").close()
    result = runner.invoke(app, ["export", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path / "pkg")])
    assert result.exit_code == 1
    assert "nothing to export" in said(result) and "holds no tasks and no attempts" in said(result)
    assert not (tmp_path / "pkg").exists()


def test_cli_says_clearly_when_the_archive_holds_only_interpreter_verdicts(tmp_path):
    cpu_only = fill(tmp_path / "cpu.db", environments=(INTERPRETER,))
    result = runner.invoke(app, ["export", "--db", str(cpu_only), "--out", str(tmp_path / "pkg")])
    assert result.exit_code == 1 and isinstance(result.exception, (SystemExit, type(None)))  # a message, no crash
    text = said(result)
    assert "nothing to export" in text and "rms_norm: no GPU-verified kernel" in text and "Traceback" not in text
    assert "run `kernforge run` on a machine with a GPU" in " ".join(text.split())  # what to do about it
    asked = runner.invoke(app, ["export", "--db", str(cpu_only), "--out", str(tmp_path / "pkg"), "--gpu", "cpu"])
    assert asked.exit_code == 2 and "checked for correctness only" in said(asked) and "Traceback" not in said(asked)
    assert not (tmp_path / "pkg").exists()


def test_cli_says_clearly_when_nothing_reaches_min_speedup(full_archive, tmp_path):
    result = runner.invoke(app, ["export", "--db", str(full_archive), "--out", str(tmp_path / "pkg"),
                                 "--min-speedup", "50"])
    assert result.exit_code == 1
    text = said(result)
    for task in TASKS:
        assert f"{task} sm_90/bfloat16: no kernel reaches 50x vs eager on any shape" in text
    assert not (tmp_path / "pkg").exists()


def test_cli_errors_for_a_missing_archive_and_an_occupied_folder(full_archive, tmp_path):
    result = runner.invoke(app, ["export", "--db", str(tmp_path / "nope.db"), "--out", str(tmp_path / "pkg")])
    assert result.exit_code == 2 and "no archive at" in said(result)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["export", "--db", str(full_archive), "--out", str(tmp_path / "busy"), *extra])
        assert result.exit_code == 2
        assert ("pass --force" in said(result)) if not extra else ("is not an earlier export" in said(result))
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


# ---- the whole flow -------------------------------------------------------------------------
def test_export_builds_installs_and_passes_its_own_tests(full_archive, tmp_path):
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", "--db", str(full_archive), "--out", str(out), "--name", "kf_test_kernels",
                                 "--gpu", "H200"])
    assert result.exit_code == 0, result.output
    assert "rms_norm" in said(result) and "reference kept in 1" in said(result)
    pkg = out / "src" / "kf_test_kernels"
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert {e["arch"] for e in manifest["entries"]} == {"sm_90"}  # never an interpreter verdict
    entry = next(e for e in manifest["entries"] if e["op"] == "rms_norm")
    assert {"attempt_id", "code_hash", "shape_range", "buckets", "environment"} <= set(entry)
    evidence = entry["buckets"][0]["evidence"]
    assert {"time_us", "speedup_eager", "speedup_compile", "pct_roofline", "max_abs_err"} <= set(evidence)
    attempt = entry["attempt_id"]
    with Archive.open(full_archive, readonly=True) as archive:
        code = archive.get_attempt(attempt).code
    assert (pkg / "tasks" / "rms_norm" / "kernels" / f"a{attempt}.py").read_text() == code  # verbatim
    readme = (out / "README.md").read_text()
    assert "### rms_norm" in readme and "### silu_and_mul" in readme and "| x eager |" in readme

    # an earlier export is replaced only with --force
    again = runner.invoke(app, ["export", "--db", str(full_archive), "--out", str(out), "--name", "kf_test_kernels",
                                "--force"])
    assert again.exit_code == 0, again.output

    checked = check_package(out, tmp_path / "check", confine=confine_command)  # as `export --check` runs it
    assert checked.wheel.parent == out / "dist" and checked.wheel.name.startswith("kf_test_kernels-")
    # the installed copy ran, not the export's source folder
    assert f"package at {checked.venv}" in checked.output

    cases = {c.get("name"): ("skipped" if c.find("skipped") is not None else "passed")
             for c in ET.parse(checked.report).getroot().iter("testcase")}
    # every entry is GPU-verified: it runs on the GPU it was verified for, and is skipped on a CPU
    on_gpu = torch.cuda.is_available()
    entries = [n for n in cases if n.startswith("test_entry")]
    buckets = sum(len(g["buckets"]) for op in manifest["ops"].values() for g in op["groups"])
    assert len(entries) == buckets and all("-sm_90-" in n for n in entries)
    assert {cases[n] for n in entries} == {"passed" if on_gpu else "skipped"}
    per_op = ["test_opcheck", "test_torch_compile_fullgraph", "test_fallback_on_a_device_without_kernels"]
    if on_gpu:
        per_op += ["test_a_size_between_buckets_runs_the_nearest_bucket", "test_fallback_for_a_dtype_without_kernels",
                   "test_fallback_for_non_contiguous_inputs", "test_cuda_graph_capture_and_replay"]
    for test in per_op:
        passed = [n for n, s in cases.items() if n.startswith(test) and s == "passed"]
        assert len(passed) == len(manifest["ops"]), (test, cases)


def test_a_check_says_where_the_package_was_tested(tmp_path, monkeypatch):
    """Without a GPU `export --check` still runs (the README's command): it says the package's
    tests ran on the CPU, where only the fallbacks, opcheck and torch.compile are exercised."""
    made = export_check.CheckResult(wheel=tmp_path / "k-1.0-py3-none-any.whl", venv=tmp_path, report=tmp_path / "r.xml",
                                    output="10 passed, 40 skipped in 8.6s\n")
    monkeypatch.setattr(export_check, "check_package", lambda out, work, timeout_s, confine: made)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said_ = export_check.check(tmp_path / "out", confine=confine_command)
    assert "on the CPU (no GPU here" in said_ and "10 passed, 40 skipped" in said_


def test_a_check_step_past_its_timeout_is_a_clean_failure_and_leaves_no_folder(tmp_path, monkeypatch):
    """A hung step (here: a sleep standing in for the build) is killed and reported like any
    failed step, and the half-made temporary folder goes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def hung_build(out: Path, work: Path, *, timeout_s: float, confine):
        assert work.parent == tmp_path
        export_check._run("building the wheel", [sys.executable, "-c", "import time; time.sleep(60)"],
                          timeout_s=timeout_s)

    monkeypatch.setattr(export_check, "check_package", hung_build)
    with pytest.raises(PackageCheckFailed, match="building the wheel timed out after 0.1s"):
        export_check.check(tmp_path / "out", timeout_s=0.1, confine=confine_command)
    assert list(tmp_path.glob("kernforge-export-check-*")) == []


def test_the_readme_marks_a_bound_time_and_its_speedups():
    """A bucket whose time of record is the guard's bound (a launch-bound size) reads as one in
    the package's README: its time at most, its speedups at least."""
    from kernforge.archive.export_readme import _table
    from kernforge.verifier.verdict import BOUNDED

    def entry(method):
        evidence = {"attempt_id": 7, "time_us": 2.81, "speedup_eager": 4.2, "speedup_compile": 0.61, "pct_roofline": 1.0,
                    "max_abs_err": 0.01, "method": method}
        return {"arch": "sm_90", "gpu": "NVIDIA H100", "dtype": "bfloat16", "kernel": "a7", "attempt_id": 7,
                "buckets": [{"shape": {"T": 1, "H": 4096}, "evidence": evidence}]}

    bound, measured = (_table("rms_norm", {"_entries": [entry(m)]})[-1] for m in (BOUNDED, "difference"))
    assert "| <= 2.81 | >= 4.20 | >= 0.61 |" in bound
    assert "| 2.81 | 4.20 | 0.61 |" in measured and "<=" not in measured
