"""`kernforge run` end to end on the CPU (Triton interpreter): against a scripted OpenAI-compatible
server through the real ``openai`` client, with no API key (the offline tuner), and killed with
SIGKILL then resumed. Each test judges only a handful of candidates: the interpreter is slow.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kernforge.cli import app
from kernforge.loop.config import KEY_ENV_VARS

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from candidates import HONEST  # noqa: E402
from config_env import clean_config  # noqa: E402
from fake_llm import (  # noqa: E402
    BROKEN_KERNEL, CHEATING_KERNEL, GOOD_KERNEL, FakeLLM, error, fake_llm, fenced, reply, slow,
)

TASKS = Path(__file__).resolve().parent / "tasks"
KEY = "sk-loop-test-5f1e9a77c3"
__all__ = ["fake_llm"]
cli = CliRunner()

#: The good kernel with a comment: the same normalised code, so its verdict is reused.
GOOD_COMMENTED = GOOD_KERNEL.replace("class ModelNew(nn.Module):", "# one program per row\nclass ModelNew(nn.Module):")
#: Imports a module that does not exist: the verifier's compile error.
MISSING_IMPORT = GOOD_KERNEL.replace("import triton.language as tl", "import triton.language as tl\nimport no_such_module_here")


pytestmark = pytest.mark.usefixtures("clean_config_env")


def attempts(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM attempts ORDER BY run_id, seq")]
    conn.close()
    return rows


def recorded(db: Path) -> int:
    """Attempts in an archive another process is writing (0 while it is being created)."""
    if not db.exists():
        return 0
    try:
        return len(attempts(db))
    except sqlite3.OperationalError:  # the schema is not committed yet
        return 0


def seeded_task(tmp_path: Path) -> Path:
    """tiny_norm with a seed kernel (the honest one): something for the offline tuner to tune."""
    folder = tmp_path / "tiny_seeded"
    folder.mkdir()
    for name in ("reference.py", "meta.py"):
        (folder / name).write_text((TASKS / "tiny_norm" / name).read_text())
    (folder / "seed.py").write_text(HONEST)
    return folder


@pytest.fixture(scope="module")
def scripted_llm_run(tmp_path_factory):
    """One `kernforge run` of 7 attempts against a scripted LLM: (its result, the server, its folder).
    Two tests read it: what it archived and asked for, and the code to beat its requests held (a
    run starts its judge, its workers and a capture of Inductor's code: made once, not twice)."""
    tmp_path = tmp_path_factory.mktemp("scripted")
    with pytest.MonkeyPatch.context() as monkeypatch, FakeLLM() as fake_llm:
        clean_config(monkeypatch, tmp_path)
        (tmp_path / "config" / "kernforge").mkdir(parents=True)
        (tmp_path / "config" / "kernforge" / "config.toml").write_text(
            "[llm]\nconcurrency = 1\nrequest_timeout_s = 3\nmax_retries = 3\nbackoff_base_s = 0.01\n")
        monkeypatch.setenv("KERNFORGE_API_KEY", KEY)
        thinking = "<think>Plan: one program per row, fp32 sums.\n" + fenced(CHEATING_KERNEL) + "\nNo: that calls torch.</think>\n"
        fake_llm.script = [
            reply(fenced(GOOD_KERNEL), prompt_tokens=1000, completion_tokens=500),
            reply(fenced(BROKEN_KERNEL)),
            reply(fenced(CHEATING_KERNEL)),
            reply(thinking + fenced(GOOD_COMMENTED)),
            reply("```python\n" + GOOD_KERNEL[:400], finish_reason="length"),
            error(429, retry_after=0), reply(fenced(MISSING_IMPORT)),
            slow(30), reply("I would use a persistent grid here.\n```python\nBLOCK = 1024\n```"),
        ]
        result = cli.invoke(app, ["run", "--task", str(TASKS / "tiny_norm"), "--db", str(tmp_path / "k.db"), "--base-url",
                                  fake_llm.base_url, "--model", "fake-model", "--max-attempts", "7"])
    return result, fake_llm, tmp_path  # the server stopped, what it received kept


def test_run_against_a_scripted_llm(scripted_llm_run):
    result, fake_llm, tmp_path = scripted_llm_run
    db = tmp_path / "k.db"
    assert result.exit_code == 0, result.output

    rows = attempts(db)
    assert [r["seq"] for r in rows] == list(range(7))
    assert [r["status"] for r in rows] == [
        "accepted", "static_rejected", "static_rejected", "accepted", "compile_error", "compile_error", "compile_error"]
    assert rows[1]["threat"] is None and "syntax error" in rows[1]["reason"]
    assert rows[2]["threat"] == 16  # the cheat is named by its THREATS class
    assert rows[3]["reuse_of"] == rows[0]["id"]  # same code after normalisation: not judged twice
    assert "<think>" in rows[3]["response"] and "Plan: one program per row" in rows[3]["response"]
    assert "truncated" in rows[4]["reason"] and json.loads(rows[4]["evidence"])["check"] == "extraction"
    assert "no_such_module_here" in rows[5]["reason"] and json.loads(rows[5]["evidence"])["check"] == "compile"
    assert "no_model_new" in rows[6]["reason"] and "persistent grid" in rows[6]["code"]
    assert (rows[0]["tokens_in"], rows[0]["tokens_out"]) == (1000, 500)
    assert all(r["tokens_in"] > 0 and r["tokens_out"] > 0 for r in rows)
    assert all(r["proposer"].startswith("llm/") and r["model"] == "fake-model" for r in rows)
    first = json.loads(rows[0]["prompt"])
    assert first[0]["role"] == "system" and "first candidate" in first[1]["content"]  # no seed: the reference alone

    # 7 attempts, one 429 and one reply past the hard limit: 9 requests, 2 retries
    assert len(fake_llm.completions) == 9
    assert "2 LLM retries" in result.output
    conn = sqlite3.connect(db)
    run = conn.execute("SELECT status, attempts, tokens_in + tokens_out FROM runs").fetchone()
    conn.close()
    assert run[0] == "finished" and run[1] == 7 and run[2] == sum(r["tokens_in"] + r["tokens_out"] for r in rows)
    # interpreter verdicts: no best (as `kernforge archive best` says); the accepted kernels are pointed at
    assert "best kernels" not in result.output and "correct on the interpreter; never a best" in result.output

    # The key went to the server in the Authorization header and nowhere else.
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("k.db*"))
    assert KEY.encode() not in stored and KEY not in result.output
    assert all(KEY not in json.dumps(r.body) for r in fake_llm.requests if r.body)


def test_an_llm_run_shows_the_model_torch_compiles_code_for_the_task(scripted_llm_run):
    """End to end: the run captures Inductor's code for the task's reference (a real child process
    on the CPU) and the request the provider receives holds it, as the code to beat."""
    result, fake_llm, tmp_path = scripted_llm_run
    db = tmp_path / "k.db"
    assert result.exit_code == 0, result.output
    user = fake_llm.completions[0].messages[1]["content"]
    section = user.split("# What torch.compile does for this reference: beat it", 1)[1]
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "@triton.jit\ndef triton_" in code and "def call(" in code and ".run(" in code
    assert "size_hints" not in code and "Trimmed from Inductor's" in section
    assert json.loads(attempts(db)[0]["prompt"])[1]["content"] == user  # archived as sent


def test_readme_main_job_without_key_or_gpu(tmp_path, monkeypatch):
    """`kernforge run --task rms_norm --max-attempts N`: the offline tuner on the interpreter."""
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["status"] == "finished" and data["devices"] == ["cpu"] and data["proposer"].startswith("offline")
    assert data["tokens"] == 0 and data["cost"] == 0
    rows = attempts(tmp_path / "kernforge.db")
    assert [(r["proposer"], r["status"]) for r in rows] == [("seed", "accepted")]  # the seed runs on the interpreter
    # correct on the interpreter, never a best: the summary says what `kernforge archive best` says
    assert data["tasks"][0]["accepted"] == 1 and data["tasks"][0]["best_attempt"] is None

    # A second run continues from the archive: the seed is not judged again, the tuner starts from it.
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "1"])
    assert result.exit_code == 0, result.output
    rows = attempts(tmp_path / "kernforge.db")
    assert [(r["run_id"], r["proposer"]) for r in rows] == [(1, "seed"), (2, "offline")]
    assert rows[1]["parent_id"] == rows[0]["id"] and rows[1]["code_hash"] != rows[0]["code_hash"]
    assert "offline tuning of _rms_norm_kernel" in result.output and "kernforge archive sql" in result.output


