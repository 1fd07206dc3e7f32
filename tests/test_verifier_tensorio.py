"""verifier/tensorio.py: tensors through files round-trip over dtypes and odd shapes, a file cut
short or behind a link is refused, kept mappings are reused only while the file is unchanged, and
they stay within a memory budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernforge.verifier import tensorio


@pytest.fixture(autouse=True)
def _no_kept_mappings():
    """Mappings are module state: each test starts and ends with none, so the budget test sees
    only its own files."""
    tensorio.release_mappings()
    yield
    tensorio.release_mappings()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool", "uint8"])
@pytest.mark.parametrize("shape", [(3, 5), (0, 4), (7,)])
def test_tensor_file_round_trip(tmp_path, dtype, shape):
    t = (torch.randn(shape) * 10).to(getattr(torch, dtype))
    meta = tensorio.write_tensor(tmp_path / "t.bin", t)
    assert meta["nbytes"] == t.numel() * t.element_size()
    back = tensorio.read_tensor(tmp_path / "t.bin", expect_dtype=dtype, expect_shape=list(shape))
    assert back.dtype == t.dtype and torch.equal(back, t)


def test_tensor_file_of_a_view_is_written_contiguously(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[:, 1:4].t()  # neither contiguous nor starting at the storage's beginning
    tensorio.write_tensor(tmp_path / "v.bin", view)
    assert torch.equal(tensorio.read_tensor(tmp_path / "v.bin"), view)


def test_tensor_file_cut_short_is_refused(tmp_path):
    path = tmp_path / "t.bin"
    tensorio.write_tensor(path, torch.ones(64))
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(tensorio.TensorFileError, match="do not match"):
        tensorio.read_tensor(path)


def test_tensor_file_rewritten_in_place_and_recreated_when_replaced(tmp_path):
    """A kept mapping is reused while the file is the same and large enough; a file removed or
    cut short meanwhile is written afresh, never through a stale mapping."""
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


def test_tensor_file_never_written_through_a_link(tmp_path):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"keep")
    (tmp_path / "o.bin").symlink_to(target)
    with pytest.raises(tensorio.TensorFileError, match="cannot be written"):
        tensorio.write_tensor(tmp_path / "o.bin", torch.ones(4))
    assert target.read_bytes() == b"keep"


def test_large_tensor_file_read_in_parallel_chunks(tmp_path, monkeypatch):
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
    monkeypatch.setattr(tensorio, "KEEP_MAPPED_BYTES", 3 * 4096 + 2 * 4000)
    tensors = {f"f{k}.bin": torch.full((1000,), float(k)) for k in range(4)}
    for name, t in tensors.items():
        tensorio.write_tensor(tmp_path / name, t)
    kept = sorted(Path(p).name for p in tensorio._MAPPED)
    assert kept == ["f2.bin", "f3.bin"], kept
    for name, t in tensors.items():
        assert torch.equal(tensorio.read_tensor(tmp_path / name), t)
