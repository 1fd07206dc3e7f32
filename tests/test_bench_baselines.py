"""bench/baselines.py on the CPU: how many input sets the standalone torch.compile rotates over,
when the judge's compile figure and the standalone one disagree, and that without a GPU the
script and its standalone process stop with one clear line (their timing needs a GPU: on the
H200, ``bash bench/h200.sh baselines``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "baselines.py"
MiB = 1 << 20


def _load():
    spec = importlib.util.spec_from_file_location("bench_baselines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


baselines = _load()


@pytest.mark.parametrize("set_bytes, l2_bytes, sets", [
    (40 * MiB, 60 * MiB, 4),  # three sets are exactly twice the L2, not more
    (120 * MiB, 60 * MiB, 2),  # one set exactly twice the L2: a second one
    (121 * MiB, 60 * MiB, 1),
    (7 * MiB + 3, 50 * MiB, 15),
    (4096, 60 * MiB, 30721),
    (3 << 30, 60 * MiB, 1),
])
def test_the_rotation_is_the_fewest_sets_that_exceed_twice_the_l2(set_bytes, l2_bytes, sets):
    assert baselines.rotation_sets(set_bytes, l2_bytes) == sets
    assert sets * set_bytes > 2 * l2_bytes >= (sets - 1) * set_bytes


def test_the_rotation_follows_its_factor_and_refuses_an_empty_set():
    assert baselines.rotation_sets(10, 100, factor=1.0) == 11
    with pytest.raises(ValueError, match="0 bytes"):
        baselines.rotation_sets(0, 100)


def test_min_sets_gives_the_standalone_as_many_input_sets_as_the_judges_calls():
    """reshape_and_cache's 128 MB caches exceed the L2 alone, so the L2 rule rotates one set; the
    judge gives each call of a batch its own (--min-sets: the hypothesis for its 19% gap)."""
    assert baselines.rotation_sets(256 * MiB, 60 * MiB) == 1
    assert baselines.rotation_sets(256 * MiB, 60 * MiB, least=25) == 25
    assert baselines.rotation_sets(10, 100, factor=1.0, least=5) == 11, "never fewer than the L2 rule asks"
    done = subprocess.run([sys.executable, str(SCRIPT), "--min-sets", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--min-sets must be at least 1, got 0" in done.stderr


@pytest.mark.parametrize("judge_us, standalone_us, ratio, flagged", [
    (100.0, 100.0, 1.0, False),
    (95.0, 100.0, 0.95, False),
    (105.0, 100.0, 1.05, False),
    (94.0, 100.0, 0.94, True),
    (112.0, 100.0, 1.12, True),
    (None, 100.0, None, False),
    (100.0, None, None, False),
])
def test_a_judge_figure_outside_five_percent_of_the_standalone_one_is_flagged(judge_us, standalone_us, ratio, flagged):
    got_ratio, got_flagged = baselines.agreement(judge_us, standalone_us)
    assert got_ratio == pytest.approx(ratio) and got_flagged is flagged


def test_without_a_gpu_the_script_says_so_in_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU even on the H200
    done = subprocess.run([sys.executable, str(SCRIPT), "--tasks", "rms_norm"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "bench/baselines.py times baselines on a CUDA GPU, and none is visible here"


def test_without_a_gpu_the_standalone_process_reports_why(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    found = baselines.standalone("rms_norm", {"T": 1, "H": 256}, 0, timeout_s=120)
    assert found == {"error": "the standalone torch.compile needs a CUDA GPU, and none is visible here"}