def test_offline_rms_norm_tunes_past_num_warps_and_says_what_it_cannot_reach(tmp_path, monkeypatch):
    """rms_norm's BLOCK is the whole row: num_warps alone gave 5 configurations, so --max-attempts 20
    stopped after 5. Each load's eviction hint multiplies that by 9 (45), and a budget beyond what
    is left is said once, at the start."""
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "7"])
    assert result.exit_code == 0, result.output
    rows = attempts(tmp_path / "kernforge.db")
    assert [r["proposer"] for r in rows] == ["seed"] + ["offline"] * 6
    assert all(r["status"] == "accepted" for r in rows), [r["reason"] for r in rows]
    assert len({r["code_hash"] for r in rows}) == 7
    assert "eviction_policy" in "".join(r["code"] for r in rows)
    assert "will not be reached" not in result.output  # 7 of 45: within reach

    # 7 of the 45 are archived now: 38 are left for the next run, not 40
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "40", "--hours", "0.0001"])
    assert result.exit_code == 0, result.output
    note = ("[rms_norm] the offline tuner can reach only 45 configurations of the seed's knobs (x_ptr.eviction_policy, "
            "w_ptr.eviction_policy, num_warps), 7 of them tried already; --max-attempts 40 will not be reached")
    assert result.output.count(note) == 1, result.output
    assert result.output.index(note) < result.output.index("stopping: the time budget")


def test_ctrl_c_cancels_the_request_in_flight_and_marks_the_run_interrupted(fake_llm, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNFORGE_API_KEY", KEY)
    (tmp_path / "config" / "kernforge").mkdir(parents=True)
    (tmp_path / "config" / "kernforge" / "config.toml").write_text("[llm]\nconcurrency = 1\nrequest_timeout_s = 120\n")
    fake_llm.script = [slow(120, reply(fenced(GOOD_KERNEL)))]

    def press_ctrl_c():
        while not fake_llm.in_flight:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    db = tmp_path / "k.db"
    result = cli.invoke(app, ["run", "--task", str(TASKS / "tiny_norm"), "--db", str(db), "--base-url",
                              fake_llm.base_url, "--model", "fake-model", "--max-attempts", "3"])
    presser.join()
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "kernforge run --resume 1" in result.output
    # Had the request not been cancelled, its reply would have been judged and archived.
    assert attempts(db) == [] and len(fake_llm.completions) == 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    conn.close()


@pytest.mark.gpu
def test_offline_run_on_a_gpu_scores_against_the_baselines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "3", "--gpu", "0", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["devices"] == ["cuda:0"] and data["verified_per_device"]["cuda:0"] == 3
    task = data["tasks"][0]
    assert task["accepted"] >= 1 and task["best_score"] and task["best_speedup_eager"] and task["vs_seed"] >= 1.0
    rows = attempts(tmp_path / "kernforge.db")
    assert rows[0]["proposer"] == "seed" and rows[0]["score"] is not None and rows[0]["gpu"] != "cpu"


def _run_cli(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV_VARS}
    return subprocess.Popen([sys.executable, "-m", "kernforge.cli", "run", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_killed_run_resumes_without_duplicates_or_losses(tmp_path):
    task, db = seeded_task(tmp_path), tmp_path / "k.db"
    first = _run_cli("--task", str(task), "--db", str(db), "--max-attempts", "3")
    try:
        deadline = time.monotonic() + 300
        while recorded(db) < 1:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the run and its sandbox workers, mid-run
        first.wait()
    killed = attempts(db)
    assert 1 <= len(killed) < 3
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "running"
    conn.close()

    resumed = _run_cli("--resume", "1", "--db", str(db))
    output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, output
    rows = attempts(db)
    assert [r["seq"] for r in rows] == list(range(3)) and {r["run_id"] for r in rows} == {1}
    assert rows[: len(killed)] == killed  # nothing recorded before the kill changed or vanished
    judged = [r["code_hash"] for r in rows if r["reuse_of"] is None]
    assert len(judged) == len(set(judged)) == 3  # no code judged twice, no attempt redone
    conn = sqlite3.connect(db)
    run = conn.execute("SELECT status, attempts, resumes FROM runs").fetchone()
    conn.close()
    assert run == ("finished", 3, 1)


def test_bad_input_is_a_clear_error(tmp_path):
    for args, words in [
        (["run", "--task", "no_such_task", "--db", str(tmp_path / "k.db")], "no such built-in task"),
        (["run", "--task", "rms_norm", "--max-attempts", "0", "--db", str(tmp_path / "k.db")], "--max-attempts"),
        (["run", "--resume", "3", "--db", str(tmp_path / "none.db")], "no archive"),
        (["run", "--task", "rms_norm", "--model", "MiniMax-M3", "--db", str(tmp_path / "k.db")], "no API key"),
        (["run", "--task", "rms_norm", "--gpu", "5", "--db", str(tmp_path / "k.db")], "--gpu 5"),
        (["run", "--db", str(tmp_path / "k.db")], "no task"),
        (["run", "--task", "rms_norm", "--sandbox", "vm", "--db", str(tmp_path / "k.db")], "--sandbox must be"),
        (["run", "--task", "rms_norm", "--lanes", "0", "--db", str(tmp_path / "k.db")], "--lanes must be 1 or more"),
        # the benchmark passes --lanes on to its run (it once took the option and ignored it)
        (["bench", "kernelbench", str(Path(__file__).parent / "kernelbench" / "19_ReLU.py"), "--offline", "--lanes", "0", "--db", str(tmp_path / "k.db")],
         "--lanes must be 1 or more"),
    ]:
        result = cli.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "k.db").exists()  # bad input never leaves an empty archive behind


class StandInJudge:
    """Gives verdicts from a script instead of running code: the loop's side of a run on any machine.

    The n-th candidate judged gets ``script[n]``; accepted ones are timed by the "interpreter" and
    each is ten times "faster" than the one before, so a loop that ranked interpreter times would
    make every one the new best.
    """

    def __init__(self, script):
        self.script = list(script)
        self.judged: list[str] = []

    def kernels_ahead(self, code, task):  # a script compiles nothing
        return None

    def verify(self, code, task, bar=None, audit=False):
        from kernforge.verifier.verdict import Accepted, ShapeResult

        self.judged.append(code)
        verdict = self.script[len(self.judged) - 1]
        if verdict == "accepted":
            time_us = 1e6 / 10 ** len(self.judged)
            return Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "interpreter", time_us=time_us),))
        return verdict

    def environment(self):
        from kernforge.archive import synthetic

        return dict(synthetic.INTERPRETER)

    def ceilings(self):
        return {}

    def check_fits(self, task):
        """Every task fits (the CPU interpreter has no GPU memory to run out of)."""


