"""The library baseline (verifier/library.py): a task names a production kernel library's op in its
meta.py; the reference worker times it beside eager and torch.compile where it is installed, and
the judge reports ``library_us`` with the library's name and version. The plumbing is tested with
a test task that names a fake library function (under the ``torch`` distribution, which is
installed) and a stand-in timer that counts calls, not the numbers. Where Liger-Kernel is
installed, the built-in tasks' wrappers are checked against their references (on the CPU under
the Triton interpreter)."""

from __future__ import annotations

import importlib.metadata
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kernforge.archive import synthetic
from kernforge.archive.export_readme import _library_x
from kernforge.archive.records import NewAttempt, TaskRecord
from kernforge.archive.score import library_summary
from kernforge.archive.store import Archive
from kernforge.cli import app
from kernforge.tasks import runtime
from kernforge.tasks.errors import TaskError
from kernforge.tasks.loader import builtin_names, load_task
from kernforge.verifier import library
from kernforge.verifier.compare import compare
from kernforge.verifier.gate import DeviceGate
from kernforge.verifier.judge import Judge, JudgeOptions
from kernforge.verifier.verdict import Accepted, ShapeResult

TASKS = Path(__file__).resolve().parent / "tasks"
cli = CliRunner()

FAKE_LIBRARY = '''

LIBRARY_BASELINE = {"package": "PACKAGE", "call": "fast_norm"}
calls = []


def fast_norm(x, weight):
    calls.append(x.shape)
    return x * weight
'''


def task_with_library(tmp_path: Path, package: str = "torch", extra: str = FAKE_LIBRARY):
    folder = tmp_path / "normed"
    folder.mkdir()
    (folder / "reference.py").write_text((TASKS / "tiny_norm" / "reference.py").read_text())
    (folder / "meta.py").write_text((TASKS / "tiny_norm" / "meta.py").read_text() + extra.replace("PACKAGE", package))
    return load_task(str(folder))


def test_a_task_names_its_library_in_its_metadata(tmp_path):
    task = task_with_library(tmp_path)
    assert task.library is not None and (task.library.package, task.library.call) == ("torch", "fast_norm")
    assert load_task(str(TASKS / "tiny_norm")).library is None


@pytest.mark.parametrize("entry, words", [
    ('LIBRARY_BASELINE = "liger-kernel"', "must be {'package'"),
    ('LIBRARY_BASELINE = {"package": "liger-kernel"}', "must be {'package'"),
    ('LIBRARY_BASELINE = {"package": "liger-kernel", "call": "nowhere"}', "names 'nowhere', which is not a function"),
])
def test_a_malformed_library_entry_is_a_clear_error(tmp_path, entry, words):
    with pytest.raises(TaskError, match=words.replace("{", r"\{").replace("(", r"\(")):
        task_with_library(tmp_path, extra="\n" + entry + "\n")


def _timer(calls: list):
    """A stand-in for timing.time_batch: calls ``fn`` once on real inputs, reports a fixed median."""
    def time_fn(fn):
        calls.append(fn)
        task_inputs = [x for x in runtime.make_inputs(TIMED_TASK[0], TIMED_TASK[0].public_shapes[0], "normal", 0, "cpu")]
        fn(*task_inputs)
        return {"median_us": 12.5, "spread_pct": 0.4}
    return time_fn


TIMED_TASK: list = []


def test_an_installed_library_is_timed_and_named_with_its_version(tmp_path):
    task = task_with_library(tmp_path)
    TIMED_TASK[:] = [task]
    calls: list = []
    entry = library.measure(task, _timer(calls))
    assert len(calls) == 1 and runtime.meta_module(task).calls == [(4, 64)]
    assert entry == {"library": "torch", "version": importlib.metadata.version("torch"), "median_us": 12.5,
                     "spread_pct": 0.4}
    assert library.library_baseline(entry) == {"library": f"torch {importlib.metadata.version('torch')}",
                                               "library_us": 12.5, "library_spread_pct": 0.4}


def test_a_library_not_installed_is_said_and_never_called(tmp_path):
    task = task_with_library(tmp_path, package="kernforge-no-such-library")
    calls: list = []
    entry = library.measure(task, _timer(calls))
    assert calls == [] and entry == {"library": "kernforge-no-such-library",
                                     "missing": "kernforge-no-such-library is not installed"}
    assert library.library_baseline(entry) == {"library": "kernforge-no-such-library",
                                               "library_note": "kernforge-no-such-library is not installed"}


