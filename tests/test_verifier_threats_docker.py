"""test_verifier_threats.py's runtime checks with candidates in docker containers
(``--sandbox docker``): every cheat that reaches a worker is still rejected with its class, and
honest kernels are still accepted. The static-screen tests are not repeated: those candidates are
rejected before any worker exists.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import candidates as C
import test_verifier_threats as threats
from kernforge.cli import app
from kernforge.loop.evaluate import open_judge
from kernforge.verifier.judge import JudgeOptions

pytestmark = pytest.mark.docker

test_cheat_rejected_at_runtime = threats.test_cheat_rejected_at_runtime
test_honest_kernels_accepted = threats.test_honest_kernels_accepted
test_kernelbench_reference_copy_follows_task_policy = threats.test_kernelbench_reference_copy_follows_task_policy
test_compile_error_is_reported_with_the_message = threats.test_compile_error_is_reported_with_the_message


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"))
    with open_judge("cpu", sandbox="docker", pool_size=2, options=options) as j:
        assert j.candidates.name == "docker"
        yield j


@pytest.fixture(scope="module")
def runtime_judge(tmp_path_factory):
    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), static_screen=False)
    with open_judge("cpu", sandbox="docker", pool_size=2, options=options) as j:
        yield j


def test_eval_command_runs_the_candidate_in_docker(tmp_path):
    """``kernforge eval --sandbox docker`` reaches the docker backend end to end."""
    candidate = tmp_path / "relu.py"
    candidate.write_text(C.HONEST_RELU)
    result = CliRunner().invoke(app, ["eval", str(candidate), "--task", str(threats.TASKS / "kb_relu.py"),
                                      "--sandbox", "docker", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["status"] == "accepted"


@pytest.mark.usefixtures("clean_config_env")
def test_run_command_verifies_in_docker(tmp_path, monkeypatch):
    """``kernforge run --sandbox docker``: the offline run's candidates are judged in containers."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--task", "rms_norm", "--max-attempts", "1", "--sandbox", "docker", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["status"] == "finished" and data["tasks"][0]["accepted"] == 1, data