def test_a_task_too_large_for_the_gpu_is_left_out_and_said(tmp_path):
    """Before anything runs, a task whose largest call cannot fit the GPU is named and left out,
    and the run's record keeps why (a benchmark's report says it); a run with no task left is a
    clear error (verifier/fits.py)."""
    import asyncio

    from kernforge.archive.store import Archive
    from kernforge.loop.errors import LoopError
    from kernforge.loop.runner import Runner
    from kernforge.tasks.loader import load_task

    small, big = load_task("rms_norm"), load_task("softmax")

    from kernforge.loop.budget import Budget, Meter, Spent

    class Devices:
        sized: list[str] = []

        async def too_large(self, task):
            self.sized.append(task.name)
            return f"{task.name}: task too large for this GPU: ..." if task.name == "softmax" else None

    class Display:
        notes: list[str] = []

        def note(self, text):
            self.notes.append(text)

    runner = object.__new__(Runner)
    runner.devices, runner.display = Devices(), Display()
    runner.meter = Meter(Budget(max_attempts=2))
    runner.archive = Archive.create(tmp_path / "k.db")
    runner.run_id = runner.archive.start_run({"settings": {"benchmark": "kernelbench"}})
    kept = asyncio.run(runner._fitting([small, big], [1, 2]))
    assert kept == ([small], [1])
    assert any("left out: softmax: task too large for this GPU" in n for n in runner.display.notes)
    assert runner.archive.run_status(runner.run_id).run.config["left_out"] == {
        "softmax": "softmax: task too large for this GPU: ..."}
    with pytest.raises(LoopError, match="no task of this run fits these devices"):
        asyncio.run(runner._fitting([big], [2]))
    # resumed with rms_norm's attempts all recorded: it judges nothing more, so it is not sized
    runner.devices.sized.clear()
    runner.meter = Meter(Budget(max_attempts=2), Spent(attempts={"rms_norm": 2}))
    assert asyncio.run(runner._fitting([small, big], [1, 2])) == ([small], [1])
    # a later session on a GPU the task fits: no longer left out
    runner.devices.too_large = lambda task: asyncio.sleep(0, None)
    asyncio.run(runner._fitting([small, big], [1, 2]))
    assert "left_out" not in runner.archive.run_status(runner.run_id).run.config
    runner.archive.close()
    assert runner.devices.sized == ["softmax"]


def test_a_cpu_run_keeps_verdicts_typed_learns_by_check_and_never_ranks_interpreter_times(tmp_path, monkeypatch):
    import contextlib

    from kernforge.archive.history import task_history
    from kernforge.archive.store import Archive
    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.lessons import Lessons
    from kernforge.loop.runner import RunSettings, run
    from kernforge.verifier.defences import failures
    from kernforge.verifier.verdict import Accepted, Rejected, Status

    def index_error(where):
        return failures.RUNTIME.reject(Status.RUNTIME_ERROR, f"running failed while checking the {where}: IndexError",
                                       evidence={"error": "IndexError: index 4 is out of bounds"})

    judge = StandInJudge(["accepted", index_error("public shape T=4"), "accepted", index_error("hidden shape"), "accepted"])

    @contextlib.contextmanager
    def stand_in(device, **kw):
        assert device == "cpu"
        yield judge

    callers = []
    real = {cls: cls.to_dict for cls in (Accepted, Rejected)}
    for cls in real:
        def to_dict(self, _real=real[cls]):
            callers.append(sys._getframe(1).f_globals["__name__"])
            return _real(self)
        monkeypatch.setattr(cls, "to_dict", to_dict)
    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    db = tmp_path / "k.db"
    result = run(RunSettings(tasks=(str(seeded_task(tmp_path)),), db=db, offline=True, budget=Budget(max_attempts=5)))

    assert len(judge.judged) == 5 and result.status == "finished"  # five verdicts, no audit among the calls
    assert result.audited_per_device == {"cpu": 0} and result.tasks[0].audits == 0
    assert 0 < result.tasks[0].first_verdict_s <= result.wall_s  # when the task's first verdict came
    assert set(callers) <= {"kernforge.archive.store"}, callers  # verdicts became dicts only in the archive
    with Archive.open(db, readonly=True) as archive:
        rows = task_history(archive, 1)
        best = archive.best()
    assert [r.status for r in rows] == ["accepted", "runtime_error", "accepted", "runtime_error", "accepted"]
    stats = result.tasks[0]
    # interpreter times rank nothing: no best in the run's stats, as in `kernforge archive best`
    assert stats.best_attempt is None and stats.best_time_us is None and stats.accepted == 3
    assert stats.vs_seed is None and stats.interpreter
    assert best == []  # `kernforge archive best` ranks GPU verdicts only
    assert sqlite3.connect(db).execute("SELECT count(*) FROM audits").fetchone()[0] == 0  # interpreter: never audited
    assert rows[1].check == "runtime" and rows[1].evidence["error"].startswith("IndexError")
    lessons = Lessons(min_count=2)
    lessons.replay(rows)  # two reasons, one check: one lesson, stating the defence's remedy
    assert lessons.current() == [f"Running failed with `IndexError: index N is out of bounds` (2x, runtime check): "
                                 f"{failures.RUNTIME.remedy}"]


# ---- the audit of a would-be best ---------------------------------------------------------------
def gpu_accepted(time_us: float):
    """Accepted on the "H200", timed with CUDA graphs against torch.compile at 200 us (scored)."""
    from kernforge.archive import synthetic
    from kernforge.verifier.verdict import Accepted, ShapeResult

    return Accepted(shapes=(ShapeResult({"T": 4, "H": 64}, False, "float32", "graph", time_us=time_us,
                                        compile_us=200.0, eager_us=300.0),), environment=dict(synthetic.H200))


class GpuStandInJudge(StandInJudge):
    """The n-th call of ``verify`` (an audit is one: a second ``verify``) gets ``script[n]``: a GPU
    time (accepted, ``gpu_accepted``), a verdict, or an exception to raise."""

    def verify(self, code, task, bar=None, audit=False):
        self.judged.append(code)
        self.bars.append(bar)
        item = self.script[len(self.judged) - 1]
        if isinstance(item, BaseException):
            raise item
        return gpu_accepted(item) if isinstance(item, float) else item

    @property
    def bars(self) -> list:
        return self.__dict__.setdefault("_bars", [])

    def environment(self):
        from kernforge.archive import synthetic

        return dict(synthetic.H200)


def gpu_run(tmp_path, monkeypatch, script, attempts):
    """A run of the offline tuner on the seeded task (in ``tmp_path/k.db``, after any earlier run
    there), judged by ``GpuStandInJudge(script)`` on "cuda:0"."""
    import contextlib
    import io

    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.display import PlainDisplay
    from kernforge.loop.runner import RunSettings, run

    judge = GpuStandInJudge(script)

    @contextlib.contextmanager
    def stand_in(device, **kw):
        assert device == "cuda:0"
        yield judge

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cuda:0"])
    db, shown = tmp_path / "k.db", io.StringIO()
    folder = tmp_path / "tiny_seeded"
    task = folder if folder.is_dir() else seeded_task(tmp_path)
    settings = RunSettings(tasks=(str(task),), db=db, offline=True, budget=Budget(max_attempts=attempts))
    try:
        result = run(settings, PlainDisplay(shown))
    except Exception as error:
        result = error
    return result, judge, db, shown.getvalue()


def audit_rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM audits ORDER BY id")]
    conn.close()
    return rows


