"""The judge's checks are pipelined (the candidate computes the next call while the reference
worker compares the last one): the pipeline must not change what is revealed or decided.

* hidden shapes are sent only once every public check passed, even with a call sent ahead;
* a rejection part-way leaves no reference behind in the reference worker;
* every verdict carries its time breakdown, and output files are reused, two per output.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import candidates as C
import pytest
from kernforge.loop.evaluate import open_judge
from kernforge.tasks.loader import load_task
from kernforge.verifier import tensorio
from kernforge.verifier.judge import Judge, JudgeOptions

TASKS = Path(__file__).parent / "tasks"

#: Right on T=4 (the first public shape); from T=8 (the second) the last row is never written.
WRONG_ON_SECOND_PUBLIC = C.with_forward(
    "        return norm(x, w, rows=x.shape[0] if x.shape[0] == 4 else x.shape[0] - 1)")


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    options = JudgeOptions(cpu_timing_reps=1, cache_dir=tmp_path_factory.mktemp("cache"))
    with open_judge("cpu", pool_size=1, options=options) as j:
        yield j


@pytest.fixture
def sent(monkeypatch):
    """(shape, hidden) of every check sent to the candidate's worker, in order."""
    seen: list[tuple[dict, bool]] = []
    original = Judge._send
    hidden_shapes = [s.as_dict() for s in load_task(TASKS / "tiny_norm").shapes("cpu", hidden=True)]

    def recording(self, session, msg):
        if msg.get("op") == "check" and msg.get("repeat", True):
            seen.append((msg["shape"], msg["shape"] in hidden_shapes))
        return original(self, session, msg)

    monkeypatch.setattr(Judge, "_send", recording)
    return seen


def test_hidden_shapes_never_sent_after_a_public_failure(judge, sent):
    verdict = judge.verify(WRONG_ON_SECOND_PUBLIC, load_task(TASKS / "tiny_norm"))
    assert not verdict.accepted
    assert "public shape T=8" in verdict.reason, verdict.reason
    assert sent and not any(hidden for _, hidden in sent), sent
    assert judge._live_refs == set(), "a rejection left references in the reference worker"


def test_honest_kernel_checks_every_shape_in_order_and_reports_its_time(judge, sent):
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    task = load_task(TASKS / "tiny_norm")
    expected = [(s.as_dict(), hidden) for hidden in (False, True) for s in task.shapes("cpu", hidden=hidden)
                for _ in task.distributions]
    assert sent == expected
    phases = verdict.environment["phase_seconds"]
    for step in ("worker.check", "ref.reference", "ref.compare", "worker.time", "worker.check:write", "ref.compare:read"):
        assert step in phases and phases[step] >= 0, phases
    assert sum(v for k, v in phases.items() if ":" not in k) <= verdict.environment["verify_seconds"] + 0.05
    assert judge._live_refs == set()


def test_checked_outputs_alternate_between_two_files(judge, monkeypatch):
    """Each checked call's outputs go to one of two files per output, alternating, so the
    candidate writes one while the reference worker reads the other and the files are reused
    (kept mapped) rather than piling up, one per call."""
    compared: list[str] = []
    original = Judge._ask_ref

    def spying(self, msg, timeout=None):
        if msg.get("op") == "compare" and isinstance(msg["files"][0], dict) and "/out_" in msg["files"][0]["file"]:
            compared.append(Path(msg["files"][0]["file"]).name)
        return original(self, msg, timeout)

    monkeypatch.setattr(Judge, "_ask_ref", spying)
    verdict = judge.verify(C.HONEST, load_task(TASKS / "tiny_norm"))
    assert verdict.accepted, verdict.reason
    assert len(compared) > 4 and set(compared) == {"out_s0_0.bin", "out_s1_0.bin"}, compared
    assert all(a != b for a, b in itertools.pairwise(compared)), compared


# ---- tensor files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "uint8"])
@pytest.mark.parametrize("shape", [(3, 5), (0, 4), (7,)])
def test_tensor_file_round_trip(tmp_path, dtype, shape):
    import torch

    t = (torch.randn(shape) * 10).to(getattr(torch, dtype))
    meta = tensorio.write_tensor(tmp_path / "t.bin", t)
    assert meta["nbytes"] == t.numel() * t.element_size()
    back = tensorio.read_tensor(tmp_path / "t.bin", expect_dtype=dtype, expect_shape=list(shape))
    assert back.dtype == t.dtype and torch.equal(back, t)