def test_a_task_no_library_covers_has_no_entry():
    assert library.measure(load_task(str(TASKS / "tiny_norm")), _timer([])) is None
    assert library.library_baseline(None) == {}


def test_a_library_that_fails_is_reported_not_fatal(tmp_path):
    task = task_with_library(tmp_path)

    def broken(fn):
        raise RuntimeError("no kernel for this GPU")

    entry = library.measure(task, broken)
    label = f"torch {importlib.metadata.version('torch')}"
    assert entry["error"] == f"{label}: RuntimeError: no kernel for this GPU" and entry["version"]
    assert library.library_baseline(entry)["library_note"] == f"{label}: RuntimeError: no kernel for this GPU"


def test_the_judge_reads_the_library_entry_of_a_baseline(tmp_path):
    """Judge._baseline: the reference worker's reply becomes ``library_us`` and ``library``."""
    task = task_with_library(tmp_path)
    judge = object.__new__(Judge)

    class Cache:
        def get(self, key):
            return None

        def put(self, key, value):
            self.value = value

    judge.baseline_cache = Cache()
    judge.options = JudgeOptions()
    judge._env = {"gpu": "NVIDIA H200"}
    judge.gate, judge._phases = DeviceGate(1), {}
    reply = {"eager": {"median_us": 30.0, "mode": "graph"}, "compile": {"median_us": 20.0},
             "library": {"library": "liger-kernel", "version": "0.8.5", "median_us": 10.0, "spread_pct": 0.2}}
    judge._ask_ref = lambda reply_type, msg, **kw: reply
    out = judge._baseline(task, task.public_shapes[0], 8, "normal", 1)
    assert (out["library"], out["library_us"], out["compile_us"]) == ("liger-kernel 0.8.5", 10.0, 20.0)
    reply["library"] = {"library": "liger-kernel", "missing": "liger-kernel is not installed"}
    out = judge._baseline(task, task.public_shapes[1], 8, "normal", 1)
    assert "library_us" not in out and out["library_note"] == "liger-kernel is not installed"


# ---- several libraries, and the output each must agree on --------------------------------------
TWO_LIBRARIES = '''

LIBRARY_BASELINE = [{"package": "kernforge-no-such-library", "call": "preferred_norm"},
                    {"package": "PACKAGE", "call": "fast_norm"}]
calls = []


def preferred_norm(x, weight):
    raise AssertionError("never called: not installed")


def fast_norm(x, weight):
    calls.append(x.shape)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * weight.float()).to(x.dtype)
'''


def test_a_list_of_libraries_loads_in_the_order_preferred(tmp_path):
    task = task_with_library(tmp_path, extra=TWO_LIBRARIES)
    assert [(lib.package, lib.call) for lib in task.libraries] == [("kernforge-no-such-library", "preferred_norm"),
                                                                   ("torch", "fast_norm")]
    assert task.library == task.libraries[0]
    assert library.resolve(task).package == "torch", "the first one installed"


@pytest.mark.parametrize("entry, words", [
    ('LIBRARY_BASELINE = [{"package": "a", "call": "nowhere"}]', "names 'nowhere', which is not a function"),
    ('LIBRARY_BASELINE = [{"package": "a", "call": "make_inputs"}, "b"]', "or a list of them, got 'b'"),
    ('LIBRARY_BASELINE = [{"package": "a", "call": "make_inputs"}, {"package": "a", "call": "make_inputs"}]',
     "names a package twice"),
])
def test_a_malformed_library_list_is_a_clear_error(tmp_path, entry, words):
    with pytest.raises(TaskError, match=words.replace("[", r"\[").replace("(", r"\(")):
        task_with_library(tmp_path, extra="\n" + entry + "\n")


def test_the_first_installed_library_is_timed_and_those_before_it_are_named(tmp_path):
    task = task_with_library(tmp_path, extra=TWO_LIBRARIES)
    TIMED_TASK[:] = [task]
    calls: list = []
    entry = library.measure(task, _timer(calls), {"torch": None})
    assert len(calls) == 1 and entry["library"] == "torch" and entry["median_us"] == 12.5
    assert "passed_over" not in entry, "one not installed is no news: the label says which was timed"
    read = library.library_baseline(entry)
    assert read["library_us"] == 12.5 and read["library"] == f"torch {importlib.metadata.version('torch')}"
    assert "library_passed_over" not in read and library.library_flags(read) == []