def test_a_new_best_that_passes_its_audit_stands(tmp_path, monkeypatch):
    from kernforge.archive.store import Archive

    # the seed (100 us, audited: 101 us), a faster kernel (50 us, audited: 52 us), a slower one (never audited)
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [100.0, 101.0, 50.0, 52.0, 80.0], attempts=3)
    assert result.status == "finished" and len(judge.judged) == 5
    assert judge.judged[1] == judge.judged[0] and judge.judged[3] == judge.judged[2]  # the same code, judged again
    rows = attempts(db)
    assert [r["status"] for r in rows] == ["accepted"] * 3
    audits = audit_rows(db)
    assert [(a["attempt_id"], a["run_id"], a["passed"]) for a in audits] == [(rows[0]["id"], 1, 1), (rows[1]["id"], 1, 1)]
    assert audits[1]["recorded_us"] == pytest.approx(50.0) and audits[1]["measured_us"] == pytest.approx(52.0)
    assert json.loads(audits[1]["verdict"])["status"] == "accepted"
    stats = result.tasks[0]
    assert stats.best_attempt == rows[1]["id"] and (stats.audits, stats.audits_failed) == (2, 0)
    assert result.audited_per_device == {"cuda:0": 2} and result.verified_per_device == {"cuda:0": 3}
    with Archive.open(db, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [rows[1]["id"]]
    assert shown.count("NEW BEST (audit passed)") == 2 and "AUDIT FAILED" not in shown


def test_an_audit_the_gpu_could_not_judge_is_made_at_a_later_turn_and_the_best_stands(tmp_path, monkeypatch):
    """Two lanes on an H100 (session 57): an audit ran out of memory another lane's reference held
    (GpuMemoryHeld, nobody's verdict), and the would-be best was dropped unaudited. It is audited
    again after the next verdict, and its pass makes it the best."""
    from kernforge.archive.store import Archive
    from kernforge.verifier.judge_errors import GpuMemoryHeld

    held = GpuMemoryHeld("the GPU's memory was held by other processes (40% of it free): out of memory")
    # the seed (100 us, audited: 101 us); 50 us, its audit unjudged; 80 us, a would-be best while
    # 50 us waits (audited: 81 us); then 50 us's audit again, after that verdict: 52 us
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [100.0, 101.0, 50.0, held, 80.0, 81.0, 52.0], attempts=3)
    assert result.status == "finished" and len(judge.judged) == 7, shown
    assert judge.judged[6] == judge.judged[3] == judge.judged[2]  # the same code, audited after the next verdict
    rows = attempts(db)
    assert [(a["attempt_id"], a["passed"]) for a in audit_rows(db)] == [(rows[0]["id"], 1), (rows[2]["id"], 1), (rows[1]["id"], 1)]
    assert "could not be audited, tried again later (1 of 3 tries)" in shown
    with Archive.open(db, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [rows[1]["id"]]


def test_a_near_tie_with_the_best_is_not_audited_and_the_run_says_so(tmp_path, monkeypatch):
    from kernforge.loop.display import summary

    # the seed (100 us, audited: 100 us); 99.5 us, within the judge's noise of it: not audited;
    # 90 us, clearly faster: audited (91 us) and the new best
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [100.0, 100.0, 99.5, 90.0, 91.0], attempts=3)
    assert result.status == "finished" and len(judge.judged) == 5
    rows = attempts(db)
    assert [(a["attempt_id"], a["passed"]) for a in audit_rows(db)] == [(rows[0]["id"], 1), (rows[2]["id"], 1)]
    stats = result.tasks[0]
    assert stats.best_attempt == rows[2]["id"] and (stats.audits, stats.near_ties) == (2, 1)
    assert "1 kernel(s) fitter than their task's best by less than 2%" in str(summary(result.to_dict()).renderables)


