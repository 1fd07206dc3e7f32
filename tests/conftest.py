"""Shared fixtures. GPU tests are skipped here, in one place, when no CUDA GPU is present, and
docker tests when no Docker engine or no worker image is (CI sets KERNFORGE_REQUIRE_DOCKER,
which turns that skip into an error).

Without a GPU every Triton kernel runs under the interpreter (TRITON_INTERPRET=1), which must be
set before triton is imported anywhere.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch

# Test helper modules (candidates.py, fake_llm.py) import by name under --import-mode=importlib.
sys.path.insert(0, str(Path(__file__).resolve().parent))

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if not HAS_GPU:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    docker_items = [item for item in items if "docker" in item.keywords]
    if docker_items:
        from kernforge.sandbox.docker_probe import probe_docker

        ready, detail = probe_docker()
        if not ready:
            if os.environ.get("KERNFORGE_REQUIRE_DOCKER"):  # CI: a missing engine or image is a failure
                raise pytest.UsageError(f"KERNFORGE_REQUIRE_DOCKER is set, but {detail}")
            skip = pytest.mark.skip(reason=f"needs a Docker engine and the worker image: {detail}")
            for item in docker_items:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded():
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def quiet_host(monkeypatch):
    """The judge sees the host quiet around every sample of its clock (verifier/host_load.py), as
    on an idle machine: its clock rule uses the tight margins, so an attack on the timer is
    called the cheat it is however busy the test machine is. (On a busy host the rule accuses
    only lies larger than any wake-up: tests/test_verifier_defences.py; the attack then gains
    nothing, its time being the trusted clock's.)"""
    from kernforge.verifier import host_load

    monkeypatch.setattr(host_load, "quiet", lambda facts, cpu_count=None: True)


@pytest.fixture(scope="session")
def cpu_judge(tmp_path_factory):
    """The CPU judge (process sandbox, static screen on, two warm candidate workers) of the modules
    that only ask a judge for verdicts: one for the whole session, not one per module (each judge
    starts a reference worker and candidate workers, seconds of the CPU each, and ends with two
    warm workers never used)."""
    from kernforge.loop.evaluate import open_judge
    from kernforge.verifier.judge import JudgeOptions

    with open_judge("cpu", pool_size=2, options=JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"))) as judge:
        yield judge


@pytest.fixture(scope="session")
def cpu_runtime_judge(tmp_path_factory):
    """``cpu_judge`` with its static screen off: only the runtime defences stand."""
    from kernforge.loop.evaluate import open_judge
    from kernforge.verifier.judge import JudgeOptions

    options = JudgeOptions(cache_dir=tmp_path_factory.mktemp("cache"), static_screen=False)
    with open_judge("cpu", pool_size=2, options=options) as judge:
        yield judge


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_GPU else "cpu"


@pytest.fixture
def clean_config_env(monkeypatch, tmp_path):
    """No API key, provider, model, archive or config file from the developer's environment, and
    an empty config home: a CLI test sees only what it sets itself. A wide terminal keeps the
    CLI's messages on one line, so tests can search them."""
    from config_env import clean_config

    clean_config(monkeypatch, tmp_path)