def _norm_inputs(task):
    return runtime.make_inputs(task, task.cpu_public_shapes[-1], "normal", 3, "cpu")


def _model(task, shape):
    return runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 0, "cpu")


def test_a_library_that_computes_the_op_agrees_and_one_that_computes_another_does_not(tmp_path):
    task = task_with_library(tmp_path, extra=TWO_LIBRARIES)
    meta, shape = runtime.meta_module(task), task.cpu_public_shapes[-1]
    inputs = _norm_inputs(task)
    before = [x.clone() for x in inputs]
    assert library.agreement(task, meta.fast_norm, _model(task, shape), inputs) is None
    assert all(torch.equal(a, b) for a, b in zip(inputs, before)), "the inputs are left as they were"
    # the weight applied after rounding to the input's dtype would pass in float32; this is another op
    twice = library.agreement(task, lambda x, w: meta.fast_norm(x, w) * 2, _model(task, shape), inputs)
    assert twice.startswith("its output 0 differs from the reference: ") and "tolerance" in twice, twice
    assert "gives 2 outputs where the reference gives 1" in library.agreement(
        task, lambda x, w: (x, w), _model(task, shape), inputs)
    assert "its output 0 is (" in library.agreement(task, lambda x, w: x[:1], _model(task, shape), inputs)
    assert library.agreement(task, lambda x, w: 1 / 0, _model(task, shape), inputs).startswith("ZeroDivisionError")


def test_each_installed_library_is_checked_by_its_package(tmp_path):
    extra = TWO_LIBRARIES.replace('"kernforge-no-such-library", "call": "preferred_norm"', '"pytest", "call": "preferred_norm"', 1)
    task = task_with_library(tmp_path, extra=extra)
    shape = task.cpu_public_shapes[-1]
    found = library.disagreements(task, _model(task, shape), _norm_inputs(task))
    assert found == {"pytest": "AssertionError: never called: not installed", "torch": None}
    (tmp_path / "other").mkdir()
    one_installed = task_with_library(tmp_path / "other", extra=TWO_LIBRARIES)
    assert library.disagreements(one_installed, _model(task, shape), _norm_inputs(task)) == {"torch": None}, \
        "one not installed is not checked"


def test_a_library_that_disagrees_is_passed_over_and_never_timed(tmp_path):
    task = task_with_library(tmp_path, extra=TWO_LIBRARIES)
    calls: list = []
    entry = library.measure(task, _timer(calls), {"torch": "its output 0 differs from the reference: 300 of 512 elements"})
    assert calls == [], "a library computing another op is not timed"
    assert entry["library"] == "torch" and entry["version"]
    assert entry["error"] == ("torch " + importlib.metadata.version("torch")
                              + ": its output 0 differs from the reference: 300 of 512 elements")
    assert "differs from the reference" in library.library_baseline(entry)["library_note"]


def test_a_library_that_fails_lets_the_next_one_be_timed(tmp_path):
    extra = TWO_LIBRARIES.replace('"kernforge-no-such-library", "call": "preferred_norm"', '"torch", "call": "preferred_norm"', 1)
    extra = extra.replace('{"package": "PACKAGE", "call": "fast_norm"}', '{"package": "pytest", "call": "fast_norm"}')
    task = task_with_library(tmp_path, extra=extra)
    TIMED_TASK[:] = [task]
    tried: list = []

    def time_fn(fn):
        tried.append(fn.__name__)
        return _timer([])(fn)

    entry = library.measure(task, time_fn, {"torch": None, "pytest": None})
    assert tried == ["preferred_norm", "fast_norm"] and entry["library"] == "pytest"
    assert entry["passed_over"] == [f"torch {importlib.metadata.version('torch')}: AssertionError: never called: not installed"]


def test_a_library_writing_the_inputs_in_place_or_returning_them_agrees_with_an_in_place_reference():
    """fused_add_rms_norm's reference writes x and the residual and returns None: a library may do
    the same (FlashInfer's), or hand back the two tensors (Liger's); one that leaves x unwritten
    has not done the op."""
    task = load_task("fused_add_rms_norm")
    shape = task.cpu_public_shapes[-1]
    model = _model(task, shape)
    inputs = runtime.make_inputs(task, shape, "normal", 5, "cpu")

    def results(x, residual, w):
        total = (x.float() + residual.float()).to(residual.dtype)
        z = total.float()
        return (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype), total

    def in_place(x, residual, w):
        y, total = results(x, residual, w)
        x.copy_(y)
        residual.copy_(total)

    assert library.agreement(task, in_place, model, inputs) is None
    assert library.agreement(task, results, model, inputs) is None

    def residual_only(x, residual, w):
        residual.copy_(results(x, residual, w)[1])

    assert library.agreement(task, residual_only, model, inputs).startswith("its output 0 differs from the reference")