def test_tensor_file_of_a_view_is_written_contiguously(tmp_path):
    import torch

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[:, 1:4].t()  # neither contiguous nor starting at the storage's beginning
    tensorio.write_tensor(tmp_path / "v.bin", view)
    assert torch.equal(tensorio.read_tensor(tmp_path / "v.bin"), view)


def test_tensor_file_cut_short_is_refused(tmp_path):
    import torch

    path = tmp_path / "t.bin"
    tensorio.write_tensor(path, torch.ones(64))
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(tensorio.TensorFileError, match="do not match"):
        tensorio.read_tensor(path)


def test_tensor_file_rewritten_in_place_and_recreated_when_replaced(tmp_path):
    """A kept mapping is reused while the file is the same and large enough; a file removed or
    cut short meanwhile is written afresh, never through a stale mapping."""
    import torch

    path = tmp_path / "o.bin"
    tensorio.write_tensor(path, torch.zeros(1000))
    inode = path.stat().st_ino
    tensorio.write_tensor(path, torch.arange(1000, dtype=torch.float32))
    assert path.stat().st_ino == inode
    assert torch.equal(tensorio.read_tensor(path), torch.arange(1000, dtype=torch.float32))
    path.unlink()
    tensorio.write_tensor(path, torch.ones(1000))
    assert torch.equal(tensorio.read_tensor(path), torch.ones(1000))
    size = path.stat().st_size
    tensorio.write_tensor(path, torch.full((7, 3), 2.0, dtype=torch.bfloat16))  # smaller: the file keeps its pages
    assert path.stat().st_size == size
    back = tensorio.read_tensor(path, expect_dtype="bfloat16", expect_shape=[7, 3])
    assert torch.equal(back, torch.full((7, 3), 2.0, dtype=torch.bfloat16))
    tensorio.write_tensor(path, torch.full((3000,), 3.0))  # larger: the file grows
    assert path.stat().st_size > size
    assert torch.equal(tensorio.read_tensor(path, expect_shape=[3000]), torch.full((3000,), 3.0))
    with open(path, "r+b") as f:  # cut short behind the writer's back: mapped afresh, never past the end
        f.truncate(100)
    tensorio.write_tensor(path, torch.full((2000,), 4.0))
    assert torch.equal(tensorio.read_tensor(path), torch.full((2000,), 4.0))
    tensorio.release_mappings()


def test_tensor_file_never_written_through_a_link(tmp_path):
    import torch

    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"keep")
    (tmp_path / "o.bin").symlink_to(target)
    with pytest.raises(tensorio.TensorFileError, match="cannot be written"):
        tensorio.write_tensor(tmp_path / "o.bin", torch.ones(4))
    assert target.read_bytes() == b"keep"


def test_large_tensor_file_read_in_parallel_chunks(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(tensorio, "READ_CHUNK", 4096)
    t = torch.randn(50_000)
    tensorio.write_tensor(tmp_path / "big.bin", t)
    assert torch.equal(tensorio.read_tensor(tmp_path / "big.bin"), t)
    data = (tmp_path / "big.bin").read_bytes()
    tensorio.release_mappings()
    (tmp_path / "big.bin").unlink()
    (tmp_path / "big.bin").write_bytes(data[: len(data) - 5000])
    with pytest.raises(tensorio.TensorFileError, match="do not match"):
        tensorio.read_tensor(tmp_path / "big.bin")


def test_mapped_output_files_stay_within_a_memory_budget(tmp_path, monkeypatch):
    """Kept mappings count as the worker's resident memory: past the budget the least recently
    written files are unmapped, and what they hold is still read back whole."""
    import torch

    monkeypatch.setattr(tensorio, "KEEP_MAPPED_BYTES", 3 * 4096 + 2 * 4000)
    tensors = {f"f{k}.bin": torch.full((1000,), float(k)) for k in range(4)}
    for name, t in tensors.items():
        tensorio.write_tensor(tmp_path / name, t)
    kept = sorted(Path(p).name for p in tensorio._MAPPED)
    assert kept == ["f2.bin", "f3.bin"], kept
    for name, t in tensors.items():
        assert torch.equal(tensorio.read_tensor(tmp_path / name), t)
    tensorio.release_mappings()