def test_a_new_best_that_fails_its_audit_is_demoted_and_the_previous_best_remains(tmp_path, monkeypatch):
    from kernforge.archive.store import Archive
    from kernforge.loop.display import summary
    from kernforge.verifier.verdict import Rejected, Status

    cheat = Rejected(Status.CHEAT, "the output came from torch.nn.functional, not its own kernel", threat=16)
    wrong = Rejected(Status.INCORRECT, "max abs err 0.5 at index (0, 3) on hidden shape T=4")
    script = [100.0, 100.0,  # the seed, audited: the best
              50.0, 80.0, 80.0,  # twice as fast, but judged again (twice) 60% slower: its time did not hold
              wrong,         # a rejection: never audited
              40.0, cheat,   # faster again, and rejected when judged again
              150.0]         # slower than the best: not audited
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, script, attempts=5)
    assert result.status == "finished" and len(judge.judged) == len(script)
    rows = attempts(db)
    assert [r["status"] for r in rows] == ["accepted", "accepted", "incorrect", "accepted", "accepted"]
    audits = audit_rows(db)
    assert [(a["attempt_id"], a["passed"]) for a in audits] == [(rows[0]["id"], 1), (rows[1]["id"], 0), (rows[3]["id"], 0)]
    assert "its time did not hold" in audits[1]["reason"] and "it was rejected" in audits[2]["reason"]
    stats = result.tasks[0]
    assert stats.best_attempt == rows[0]["id"] and stats.accepted == 4 and (stats.audits, stats.audits_failed) == (3, 2)
    with Archive.open(db, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [rows[0]["id"]]  # the demoted are accepted attempts, not bests
        assert archive.get_attempt(rows[1]["id"]).verdict.accepted
    failed = [line for line in shown.splitlines() if "AUDIT FAILED" in line]
    assert len(failed) == 2 and f"attempt {rows[1]['id']} " in failed[0] and "its time did not hold" in failed[0]
    assert "it was rejected" in failed[1] and "NEW BEST" not in " ".join(failed)
    assert "3 would-be best(s) audited" in str(summary(result.to_dict()).renderables)


def not_a_contender(time_us: float, best_us: float):
    """What the judge gives a candidate slower than the bar at its largest shape: accepted, timed
    there only, the rest "not timed", and the flag that says so (verifier/contender.py)."""
    from kernforge.archive import synthetic
    from kernforge.verifier import contender
    from kernforge.verifier.verdict import NOT_TIMED, Accepted, ShapeResult

    timed = ShapeResult({"T": 4, "H": 64}, False, "float32", "graph", time_us=time_us, compile_us=200.0, eager_us=300.0)
    flag = contender.beaten(timed, {contender.key({"T": 4, "H": 64}, False): best_us})
    return Accepted(shapes=(timed, ShapeResult({"T": 2, "H": 64}, False, "float32", NOT_TIMED)), flags=(flag,),
                    environment=dict(synthetic.H200))


def test_the_best_sets_the_bar_and_a_candidate_below_it_is_never_ranked(tmp_path, monkeypatch):
    """Each verdict after the first gets the confirmed best's times as its bar; a verdict that
    stopped timing below the bar (30 us at one shape here, which would rank as 6.7x over
    torch.compile) is accepted, shown as not a contender, never audited and never the best."""
    from kernforge.archive.store import Archive
    from kernforge.verifier import contender

    script = [100.0, 100.0,                    # the seed, audited: the best, and the bar
              not_a_contender(130.0, 100.0),   # slower at the largest shape: stopped there
              50.0, 51.0]                      # faster: timed in full, audited, the new best
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, script, attempts=3)
    assert result.status == "finished" and len(judge.judged) == 5
    seed_bar = {contender.key({"T": 4, "H": 64}, False): 100.0}
    assert judge.bars == [None, None, seed_bar, seed_bar, None], "the audit is judged without a bar"
    rows = attempts(db)
    assert [r["status"] for r in rows] == ["accepted"] * 3 and rows[1]["score"] is None
    assert [a["attempt_id"] for a in audit_rows(db)] == [rows[0]["id"], rows[2]["id"]]
    with Archive.open(db, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [rows[2]["id"]]
        history = {h.id: h for h in archive_history(archive, rows[0]["task_id"])}
        assert history[rows[1]["id"]].time_us is None and history[rows[2]["id"]].time_us == pytest.approx(50.0)
    line = next(line for line in shown.splitlines() if f"attempt {rows[1]['id']} " in line)
    assert "accepted, not a contender: 130.00 us" in line and "NEW BEST" not in line


def archive_history(archive, task_id):
    from kernforge.archive.history import task_history

    return task_history(archive, task_id)


def _run_on_a_stand_in_gpu(judge, tasks, tmp_path, monkeypatch, budget=None):
    """An offline run of ``tasks`` (folders) whose one GPU judge is ``judge``, into tmp_path/k.db
    (``budget``: three attempts a task unless given): its result and what it showed."""
    import contextlib
    import io

    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.display import PlainDisplay
    from kernforge.loop.runner import RunSettings, run

    @contextlib.contextmanager
    def stand_in(device, **kw):
        yield judge

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cuda:0"])
    shown = io.StringIO()
    settings = RunSettings(tasks=tuple(str(t) for t in tasks), db=tmp_path / "k.db", offline=True,
                           budget=budget or Budget(max_attempts=3))
    return run(settings, PlainDisplay(shown)), shown.getvalue()


def test_a_task_whose_reference_fails_is_set_aside_and_the_night_goes_on(tmp_path, monkeypatch):
    """On the H200 one KernelBench problem's reference ran out of memory while preparing a call,
    and that ReferenceFailed ended the whole run. The judge failing on one task is not the
    candidate's fault nor the run's: that task is set aside, said why, and the others go on."""
    import shutil

    from kernforge.verifier.judge import ReferenceFailed

    good = seeded_task(tmp_path)
    broken = tmp_path / "tiny_broken"
    shutil.copytree(good, broken)

    class Judge(GpuStandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            if task.name == "tiny_broken":
                raise ReferenceFailed("the task's reference failed on prepare: OutOfMemoryError: CUDA out of memory")
            self.judged.append(code)
            return gpu_accepted(100.0 - len(self.judged))

    judge = Judge([])
    result, shown = _run_on_a_stand_in_gpu(judge, (broken, good), tmp_path, monkeypatch)
    assert result.status == "finished", shown
    rows = attempts(tmp_path / "k.db")
    assert rows and all(r["task_id"] == rows[0]["task_id"] for r in rows) and len(judge.judged) >= 3
    assert "[tiny_broken] set aside: the judge failed on it, not a candidate" in shown
    assert "OutOfMemoryError" in shown


def test_a_judge_that_runs_out_of_memory_once_leaves_the_seed_to_be_judged_again(tmp_path, monkeypatch):
    """On the H100 fused_moe's arena could not be made while its own torch.compile baseline was
    being compiled beside it, and the task was set aside for the night. The GPU's memory running
    out under the judge may be a moment's: the attempt is left unjudged, the seed is judged again,
    and only a task that runs out on every try is set aside."""
    from kernforge.loop import runner as runner_module
    from kernforge.verifier.judge import ReferenceFailed

    class Judge(GpuStandInJudge):
        failures = runner_module.MEMORY_TRIES - 1

        def verify(self, code, task, bar=None, audit=False):
            if self.failures:
                self.failures -= 1
                raise ReferenceFailed("the task's reference failed on arena: VMMError: cuMemCreate of 22863151104 bytes "
                                      "failed: CUDA_ERROR_OUT_OF_MEMORY (2)")
            self.judged.append(code)
            return gpu_accepted(100.0 - len(self.judged))

    judge = Judge([])
    result, shown = _run_on_a_stand_in_gpu(judge, (seeded_task(tmp_path),), tmp_path, monkeypatch)
    assert result.status == "finished", shown
    assert "an attempt was left unjudged: the GPU's memory ran out under the judge (2 of 3 tries" in shown
    assert "set aside" not in shown
    rows = attempts(tmp_path / "k.db")
    assert [r["proposer"] for r in rows].count("seed") == 1 and len(judge.judged) >= 1


def test_an_attempt_the_gpu_could_not_time_is_left_unjudged_and_its_task_goes_on(tmp_path, monkeypatch):
    """GpuBusy (another process kept the GPU busy before a window) is nobody's verdict: the
    attempt is not recorded, the run says why, and the same task is judged on (not set aside)."""
    from kernforge.verifier.judge import GpuBusy

    class Judge(GpuStandInJudge):
        busy = 1

        def verify(self, code, task, bar=None, audit=False):
            if self.busy and not audit:
                self.busy -= 1
                raise GpuBusy("another process kept the GPU busy for 20 s (timing the public shape T=4)")
            self.judged.append(code)
            return gpu_accepted(100.0 - len(self.judged))

    judge = Judge([])
    result, shown = _run_on_a_stand_in_gpu(judge, (seeded_task(tmp_path),), tmp_path, monkeypatch)
    assert result.status == "finished", shown
    assert "an attempt was left unjudged: another process kept the GPU busy" in shown
    assert "set aside" not in shown
    assert len(judge.judged) >= 1 and len(attempts(tmp_path / "k.db")) == len(set(judge.judged))


def test_a_run_stopped_during_an_audit_keeps_the_attempt_and_no_best(tmp_path, monkeypatch):
    from kernforge.archive.store import Archive

    result, judge, db, _ = gpu_run(tmp_path, monkeypatch, [100.0, RuntimeError("the worker pool went away")], attempts=1)
    assert isinstance(result, RuntimeError) and len(judge.judged) == 2
    rows = attempts(db)
    assert [(r["status"], r["proposer"]) for r in rows] == [("accepted", "seed")]  # recorded before its audit
    assert audit_rows(db) == []
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "failed"
    conn.close()
    with Archive.open(db, readonly=True) as archive:
        assert archive.best() == [] and [w.accepted for w in archive.awaiting_audit()] == [1]

    # the next run audits the kernel left unaudited first (its task had its verdict in the earlier
    # run: no first verdict waits on it), which passes and is the best; then it judges a new
    # kernel, slower (150 us): no would-be best, no audit
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [101.0, 150.0], attempts=1)
    assert result.status == "finished" and len(judge.judged) == 2, shown
    assert judge.judged[0] == rows[0]["code"] != judge.judged[1]
    assert "[tiny_seeded] 1 archived kernel(s) fitter than the audited best have no audit (a stopped run left " \
           "them): audited as the run goes, before the new ones" in shown
    assert f"attempt {rows[0]['id']}, left unaudited, audited: passed, the new best" in shown
    audited = audit_rows(db)
    assert [(a["attempt_id"], a["run_id"], a["passed"]) for a in audited] == [(rows[0]["id"], 2, 1)]
    with Archive.open(db, readonly=True) as archive:
        (best,) = archive.best()
        assert best.attempt_id == rows[0]["id"]


@pytest.mark.timeout(120)
def test_a_run_terminated_while_auditing_what_an_earlier_run_left_ends_at_once(tmp_path, monkeypatch):
    """SIGTERM during the audit of a kernel an earlier run left unaudited abandons it and ends the
    run: nothing more is judged. (When those audits came before anything new, their cancel let the
    run go on to start its proposers and verifiers, which waited for work that never came: on the
    H200 two runs hung until they were killed, and printed nothing.)"""
    from kernforge.verifier.verdict import Rejected, Status

    result, judge, db, _ = gpu_run(tmp_path, monkeypatch, [100.0, RuntimeError("the worker pool went away")], attempts=1)
    assert isinstance(result, RuntimeError)

    def terminated_meanwhile():
        os.kill(os.getpid(), signal.SIGTERM)  # the run's handler abandons the audit in flight
        time.sleep(1.0)
        return gpu_accepted(101.0)

    class Terminating(GpuStandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            item = self.script[len(self.judged)]
            if callable(item):
                self.judged.append(code)
                return item()
            return super().verify(code, task, bar, audit)

    monkeypatch.setattr(sys.modules[__name__], "GpuStandInJudge", Terminating)
    wrong = Rejected(Status.INCORRECT, "max abs err 0.5 at index (0, 3)")  # never reached
    # the leftover's audit comes first (no first verdict waits on it) and is where SIGTERM lands
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [terminated_meanwhile, wrong, 60.0, 61.0], attempts=3)
    assert result.status == "interrupted", shown
    assert len(judge.judged) == 1 and judge.judged[0] == attempts(db)[0]["code"]
    assert len(attempts(db)) == 1 and audit_rows(db) == []


class TaskNamingJudge(GpuStandInJudge):
    """``GpuStandInJudge`` that also keeps the task of each ``verify`` (an audit is one)."""

    def verify(self, code, task, bar=None, audit=False):
        self.__dict__.setdefault("tasks", []).append(task.name)
        return super().verify(code, task, bar)


def two_task_run(tmp_path, monkeypatch, script, budget):
    """The offline tuner on two seeded tasks (tiny_seeded, tiny_second) judged by
    ``TaskNamingJudge(script)`` on "cuda:0": (result, judge, db, what the display showed)."""
    import shutil

    first = seeded_task(tmp_path)
    second = tmp_path / "tiny_second"
    shutil.copytree(first, second)
    judge = TaskNamingJudge(script)
    result, shown = _run_on_a_stand_in_gpu(judge, (first, second), tmp_path, monkeypatch, budget=budget)
    return result, judge, tmp_path / "k.db", shown


def test_audits_wait_until_every_task_has_had_its_first_verdict(tmp_path, monkeypatch):
    """On the H200 each seed's audit (a second verdict: 25-30 s) followed its verdict at once, so
    14 tasks' first verdicts took 80-100 s each and 11 of 14 had none after five minutes. A would-be
    best's audit now waits while another task has had no verdict; the run's end audits what waits."""
    from kernforge.archive.store import Archive
    from kernforge.loop.budget import Budget

    # each task's seed (100 us), then a faster kernel of each (50 us); every audit agrees
    result, judge, db, shown = two_task_run(tmp_path, monkeypatch, [100.0, 100.0, 100.0, 100.0, 50.0, 50.0, 50.0, 50.0],
                                            Budget(max_attempts=2))
    assert result.status == "finished", shown
    rows = attempts(db)
    by_id = {r["id"]: r for r in rows}
    audits = audit_rows(db)
    # the two seeds' verdicts first (one task each), and only then anyone's audit
    assert sorted(judge.tasks[:2]) == ["tiny_second", "tiny_seeded"]
    assert [by_id[a["attempt_id"]]["proposer"] for a in audits[:2]] == ["seed", "seed"]
    assert len(judge.tasks) == 8 and len(audits) == 4 and all(a["passed"] for a in audits)
    assert "its audit deferred, audited: passed, the new best" in shown
    with Archive.open(db, readonly=True) as archive:
        bests = {b.task: b.attempt_id for b in archive.best()}
    faster = {r["task_id"]: r["id"] for r in rows if r["proposer"] != "seed"}
    assert sorted(bests.values()) == sorted(faster.values())  # each task's faster kernel, audited, is its best


def test_audits_past_their_share_of_the_gpu_wait_and_the_verdicts_go_on(tmp_path, monkeypatch):
    """An audit costs several verdicts (27-61 s on the H200 against 8-15 s): once audits have had
    their first minute and more than AUDIT_SHARE of the device time, a would-be best's audit waits
    and new verdicts go on; the run's end audits what waits, the task's fittest first, and once
    that passed the slower one could not lead: it needs no audit. (Audits charged 1000 s each here.)"""
    from kernforge.archive.store import Archive
    from kernforge.loop import devices

    real = devices.Devices.audit

    async def dear(self, *args):
        audit, spent = await real(self, *args)
        return audit, spent + 1000.0

    monkeypatch.setattr(devices.Devices, "audit", dear)
    # the seed (100 us, audited at once: 101), two faster kernels whose audits wait (50, then 40 us),
    # then at the run's end the fittest one's audit (41), and none of the one it overtook
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [100.0, 101.0, 50.0, 40.0, 41.0], attempts=3)
    assert result.status == "finished" and len(judge.judged) == 5, shown
    rows = attempts(db)
    assert judge.judged == [rows[0]["code"]] * 2 + [rows[1]["code"], rows[2]["code"], rows[2]["code"]]
    assert [(a["attempt_id"], a["passed"]) for a in audit_rows(db)] == [(rows[0]["id"], 1), (rows[2]["id"], 1)]
    assert shown.count("its audit deferred, audited: passed, the new best") == 1
    with Archive.open(db, readonly=True) as archive:
        assert [b.attempt_id for b in archive.best()] == [rows[2]["id"]]


