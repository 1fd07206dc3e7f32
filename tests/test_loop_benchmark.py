"""``kernforge bench kernelbench`` and ``bench report`` end to end on the CPU: CPU-sized copies of
KernelBench problems (tests/kernelbench/, side files of small shapes), with no API key (the offline
tuner) or a scripted local OpenAI-compatible server, under the Triton interpreter (correctness
only: no time-based metric may appear)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kernforge import cli as cli_module
from kernforge.archive.store import Archive
from kernforge.cli import app

from config_env import clean_config
from fake_llm import fake_llm, fenced, reply

__all__ = ["fake_llm"]

ROOT = Path(__file__).resolve().parents[1]
CPU_COPIES = ROOT / "tests" / "kernelbench"
CANDIDATES = ROOT / "bench" / "kernelbench" / "candidates"

cli = CliRunner()


@pytest.fixture(autouse=True)
def _no_key(clean_config_env):
    """No API key: the offline tuner proposes."""


def level(tmp_path: Path, seeded=("19_ReLU", "20_LeakyReLU"),
          bare=("21_Sigmoid", "12_Gemm_Multiply_LeakyReLU", "47_Sum_reduction_over_a_dimension")) -> Path:
    """A level folder of CPU-sized copies; ``seeded`` ones get an honest kernel as their seed (the
    offline tuner re-tunes an existing kernel). A bare problem starts from TorchInductor's Triton
    (loop/inductor_start.py; a Gemm's matmul with kernforge's GEMM), except where there is no such
    start (47's CPU shapes reduce over every dim, and Inductor's code holds one): then nothing is tried."""
    folder = tmp_path / "level1"
    folder.mkdir()
    for name in (*seeded, *bare):
        for suffix in (".py", ".meta.py"):
            shutil.copy(CPU_COPIES / f"{name}{suffix}", folder / f"{name}{suffix}")
    for name in seeded:
        shutil.copy(CANDIDATES / f"{name}.py", folder / f"{name}.seed.py")
    return folder


def invoke(*args: str, width: int = 250):
    return cli.invoke(app, list(args), terminal_width=width)


def attempts(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT a.run_id, a.seq, t.name, a.status, a.code_hash FROM attempts a"
                            " JOIN tasks t ON t.id = a.task_id ORDER BY a.id").fetchall()
    finally:
        conn.close()


def test_a_level_without_a_key_gives_accepted_attempts_and_kernelbench_metrics(tmp_path, monkeypatch):
    folder, db = level(tmp_path), tmp_path / "k.db"
    result = invoke("bench", "kernelbench", str(folder), "--db", str(db), "--max-attempts", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["status"] == "finished" and data["devices"] == ["cpu"] and data["proposer"].startswith("offline")
    assert (data["run"]["benchmark"], data["run"]["label"]) == ("kernelbench", "offline")
    problems = {p["name"]: p for p in data["problems"]}
    assert sorted((p["name"], p["attempts"], p["correct"]) for p in data["problems"]) == [
        ("12_Gemm_Multiply_LeakyReLU", 2, True), ("19_ReLU", 2, True), ("20_LeakyReLU", 2, True), ("21_Sigmoid", 2, True),
        ("47_Sum_reduction_over_a_dimension", 0, False)]
    assert problems["19_ReLU"]["gpu"] == "cpu" and problems["19_ReLU"]["speedup_compile"] is None
    overall = data["metrics"][-1]
    assert (overall["group"], overall["problems"], overall["correct"]) == ("all", 5, 4)
    assert overall["correctness"] == pytest.approx(4 / 5)
    # the interpreter's clock is no device time: nothing time-based is computed from it
    assert overall["measured"] is False and overall["fast_p"] is None and overall["faster_than_compile"] is None
    assert overall["geomean_speedup"] == {"eager": None, "compile": None}
    rows = attempts(db)
    assert len(rows) == 8 and {r[0] for r in rows} == {1} and {r[3] for r in rows} == {"accepted"}

    # the same run, read back: a table that fits 80 columns, names whole, times said to be unmeasured
    monkeypatch.setattr(cli_module, "out", Console(width=80))  # an 80-column terminal
    shown = invoke("bench", "report", "1", "--db", str(db))
    assert shown.exit_code == 0, shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= 80 and "…" not in shown.output, shown.output
    for name in ("12_Gemm_Multiply_LeakyReLU", "19_ReLU", "20_LeakyReLU", "21_Sigmoid", "47_Sum_reduction_over_a_dimension"):
        assert name in shown.output
    assert "not measured" in shown.output and "4 (80%)" in shown.output and "not tried" in shown.output
    listed = invoke("bench", "report", "--db", str(db), "--json")
    assert [(r["run_id"], r["benchmark"], len(r["problems"])) for r in json.loads(listed.output)["runs"]] == [
        (1, "kernelbench", 5)]


class Recording:
    """Installed as runner.Devices: each run's judges' ``time_hidden`` option, in order, kept in
    ``seen``."""

    def __init__(self, monkeypatch, seen: list[str]):
        from kernforge.loop import runner as runner_module

        class Devices(runner_module.Devices):
            def __init__(self, *args, **kwargs):
                seen.append(kwargs["options"].time_hidden)
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(runner_module, "Devices", Devices)


@pytest.fixture(scope="module")
def resumed_benchmark(tmp_path_factory):
    """Two seeded problems benchmarked with one attempt each, that run resumed to two attempts,
    then a second run of the same files, with the judges' options recorded: the three runs the
    two tests below read (each run starts its judge, workers and reference: made once, not twice)."""
    tmp_path = tmp_path_factory.mktemp("resumed")
    seen: list[str] = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        clean_config(monkeypatch, tmp_path)  # no API key: the offline tuner proposes
        Recording(monkeypatch, seen)
        folder, db = level(tmp_path, bare=()), tmp_path / "k.db"
        files = [str(folder / "19_ReLU.py"), str(folder / "20_LeakyReLU.py")]
        first = invoke("bench", "kernelbench", *files, "--db", str(db), "--max-attempts", "1")
        resumed = invoke("bench", "kernelbench", "--resume", "1", "--db", str(db), "--max-attempts", "2", "--json")
        rows = attempts(db)  # as the resumed run left them, before the second run
        # another proposer's run (here the tuner again, from where the archive stands) beside the first
        second = invoke("bench", "kernelbench", *files, "--db", str(db), "--max-attempts", "1")
    return SimpleNamespace(folder=folder, db=db, first=first, resumed=resumed, rows=rows, second=second, seen=seen)


def test_resume_continues_the_run_and_a_second_run_compares_side_by_side(resumed_benchmark):
    db, first, resumed = resumed_benchmark.db, resumed_benchmark.first, resumed_benchmark.resumed
    assert first.exit_code == 0, first.output
    assert "not measured" in first.output and "bench report 1" in first.output

    assert resumed.exit_code == 0, resumed.output
    data = json.loads(resumed.output.strip().splitlines()[-1])
    assert data["run"]["run_id"] == 1 and [p["attempts"] for p in data["problems"]] == [2, 2]
    rows = resumed_benchmark.rows
    assert [(r[0], r[1]) for r in rows] == [(1, 0), (1, 1), (1, 2), (1, 3)]  # one run, dense, nothing redone
    assert len({(r[2], r[4]) for r in rows}) == 4

    # another proposer's run (here the tuner again, from where the archive stands) beside the first
    second = resumed_benchmark.second
    assert second.exit_code == 0, second.output
    compared = invoke("bench", "report", "1", "2", "--db", str(db))
    assert compared.exit_code == 0, compared.output
    assert "run 1 offline" in compared.output and "run 2 offline" in compared.output
    assert "runs side by side" in compared.output
    as_json = json.loads(invoke("bench", "report", "1", "2", "--db", str(db), "--json").output)
    assert [r["run"]["run_id"] for r in as_json["runs"]] == [1, 2]
    assert [r["metrics"][-1]["correct"] for r in as_json["runs"]] == [2, 2]


def test_an_llm_endpoint_writes_the_kernels_and_names_the_run(fake_llm, tmp_path):
    """The LLM path against a local OpenAI-compatible server: a bare problem (no seed), a reply that
    holds no module, then the honest kernel."""
    (tmp_path / "config" / "kernforge").mkdir(parents=True)
    (tmp_path / "config" / "kernforge" / "config.toml").write_text("[llm]\nconcurrency = 1\nmax_retries = 0\n")
    folder, db = level(tmp_path, seeded=(), bare=("19_ReLU",)), tmp_path / "k.db"
    fake_llm.script = [reply("I would fuse the ReLU into the load."),
                       reply(fenced((CANDIDATES / "19_ReLU.py").read_text()))]
    result = invoke("bench", "kernelbench", str(folder), "--db", str(db), "--base-url", fake_llm.base_url,
                    "--model", "fake-model", "--max-attempts", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["run"]["label"] == "fake-model" and data["proposer"].startswith("LLM fake-model")
    assert [(p["name"], p["attempts"], p["correct"]) for p in data["problems"]] == [("19_ReLU", 2, True)]
    assert [r[3] for r in attempts(db)] == ["compile_error", "accepted"]
    assert len(fake_llm.completions) == 2


def test_bad_input_is_a_message_not_a_traceback(tmp_path):
    db = tmp_path / "k.db"
    not_problem = tmp_path / "notes.py"
    not_problem.write_text("x = 1\n")
    text = tmp_path / "problem.txt"
    text.write_text("Model")
    empty = tmp_path / "empty"
    empty.mkdir()
    mixed = level(tmp_path, seeded=(), bare=("21_Sigmoid",))
    (mixed / "broken.py").write_text("def get_inputs(:\n")
    with Archive.create(tmp_path / "plain.db") as archive:
        archive.start_run({"settings": {"tasks": ["rms_norm"]}, "llm": None})
    cases = [
        (["bench", "kernelbench", str(tmp_path / "missing"), "--db", str(db)], "no such file or folder"),
        (["bench", "kernelbench", str(not_problem), "--db", str(db)], "needs `Model`"),
        (["bench", "kernelbench", str(text), "--db", str(db)], "not a KernelBench problem"),
        (["bench", "kernelbench", str(empty), "--db", str(db)], "no task files"),
        (["bench", "kernelbench", str(mixed), "--db", str(db)], "1 file(s) are not KernelBench problems"),
        (["bench", "kernelbench", "--db", str(db)], "no problems"),
        (["bench", "kernelbench", str(mixed), "--max-attempts", "0", "--db", str(db)], "--max-attempts"),
        (["bench", "kernelbench", "--resume", "1", "--db", str(db)], "no archive"),
        (["bench", "kernelbench", "--resume", "1", "--db", str(tmp_path / "plain.db")], "not a benchmark run"),
        (["bench", "kernelbench", str(mixed), "--resume", "1", "--db", str(tmp_path / "plain.db")],
         "only --max-attempts"),
        (["bench", "report", "1", "--db", str(tmp_path / "plain.db")], "not a benchmark run"),
        (["bench", "report", "7", "--db", str(tmp_path / "plain.db")], "no run 7"),
    ]
    for args, words in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output and "Traceback" not in result.output, (args, result.output)
    assert not db.exists()  # nothing was started


def test_a_benchmark_times_only_the_public_size_and_a_plain_run_times_hidden_shapes_too(resumed_benchmark, tmp_path,
                                                                                        monkeypatch):
    """KernelBench ranks at each problem's default size, so a benchmark run's judges check the
    hidden shapes but do not time them, not even in an audit (each would cost a timed batch and
    two baselines on the GPU); a resumed benchmark keeps that, and a plain run of the same file
    times them in its audits."""
    # the benchmark, its resume and a second benchmark of the same files
    assert [r.exit_code for r in (resumed_benchmark.first, resumed_benchmark.resumed, resumed_benchmark.second)] == [0] * 3
    seen = list(resumed_benchmark.seen)
    Recording(monkeypatch, seen)
    problem = str(resumed_benchmark.folder / "19_ReLU.py")
    plain = invoke("run", "--task", problem, "--db", str(tmp_path / "plain.db"), "--max-attempts", "1")
    assert plain.exit_code == 0, plain.output
    assert seen == ["never", "never", "never", "audit"]