def test_a_librarys_outputs_are_collected_as_a_candidates_unless_it_hands_back_the_written_ones():
    a, b, y = torch.zeros(2), torch.ones(2), torch.full((2,), 3.0)
    # returns one output and writes input 1 in place, as a reference returning y and writing b would
    assert [t is u for t, u in zip(library.outputs_of(y, [a, b], (1,), 2), [y, b])] == [True, True]
    # hands back new tensors for the two inputs the task writes (Liger's fused add-RMSNorm)
    assert library.outputs_of((y, a), [a, b], (0, 1), 2)[0] is y
    # writes them and returns nothing (FlashInfer's, vLLM's)
    assert library.outputs_of(None, [a, b], (0, 1), 2) == [a, b]
    # neither way gives what the reference gives: the count is what agreement then reports
    assert len(library.outputs_of((y, y, y), [a, b], (0, 1), 2)) == 5


def test_a_verdict_says_which_library_was_timed_and_why_installed_ones_before_it_were_not(tmp_path):
    extra = TWO_LIBRARIES.replace('"kernforge-no-such-library", "call": "preferred_norm"', '"pytest", "call": "preferred_norm"', 1)
    task = task_with_library(tmp_path, extra=extra)
    TIMED_TASK[:] = [task]
    pytest_label = f"pytest {importlib.metadata.version('pytest')}"
    timed = library.library_baseline(library.measure(task, _timer([]), {"pytest": "its output 0 differs", "torch": None}))
    assert library.library_flags(timed) == [f"library baseline torch {importlib.metadata.version('torch')}; "
                                            f"passed over: {pytest_label}: its output 0 differs"]
    none = library.library_baseline(library.measure(task, _timer([]), {"pytest": "its output 0 differs", "torch": "so does 1"}))
    assert library.library_flags(none) == [f"library baseline unavailable: {pytest_label}: its output 0 differs; "
                                           f"torch {importlib.metadata.version('torch')}: so does 1"]
    (tmp_path / "one").mkdir()
    assert library.library_flags(library.library_baseline(library.measure(task_with_library(tmp_path / "one"), _timer([])))) == []


def test_tasks_show_names_the_libraries_in_the_order_tried_and_which_are_installed(tmp_path):
    task = task_with_library(tmp_path, extra=TWO_LIBRARIES)
    result = cli.invoke(app, ["tasks", "show", str(task.reference_path.parent), "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 0, result.output
    assert ("Library baselines, in the order tried (the first installed one whose output agrees with the reference is "
            f"timed): kernforge-no-such-library (not installed), torch {importlib.metadata.version('torch')}.") \
        in " ".join(result.output.split())
    assert "Library baseline" not in result.output.split("## Roofline")[0], "the model's part never names them"
    shown = cli.invoke(app, ["tasks", "show", str(task.reference_path.parent), "--json", "--db", str(tmp_path / "none.db")])
    assert json.loads(shown.output)["libraries"][0] == {"package": "kernforge-no-such-library", "call": "preferred_norm",
                                                        "installed": None}
    plain = cli.invoke(app, ["tasks", "show", str(TASKS / "tiny_norm"), "--db", str(tmp_path / "none.db")])
    assert "Library baseline: none covers this task." in plain.output


#: the built-in tasks Liger-Kernel covers -> the wrapper in their meta.py (fused_moe's meta.py says
#: why Liger's fused MoE is not timed; no Liger op computes the others)
LIGER = {"rms_norm": "liger_rms_norm", "fused_add_rms_norm": "liger_fused_add_rms_norm",
         "silu_and_mul": "liger_silu_and_mul", "softmax": "liger_softmax", "rotary_embedding": "liger_rotary_embedding"}


@pytest.mark.parametrize("name, call", LIGER.items())
def test_the_builtin_tasks_liger_covers_name_it(name, call):
    assert ("liger-kernel", call) in [(spec.package, spec.call) for spec in load_task(name).libraries]


def test_liger_names_resolve_where_it_is_installed():
    pytest.importorskip("liger_kernel")
    for name in LIGER:
        lib = library.resolve(load_task(name))
        assert lib.fn is not None and lib.version and lib.missing is None


def _reference(task, shape, inputs, device):
    """The reference's outputs on copies of ``inputs`` (a library may write its inputs in place)."""
    model = runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 0, device)
    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    return runtime.collect_outputs(model(*copies), copies, task.mutated_inputs)


# On the CPU Liger's kernels run under the Triton interpreter (conftest), which has no bf16
# arithmetic: bf16 inputs there check the wrappers' loads and stores and that they compute in
# float32 (a bf16 computation comes out as NaN), not bf16 rounding.
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name, shape", [(name, shape) for name in ("softmax", "rotary_embedding")
                                         for shape in load_task(name).cpu_public_shapes + load_task(name).cpu_hidden_shapes],
                         ids=str)