def test_waiting_audits_start_when_the_time_budget_would_end_before_them(tmp_path, monkeypatch):
    """Audits wait for every task's first verdict, but not past the time budget: a run cut by it
    would leave its bests unaudited (a benchmark's problems correct but untimed). Verdicts that
    took 3000 s each, in a one-hour budget: each seed's audit is made at once."""
    from kernforge.archive import synthetic
    from kernforge.loop.budget import Budget
    from kernforge.verifier.verdict import Accepted

    slow = Accepted(shapes=gpu_accepted(100.0).shapes, environment=dict(synthetic.H200, verify_seconds=3000.0))
    result, judge, db, shown = two_task_run(tmp_path, monkeypatch, [slow] * 4, Budget(max_attempts=1, hours=1.0))
    assert result.status == "finished", shown
    assert judge.tasks[0] == judge.tasks[1] and judge.tasks[2] == judge.tasks[3] != judge.tasks[0]
    assert len(audit_rows(db)) == 2


def _llm_run(fake_llm, tmp_path, db: Path, *extra: str) -> subprocess.Popen:
    """`kernforge run` in a process of its own against the fake LLM (one request at a time), its
    stdout and stderr piped."""
    config = tmp_path / "config" / "kernforge"
    config.mkdir(parents=True, exist_ok=True)
    (config / "config.toml").write_text("[llm]\nconcurrency = 1\nrequest_timeout_s = 300\n")
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV_VARS} | {
        "KERNFORGE_API_KEY": KEY, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return subprocess.Popen([sys.executable, "-m", "kernforge.cli", "run", "--task", str(TASKS / "tiny_norm"),
                             "--db", str(db), "--base-url", fake_llm.base_url, "--model", "fake-model", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_the_second_request(fake_llm, db: Path, run: subprocess.Popen) -> None:
    """Until the run recorded its first attempt and waits on its next (slow) request."""
    deadline = time.monotonic() + 300
    while recorded(db) < 1 or not fake_llm.in_flight:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.1)


def _run_row(db: Path) -> tuple:
    conn = sqlite3.connect(db)
    row = conn.execute("SELECT status, owner, attempts, seconds FROM runs WHERE id = 1").fetchone()
    conn.close()
    return row


@pytest.fixture(scope="module")
def interrupted_live_run(tmp_path_factory):
    """`kernforge run` in a process of its own, waiting on its second (slow) request: a resume of
    it is asked for (and refused), then its stdout goes and it gets SIGINT (`kernforge run ... |
    tee log` and Ctrl-C: the terminal's SIGINT ends tee too). What each step showed, for the two
    tests below: one live run for both (a run in a process of its own starts Python, torch, its
    judge and Inductor's capture: tens of seconds on the CPU)."""
    tmp_path = tmp_path_factory.mktemp("live")
    seen = SimpleNamespace(stdout="")
    with pytest.MonkeyPatch.context() as monkeypatch, FakeLLM() as fake_llm:
        clean_config(monkeypatch, tmp_path)
        fake_llm.script = [reply(fenced(GOOD_KERNEL)), slow(300, reply(fenced(GOOD_COMMENTED)))]
        db = tmp_path / "k.db"
        live = _llm_run(fake_llm, tmp_path, db, "--max-attempts", "5")
        seen.pid = live.pid
        try:
            _wait_for_the_second_request(fake_llm, db, live)
            seen.running = _run_row(db)
            seen.resume = cli.invoke(app, ["run", "--resume", "1", "--db", str(db)])
            seen.after_resume = _run_row(db)
            seen.alive_after_resume = live.poll() is None
            seen.stdout = _available(live.stdout)  # what it printed before its stdout went
        finally:
            live.stdout.close()  # tee is gone
            live.send_signal(signal.SIGINT)
            seen.stderr = live.stderr.read()
            seen.returncode = live.wait(120)
        seen.ended = _run_row(db)
    return seen


def _available(stream) -> str:
    """What a pipe holds now, read without waiting for more."""
    fd, chunks = stream.fileno(), []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_ctrl_c_with_stdout_gone_stays_interrupted(interrupted_live_run):
    """`kernforge run ... | tee log` and Ctrl-C: the terminal's SIGINT ends tee too, so every write to
    stdout fails from then on. The run still stops cleanly: interrupted, exit 130, no traceback."""
    run = interrupted_live_run
    assert run.returncode == 130, run.stderr
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr
    assert run.ended[:3] == ("interrupted", None, 1)


def test_resuming_a_live_run_is_refused_and_leaves_it_alone(interrupted_live_run):
    live = interrupted_live_run
    status, owner, count, _ = live.running
    assert status == "running" and str(live.pid) in owner

    second = live.resume
    assert second.exit_code == 2, second.output
    assert "still running" in second.output and f"process {live.pid}" in second.output
    assert "Traceback" not in second.output
    assert live.after_resume[:3] == ("running", owner, count)  # the live run is untouched...
    assert live.alive_after_resume
    output, errors = live.stdout, live.stderr
    assert live.returncode == 130, output + errors  # ...and ends as it would have: interrupted, not failed
    status, owner, count, seconds = live.ended
    assert (status, owner, count) == ("interrupted", None, 1) and seconds > 0  # its wall time recorded
    assert "ConflictError" not in output + errors and "different code" not in output + errors


def test_a_time_budget_starts_nothing_once_it_is_spent(tmp_path, monkeypatch):
    """--hours: once the time is spent no verification starts (those under way finish); proposals
    already made are left unjudged and the summary says so. The run records its wall time."""
    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run

    started: list[float] = []

    class SlowJudge:
        def verify(self, code, task, bar=None, audit=False):
            started.append(time.monotonic())
            time.sleep(0.5)
            return StandInJudge(["accepted"]).verify(code, task)

        def environment(self):
            return StandInJudge([]).environment()

        def kernels_ahead(self, code, task):
            return None

        def check_fits(self, task):
            pass

    import contextlib

    @contextlib.contextmanager
    def stand_in(device, **kw):
        yield SlowJudge()

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    db = tmp_path / "k.db"
    hours = 0.3 / 3600
    t0 = time.monotonic()
    result = run(RunSettings(tasks=(str(seeded_task(tmp_path)),), db=db, offline=True,
                             budget=Budget(max_attempts=50, hours=hours)))
    assert result.status == "finished" and "time budget" in (result.stop_reason or "")
    budget_end = t0 + result.startup_s + hours * 3600
    assert started and all(s < budget_end + 0.05 for s in started), (started, budget_end)
    assert result.attempts == len(started) <= 2
    conn = sqlite3.connect(db)
    seconds, count = conn.execute("SELECT seconds, attempts FROM runs").fetchone()
    conn.close()
    assert count == result.attempts and seconds >= result.wall_s - 0.5 > 0


def test_a_proposals_kernels_start_compiling_ahead_before_it_waits_for_room_in_the_queue(tmp_path, monkeypatch):
    """With a fast proposer the queue is full: the third proposal waits for room while the first is
    judged and the second is queued. Its compile ahead starts before that wait, so it has two
    verdicts' time to compile in, not one (loop/kernels_ahead.py)."""
    import contextlib

    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run

    three = threading.Event()
    first_done = threading.Event()
    first_done_at_each_ahead: list[bool] = []

    class Judge(StandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            if not self.judged:
                three.wait(timeout=30)  # the first verdict lasts until three compiles ahead began
            verdict = super().verify(code, task)
            first_done.set()
            return verdict

    judge = Judge(["accepted"] * 3)

    def kernels_ahead(self, code, task):
        first_done_at_each_ahead.append(first_done.is_set())
        if len(first_done_at_each_ahead) == 3:
            three.set()
        return None

    @contextlib.contextmanager
    def stand_in(device, **kw):
        yield judge

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr(devices.Devices, "kernels_ahead", kernels_ahead)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    result = run(RunSettings(tasks=(str(seeded_task(tmp_path)),), db=tmp_path / "k.db", offline=True,
                             budget=Budget(max_attempts=3)))
    assert result.status == "finished" and len(judge.judged) == 3
    assert first_done_at_each_ahead == [False] * 3, first_done_at_each_ahead  # the third's too began during the first verdict


def test_two_lanes_judge_two_candidates_at_once_through_one_gate(tmp_path, monkeypatch):
    """``--lanes 2``: two judges per device, sharing the device's gate (verifier/gate.py), each
    with a verdict in flight at the same time; every attempt judged once."""
    import contextlib

    from kernforge.loop import devices
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run

    both = threading.Barrier(2, timeout=60)
    opened = []

    class Lane(StandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            if not self.judged:
                both.wait()  # passes only once the other lane's first verdict is in flight too
            return super().verify(code, task)

    @contextlib.contextmanager
    def stand_in(device, *, gate=None, **kw):
        opened.append((device, gate))
        yield Lane(["accepted"] * 8)

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    db = tmp_path / "k.db"
    result = run(RunSettings(tasks=(str(seeded_task(tmp_path)),), db=db, offline=True, budget=Budget(max_attempts=4),
                             lanes=2))
    assert result.status == "finished" and not both.broken
    assert [d for d, _ in opened] == ["cpu", "cpu"]
    assert opened[0][1] is opened[1][1] and opened[0][1].lanes == 2, "one gate per device, shared by its lanes"
    assert result.verified_per_device == {"cpu": 4} and recorded(db) == 4


def test_an_offline_run_prepares_the_inductor_starts_it_will_need_untried_tasks_first(tmp_path, monkeypatch):
    """The offline tuner derives the Inductor start of every task with no kernel (never a seeded
    one's) in the background from the run's start, in the order the tasks will first be picked:
    resumed, a task with no verdict yet goes before one that has had one."""
    import contextlib
    import shutil

    from kernforge.loop import devices, proposers
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run
    from kernforge.verifier.verdict import Rejected, Status

    seeded = seeded_task(tmp_path)
    kernel_less = [tmp_path / "tiny_a", tmp_path / "tiny_b"]
    for folder in kernel_less:
        shutil.copytree(TASKS / "tiny_norm", folder)

    class Judge(StandInJudge):
        def verify(self, code, task, bar=None, audit=False):
            if task.name == "tiny_a":
                return Rejected(Status.INCORRECT, "max abs err 0.5 at index (0, 3) on public shape T=4")
            return super().verify(code, task)

    @contextlib.contextmanager
    def stand_in(device, **kw):
        yield Judge(["accepted"] * 8)

    async def derive(task, device_kind, hold=None):
        if task.name == "tiny_a":
            return proposers.Start(HONEST + "\n# tiny_a's start\n", ("_norm_kernel",), "", "a stand-in start")
        return proposers.NoStart("Inductor writes no Triton for it (a stand-in)")

    prepared: list[list[str]] = []
    real_derive_ahead = proposers.OfflineTuner.derive_ahead

    def spy(self, tasks):  # what the tuner's prepare derives ahead, of every task the runner hands it
        tasks = list(tasks)
        prepared.append([t.name for t in tasks])
        real_derive_ahead(self, tasks)

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr("kernforge.loop.runner.resolve_devices", lambda gpus: ["cpu"])
    monkeypatch.setattr(proposers, "derive_async", derive)
    monkeypatch.setattr(proposers.OfflineTuner, "derive_ahead", spy)
    db = tmp_path / "k.db"
    first = run(RunSettings(tasks=(*map(str, kernel_less), str(seeded)), db=db, offline=True,
                            budget=Budget(max_attempts=2)))
    assert first.status == "finished" and prepared == [["tiny_a", "tiny_b"]]
    assert any("tiny_b" in n and "no TorchInductor start (Inductor writes no Triton" in n for n in first.notes)
    # resumed: tiny_a's start was judged (rejected), tiny_b has no verdict yet: tiny_b's start first
    again = run(RunSettings(db=db, resume=first.run_id))
    assert again.status == "finished" and prepared[1] == ["tiny_b", "tiny_a"]


def test_baselines_travel_between_the_archive_and_the_judges_cache(tmp_path, monkeypatch):
    """A run on a fresh machine (a new container each night, a resumed benchmark on another lease)
    starts with the baselines its archive kept, so they are not measured again before its first
    verdicts; those its judges measure (here: put in their cache during a verdict) or already held
    are kept in the archive."""
    from kernforge.archive.store import Archive
    from kernforge.verifier.cache import JsonCache
    from kernforge.verifier.judge import Judge

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNFORGE_CACHE_DIR", str(tmp_path / "cache"))
    cache = JsonCache(tmp_path / "cache" / "baselines.json")
    with Archive.create(tmp_path / "kernforge.db") as archive:
        archive.keep_judge_baselines({"from-archive": {"eager_us": 10.0, "compile_us": 8.0}})
    cache.put("held-by-the-judge", {"eager_us": 5.0})
    verify = Judge.verify

    def measuring(self, *args, **kwargs):
        self.baseline_cache.put("measured", {"eager_us": 7.0})
        return verify(self, *args, **kwargs)

    monkeypatch.setattr(Judge, "verify", measuring)
    result = cli.invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "1"])
    assert result.exit_code == 0, result.output
    assert cache.get("from-archive") == {"eager_us": 10.0, "compile_us": 8.0}
    with Archive.open(tmp_path / "kernforge.db", readonly=True) as archive:
        assert archive.judge_baselines() == {"from-archive": {"eager_us": 10.0, "compile_us": 8.0},
                                       "held-by-the-judge": {"eager_us": 5.0}, "measured": {"eager_us": 7.0}}


def test_a_benchmark_sorts_the_kernels_an_earlier_judge_passed_from_those_never_audited(tmp_path):
    """A benchmark resumed after the judge changed: a kernel whose latest audit, by an earlier
    judge, passed is counted already, so it waits in ``AuditQueue.reaudit``; one never audited
    waits in ``leftover`` and goes at once (test_loop_audit_queue.py)."""
    from kernforge.archive import synthetic
    from kernforge.archive.records import NewAttempt
    from kernforge.archive.store import Archive
    from kernforge.loop.display import QuietDisplay
    from kernforge.loop.plan import RunSettings
    from kernforge.loop.runner import Runner
    from kernforge.verifier.verdict import Accepted, ShapeResult

    from loop_helpers import audited_kernel, task_state

    env = {"gpu": "NVIDIA H100 80GB HBM3", "judge": "0123456789abcdef"}
    verdict = Accepted(shapes=(ShapeResult({"T": 8}, False, "float32", "graph", time_us=20.0),), environment=env)
    with Archive.create(tmp_path / "k.db") as archive:
        task = archive.register_task(synthetic.task_record("rms_norm"))
        run = archive.start_run({})
        before, never = (archive.record_attempt(NewAttempt(run, i, task, f"k = {i}", verdict, env)) for i in (1, 2))
        audit_id = archive.record_audit(before, synthetic.audit(verdict)).id
        with archive._write():
            archive.conn.execute("UPDATE audits SET judge = ? WHERE id = ?", (env["judge"], audit_id))
        for benchmark, again in ((None, []), ("kernelbench", [before])):
            runner = Runner(RunSettings(db=tmp_path / "k.db", benchmark=benchmark), QuietDisplay())
            runner.archive = archive
            kernels = [audited_kernel(before, 20.0), audited_kernel(never, 20.0)]
            assert runner._passed_before(kernels) == {before}
            state = task_state("rms_norm")
            runner.audits.take_leftovers(state, kernels, runner._passed_before(kernels) if benchmark else set())
            assert [m.attempt_id for _, m in runner.audits.reaudit] == again, benchmark
            assert [m.attempt_id for _, m in runner.audits.leftover] == [before, never][len(again):], benchmark


def test_baselines_are_compiled_ahead_in_the_order_of_first_verdicts_for_tasks_never_judged_here(tmp_path, monkeypatch):
    """A GPU run hands torch.compile's baselines to the compile-ahead processes task by task in
    the order the first verdicts take the tasks: the public shapes of the tasks never judged in
    this environment, then the hidden shapes (audits time them) of the tasks never audited in it.
    A second run on the archive, where every task was judged (its public baselines kept), compiles
    only the hidden shapes of a task that no audit timed; one where every task was audited too,
    nothing."""
    import contextlib
    import shutil

    from kernforge.archive.store import Archive
    from kernforge.loop import devices, runner
    from kernforge.loop.budget import Budget
    from kernforge.loop.runner import RunSettings, run

    seeded = seeded_task(tmp_path)
    other = tmp_path / "tiny_other"
    shutil.copytree(seeded, other)
    handed: list[tuple[list[str], list[str]]] = []

    class Ahead:
        def __init__(self, tasks, device, cache, hold, note=None, hidden=()):
            handed.append(([t.name for t in tasks], [t.name for t in hidden]))

        async def run(self):
            return None

    @contextlib.contextmanager
    def stand_in(device, **kw):
        yield GpuStandInJudge([40.0] * 40)

    monkeypatch.setattr(devices, "open_judge", stand_in)
    monkeypatch.setattr(runner, "resolve_devices", lambda gpus: ["cuda:0"])
    monkeypatch.setattr(runner, "_cuda_here", lambda: True)
    monkeypatch.setattr(runner, "CompileAhead", Ahead)
    db = tmp_path / "k.db"
    both = ["tiny_other", "tiny_seeded"]
    first = run(RunSettings(tasks=(str(other), str(seeded)), db=db, offline=True, budget=Budget(max_attempts=2)))
    assert first.status == "finished" and handed == [(both, both)]
    # the first run's audits, undone for one task: as if the run had stopped before its audit
    with Archive.open(db) as archive, archive._write():
        archive.conn.execute("DELETE FROM audits WHERE task_id = (SELECT id FROM tasks WHERE name = 'tiny_other')")
    again = run(RunSettings(tasks=(str(other), str(seeded)), db=db, offline=True, budget=Budget(max_attempts=3)))
    assert again.status == "finished" and handed[1:] == [([], ["tiny_other"])], \
        "judged here: no public shape again; never audited here: its hidden shapes"
    third = run(RunSettings(tasks=(str(other), str(seeded)), db=db, offline=True, budget=Budget(max_attempts=4)))
    assert third.status == "finished" and handed[2:] == [], "judged and audited here: nothing compiled ahead again"

    class Upgraded(GpuStandInJudge):  # another judge (kernforge upgraded): a new environment, the same GPU
        def environment(self):
            return {**super().environment(), "judge": "a later judge"}

    @contextlib.contextmanager
    def upgraded(device, **kw):
        yield Upgraded([40.0] * 40)

    monkeypatch.setattr(devices, "open_judge", upgraded)
    later = run(RunSettings(tasks=(str(other), str(seeded)), db=db, offline=True, budget=Budget(max_attempts=5)))
    assert later.status == "finished" and handed[2:] == [], \
        "judged and audited on this GPU and these versions before: the baselines are in the archive, nothing compiled ahead"


class _Compiling:
    """A stand-in for loop/compile_ahead.py's CompileAhead whose compiles never end: its ``run``
    waits until cancelled (the run stops it), and says so."""

    stopped: list[bool] = []

    def __init__(self, tasks, device, cache, hold, note=None, hidden=()):
        pass

    async def run(self):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            _Compiling.stopped.append(True)
            raise


def _compiling_ahead(monkeypatch):
    from kernforge.loop import runner

    _Compiling.stopped = []
    monkeypatch.setattr(runner, "_cuda_here", lambda: True)
    monkeypatch.setattr(runner, "CompileAhead", _Compiling)


OOM = "the task's reference failed on prepare: OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB"


def test_a_verdict_out_of_memory_beside_the_compiles_ahead_stops_them_and_costs_the_task_no_try(tmp_path, monkeypatch):
    """The GPU's memory ran out under the judge while torch.compile's baselines were still being
    compiled ahead (each compile process holds a call's inputs for its whole compile): the
    compiles stop, the attempt is judged again, and the task's memory tries are not spent."""
    from kernforge.verifier.judge import ReferenceFailed

    _compiling_ahead(monkeypatch)
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [ReferenceFailed(OOM), 100.0, 101.0], attempts=1)
    assert _Compiling.stopped == [True]
    assert result.status == "finished", shown
    assert [r["status"] for r in attempts(db)] == ["accepted"]
    assert "compiles are stopped to make room" in shown and "beside the compiles ahead, now stopped" in shown
    assert "1 of 3 tries" not in shown


def test_an_audit_out_of_memory_beside_the_compiles_ahead_stops_them_and_is_made_again(tmp_path, monkeypatch):
    """On an H100 an audit's reference ran out of memory beside the compiles ahead and the best
    stayed unaudited for the session: now the compiles stop and the audit goes again at once."""
    from kernforge.verifier.judge import ReferenceFailed

    _compiling_ahead(monkeypatch)
    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [100.0, ReferenceFailed(OOM), 101.0], attempts=1)
    assert _Compiling.stopped == [True]
    assert result.status == "finished", shown
    assert [(a["passed"], a["measured_us"]) for a in audit_rows(db)] == [(1, pytest.approx(101.0))]


def test_an_out_of_memory_with_no_compiles_ahead_running_counts_as_before(tmp_path, monkeypatch):
    """Nothing of ours to stop (a CPU-only machine's run, or the compiles are done): the memory
    tries are counted as before."""
    from kernforge.verifier.judge import ReferenceFailed

    result, judge, db, shown = gpu_run(tmp_path, monkeypatch, [ReferenceFailed(OOM), 100.0, 101.0], attempts=1)
    assert result.status == "finished", shown
    assert "1 of 3 tries" in shown and "make room" not in shown
