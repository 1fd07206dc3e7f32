"""The Triton cache seed (verifier/triton_seed.py): a pool's first warm worker's cache, copied into
the home of every later worker before it starts, so that its warm-up builds nothing again; and
what the seed refuses to take."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kernforge.sandbox import Limits, ProcessBackend, WorkerSpec
from kernforge.verifier import triton_seed
from kernforge.verifier.triton_seed import TritonSeed

sys.path.append(str(Path(__file__).resolve().parent))  # tests/ helpers (importlib import mode)
from sandbox_helpers import TESTS  # noqa: E402

LIMITS = Limits(wall_seconds=30, cpu_seconds=60, memory_bytes=1 << 30, processes=64)


def _cache(home: Path) -> Path:
    """A warm-up's cache in ``home``: a launcher, and a kernel with its group file."""
    root = home / ".triton"
    (root / "k1").mkdir(parents=True)
    (root / "k2").mkdir()
    (root / "k1" / "__triton_launcher.so").write_bytes(b"\x7fELF launcher")
    (root / "k2" / "warm.cubin").write_bytes(b"cubin")
    (root / "k2" / "__grp__warm.json").write_text(json.dumps({"child_paths": {"warm.cubin": str(root / "k2" / "warm.cubin")}}))
    return root


def _harvested(tmp_path: Path) -> TritonSeed:
    """A seed taken from a warm-up's cache (``_cache``) in ``tmp_path/first``."""
    first = tmp_path / "first"
    first.mkdir()
    _cache(first)
    seed = TritonSeed()
    seed.harvest(first)
    return seed


def test_a_seed_is_planted_with_its_group_naming_the_new_homes_files(tmp_path):
    later = tmp_path / "later"
    later.mkdir()
    _harvested(tmp_path).plant(later, None, None)
    root = later / ".triton"
    assert (root / "k1" / "__triton_launcher.so").read_bytes() == b"\x7fELF launcher"
    assert (root / "k2" / "warm.cubin").read_bytes() == b"cubin"
    group = json.loads((root / "k2" / "__grp__warm.json").read_text())
    assert group["child_paths"] == {"warm.cubin": str(root / "k2" / "warm.cubin")}  # never the first home's


def test_a_seed_is_taken_once(tmp_path):
    """The first warm worker's cache is the seed; a later worker's home is never read."""
    first, second, later = tmp_path / "first", tmp_path / "second", tmp_path / "later"
    for home in (first, second, later):
        home.mkdir()
    _cache(first)
    (_cache(second) / "k1" / "__triton_launcher.so").write_bytes(b"another")
    seed = TritonSeed()
    seed.harvest(first)
    seed.harvest(second)
    seed.plant(later, None, None)
    assert (later / ".triton" / "k1" / "__triton_launcher.so").read_bytes() == b"\x7fELF launcher"


def test_without_a_seed_a_home_is_left_as_it_is(tmp_path):
    seed = TritonSeed()
    seed.harvest(tmp_path / "no-such-home")  # no cache there: nothing taken, nothing raised
    seed.plant(tmp_path, None, None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("hostile", ["link", "fifo", "too_many", "too_large", "file_at_root"])
def test_a_cache_holding_anything_but_a_warm_ups_files_is_not_taken(tmp_path, hostile, monkeypatch):
    """Only regular files one key folder deep, never through a link, within the caps: anything
    else and nothing is taken (each worker then builds its own, as without a seed)."""
    home = tmp_path / "home"
    home.mkdir()
    root = _cache(home)
    if hostile == "link":
        (root / "k1" / "passwd.so").symlink_to("/etc/passwd")
    elif hostile == "fifo":
        os.mkfifo(root / "k1" / "pipe.so")
    elif hostile == "too_many":
        monkeypatch.setattr(triton_seed, "MAX_FILES", 2)
    elif hostile == "too_large":
        monkeypatch.setattr(triton_seed, "MAX_BYTES", 16)
    else:
        (root / "stray").write_text("x")
    seed = TritonSeed()
    seed.harvest(home)
    assert seed.files is None


def test_a_group_naming_files_elsewhere_is_left_out(tmp_path):
    home, later = tmp_path / "home", tmp_path / "later"
    home.mkdir()
    later.mkdir()
    root = _cache(home)
    (root / "k2" / "__grp__warm.json").write_text(json.dumps({"child_paths": {"warm.cubin": "/elsewhere/k2/warm.cubin"}}))
    seed = TritonSeed()
    seed.harvest(home)
    assert seed.files is not None and "k2/__grp__warm.json" not in seed.files
    seed.plant(later, None, None)
    assert not (later / ".triton" / "k2" / "__grp__warm.json").exists()  # its kernel compiles in the warm-up


def test_a_pools_later_workers_start_with_the_first_warm_workers_cache():
    """Through a real pool: the first worker builds its cache in its warm-up and is read before
    its job; the next worker's warm-up finds every file built (by the first), owned by its own
    uid, its group naming its own files, and says where its start went."""
    spec = WorkerSpec(env={"PYTHONPATH": str(TESTS)}, warmup="sandbox_jobs.cache:warm")
    with ProcessBackend(spec, pool_size=1, seed=TritonSeed()) as backend:
        assert backend.wait_warm(120) == 1  # a job asked for sooner would start a twin alongside, unseeded
        reports = []
        for _ in range(2):
            session = backend.session("sandbox_jobs.cache:report", {}, LIMITS)
            try:
                reports.append(session.recv(60))
            finally:
                session.close()
        steps = backend.start_steps()
    first, second = reports
    assert first["files"]["k1/__triton_launcher.so"] == f"built in {first['root']}"
    assert second["root"] != first["root"]
    assert second["files"] == first["files"]  # not built again
    assert set(second["owners"].values()) == {second["uid"]}
    assert second["paths"] == {"warm.cubin": f"{second['root']}/k2/warm.cubin"}
    assert second["members"] == {"warm.cubin": f"built in {first['root']}"}
    assert set(steps) == {"preload", "cache"} and all(v >= 0 for v in steps.values())


@pytest.mark.parametrize("link", [".triton", "home"])
def test_a_seed_is_never_written_through_a_link(tmp_path, link):
    """Planting goes through each folder's descriptor: a cache folder, or a home, that is a link
    to elsewhere gets nothing (the worker then builds its own), and nothing lands where it points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    seed = _harvested(tmp_path)
    if link == ".triton":
        home = tmp_path / "later"
        home.mkdir()
        (home / ".triton").symlink_to(elsewhere)
    else:
        home = tmp_path / "linked-home"
        home.symlink_to(elsewhere)
    seed.plant(home, None, None)
    assert list(elsewhere.iterdir()) == []