def test_the_liger_wrapper_equals_the_reference(name, shape, dtype, device):
    pytest.importorskip("liger_kernel")
    task = load_task(name)
    wrapper = library.resolve(task).fn
    for dist in task.distributions:
        generator = torch.Generator(device=device).manual_seed(1)
        inputs = runtime.meta_module(task).make_inputs(shape.as_dict(), dist, getattr(torch, dtype), device, generator)
        want = _reference(task, shape, inputs, device)
        got = wrapper(*inputs)
        got = list(got) if isinstance(got, tuple) else [got]
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype, f"{dist} output {i}: {g.dtype}, the reference's {w.dtype}"
            found = compare(g, w, task.tolerance(str(w.dtype).removeprefix("torch.")))
            assert found.ok, f"{dist} output {i}: {found.describe()}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in builtin_names() if load_task(n).libraries])
def test_each_installed_library_agrees_with_the_reference_at_the_public_gpu_shapes(name):
    """What the reference worker checks before it times a library (library.agreement), at every
    public GPU shape in the GPU dtype: an installed library that disagrees would lose its figure.
    Softmax's Liger kernel refuses rows over 65536 (a reason, not a disagreement)."""
    task = load_task(name)
    if not [lib for lib in library.resolve_all(task) if lib.fn is not None]:
        pytest.skip(f"none of {[lib.package for lib in task.libraries]} is installed")
    for shape in task.public_shapes:
        inputs = runtime.make_inputs(task, shape, task.distributions[0], 7, "cuda")
        model = runtime.build_model(runtime.reference_module(task).Model, runtime.make_init_inputs(task, shape), 0, "cuda")
        found = library.disagreements(task, model, inputs)
        for package, why in found.items():
            assert why is None or (name == "softmax" and "65536" in why), f"{name} {shape.label}: {package}: {why}"


def test_liger_softmax_refuses_rows_over_65536():
    """Why softmax's library time is missing at V = 128256 and wider: the judge's note says this."""
    pytest.importorskip("liger_kernel")
    with pytest.raises(RuntimeError, match="exceeds the recommended Triton blocksize = 65536"):
        library.resolve(load_task("softmax")).fn(torch.zeros(1, 65537))


# ---- shown where measured ----------------------------------------------------------------------
def shapes(library_us: float | None):
    return tuple(ShapeResult({"T": t, "H": 4096}, False, "bfloat16", "graph", time_us=time_us, eager_us=3 * time_us,
                             compile_us=2 * time_us, floor_us=time_us / 2, library_us=library_us and library_us * time_us,
                             library="liger-kernel 0.8.5" if library_us else None)
                 for t, time_us in ((64, 2.0), (16384, 120.0)))


def test_archive_best_says_which_library_each_task_was_timed_against_when_they_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    db = tmp_path / "k.db"
    with Archive.create(db) as archive:
        run = archive.start_run({})
        for seq, (name, lib) in enumerate((("rms_norm", "vllm 0.11.0"), ("softmax", "liger-kernel 0.8.5"))):
            task_id = archive.register_task(TaskRecord.from_task(load_task(name)))
            timed = tuple(replace(s, library=lib) for s in shapes(1.5))
            verdict = Accepted(shapes=timed, environment=dict(synthetic.H200))
            attempt = archive.record_attempt(NewAttempt(run_id=run, seq=seq, task_id=task_id, code="# k\n", verdict=verdict,
                                                        environment=dict(synthetic.H200)))
            archive.record_audit(attempt, synthetic.audit(verdict), run_id=run)
        archive.finish_run(run)
    result = cli.invoke(app, ["archive", "best", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "x library: softmax over liger-kernel 0.8.5; rms_norm over vllm 0.11.0" in " ".join(result.output.split())


def test_the_library_speedup_is_a_geometric_mean_where_measured():
    x, name = library_summary(shapes(1.5))
    assert x == pytest.approx(1.5) and name == "liger-kernel 0.8.5"
    assert library_summary(shapes(None)) == (None, None)
    interpreter = [ShapeResult({"T": 1}, False, "float32", "interpreter", time_us=1.0, library_us=5.0)]
    assert library_summary(interpreter) == (None, None)  # never from interpreter times
    hidden = ShapeResult({"T": 3, "H": 4096}, True, "bfloat16", "graph", time_us=1.0, library_us=10.0, library="liger-kernel 0.8.5")
    assert library_summary((*shapes(1.5), hidden))[0] == pytest.approx(1.5), "over the score's shapes: public ones"


@pytest.mark.parametrize("library_x", [1.5, None])
def test_archive_best_shows_x_library_only_where_measured(tmp_path, monkeypatch, library_x):
    monkeypatch.setenv("COLUMNS", "250")
    verdict = Accepted(shapes=shapes(library_x), environment=dict(synthetic.H200))
    db = tmp_path / "k.db"
    with Archive.create(db) as archive:
        task_id = archive.register_task(TaskRecord.from_task(load_task("rms_norm")))
        run = archive.start_run({})
        attempt = archive.record_attempt(NewAttempt(run_id=run, seq=0, task_id=task_id, code="# k\n", verdict=verdict,
                                                    environment=dict(synthetic.H200)))
        archive.record_audit(attempt, synthetic.audit(verdict), run_id=run)
        archive.finish_run(run)
    result = cli.invoke(app, ["archive", "best", "--db", str(db)])
    assert result.exit_code == 0 and "x library" in result.output, result.output
    row = next(line for line in result.output.splitlines() if "rms_norm" in line)
    if library_x:
        assert "1.50x" in row and "x library: over liger-kernel 0.8.5" in result.output
    else:
        assert "1.50x" not in row and "x library: over" not in result.output
    best = json.loads(cli.invoke(app, ["archive", "best", "--db", str(db), "--json"]).output)["best"][0]
    assert best["shapes"][1]["library_us"] == (180.0 if library_x else None)


def test_the_live_display_and_the_export_readme_show_x_library():
    from kernforge.loop.display import RunView, TaskStats, progress_table
    from rich.console import Console

    stats = TaskStats("rms_norm", best_time_us=10.0, best_speedup_library=1.25)
    view = RunView(run_id=1, proposer="offline", devices=("cuda:0",), elapsed_s=1.0, busy=0.5, tokens=0, cost=0.0,
                   stopping=None, tasks=(stats,))
    out = io.StringIO()
    Console(file=out, width=250).print(progress_table(view))
    assert "x library" in out.getvalue() and "1.25x" in out.getvalue()
    assert _library_x({"speedup_library": 1.25, "library": "liger-kernel 0.8.5"}) == "1.25 (liger-kernel 0.8.5)"
    assert _library_x({"speedup_library": None}) == "-"


def test_the_library_is_called_once_where_torch_compile_is_compiled_never_first_in_its_timing(tmp_path, monkeypatch):
    """The reference worker's compile step (asked for before the baseline takes the GPU alone,
    and made by the compile-ahead processes) calls the library once on the shape's inputs, so its
    Triton kernels compile there; a library that fails there is left for the timing to report."""
    from kernforge.tasks.spec import Shape
    from kernforge.verifier import refworker

    task = task_with_library(tmp_path)
    shape = {"T": 4, "H": 64}
    msg = {"task_ref": task.ref, "shape": shape, "dist": "normal", "seeds": [3], "init_seed": 5}
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # Inductor's part is tested elsewhere
    model = refworker._model(task.ref, Shape.of(shape), 5, "cpu")
    compiled = refworker._compiled(msg, model, "cpu")
    assert compiled.error is None and runtime.meta_module(task).calls == [(4, 64)]
    runtime.meta_module(task).fast_norm = lambda x, weight: 1 / 0
    assert refworker._compiled(msg, model, "cpu").error is None
