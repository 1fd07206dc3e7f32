"""Tensors through files without pickle: a JSON header says dtype and shape, then raw bytes.

Candidate outputs reach the judge this way. The file is written by untrusted code, so the
reader trusts nothing in it: it checks the dtype against an allow-list, that the file holds the
bytes the header promises, and the shape against what the reference produced before reading a
byte of data. Files are reused, so bytes after the data may be left from a larger output; they
are never read.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from pathlib import Path
from typing import Any

import torch

MAGIC = b"KFT1"
_HEADER_LEN = struct.Struct("<I")
MAX_HEADER = 4096

DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
        "int64", "int32", "int16", "int8", "uint8", "bool",
    )
    if hasattr(torch, name)
}


class TensorFileError(ValueError):
    """A tensor file is malformed or does not match what was expected."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write_tensor(path: Path, tensor: torch.Tensor) -> dict[str, Any]:
    """Write a contiguous copy of ``tensor``; returns the header as sent to the judge.

    Outputs of hundreds of MB are checked dozens of times per candidate, so each copy shows in
    the time to a verdict. The judge reuses a few file names per worker, and each file is kept
    mapped and rewritten in place; it only ever grows, so a smaller output leaves stale bytes
    after its own (the header says where the data ends) and no page is allocated twice. Fresh
    pages cost more than the copy itself: about 3.4 GB/s against 13 GB/s on the H200's host.
    The header is padded to one page so the data starts page-aligned."""
    name = dtype_name(tensor.dtype)
    if name not in DTYPES:
        raise TensorFileError(f"dtype {name} cannot be transferred")
    t = tensor.detach().contiguous()
    header = {"dtype": name, "shape": list(t.shape)}
    blob = json.dumps(header).encode()
    if len(blob) <= PAGE - 8:  # padded: JSON ignores trailing blanks
        blob = blob.ljust(PAGE - 8)
    nbytes = t.numel() * t.element_size()
    head = MAGIC + _HEADER_LEN.pack(len(blob)) + blob
    mapped = _mapping(Path(path), len(head) + nbytes)
    mapped.mm[: len(head)] = head
    if nbytes:  # a device tensor is copied by the driver straight into the file's pages
        mapped.data(len(head), nbytes).copy_(t.reshape(-1).view(torch.uint8))
    return {**header, "file": str(path), "nbytes": nbytes}


PAGE = 4096


class _Mapped:
    """One output file, open and mapped shared, with the identity of the file it maps."""

    def __init__(self, path: Path, size: int):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as err:  # a link or a folder where the output goes
            raise TensorFileError(f"{path.name}: cannot be written ({err.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise TensorFileError(f"{path.name}: not a regular file")
            size = max(size, info.st_size)
            if info.st_size < size:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.size, self.ident = size, (info.st_dev, info.st_ino)
        self._view: torch.Tensor | None = None

    def data(self, offset: int, nbytes: int) -> torch.Tensor:
        if self._view is None:
            self._view = torch.frombuffer(self.mm, dtype=torch.uint8)
        return self._view[offset: offset + nbytes]

    def close(self) -> None:
        self._view = None  # the mapping cannot close while a tensor still exports it
        self.mm.close()


#: least recently written first
_MAPPED: dict[str, _Mapped] = {}
KEEP_MAPPED_BYTES = 4 << 30


def _mapping(path: Path, size: int) -> _Mapped:
    """A mapping of ``path`` of at least ``size`` bytes: the one kept, unless the file was
    replaced or changed size meanwhile (touching a page past its end would kill the process)
    or is too small."""
    key = str(path)
    kept = _MAPPED.pop(key, None)
    if kept is not None:
        try:
            info = os.stat(path, follow_symlinks=False)
            same = (info.st_dev, info.st_ino) == kept.ident and stat.S_ISREG(info.st_mode) and info.st_size == kept.size
        except OSError:
            same = False
        if same and kept.size >= size:
            _MAPPED[key] = kept
            return kept
        kept.close()
    _MAPPED[key] = mapped = _Mapped(path, size)
    # Mapped pages count as the worker's resident memory, which the sandbox caps: beyond a
    # budget the least recently written files are unmapped (their pages stay in the page cache).
    while len(_MAPPED) > 1 and sum(m.size for m in _MAPPED.values()) > KEEP_MAPPED_BYTES:
        _MAPPED.pop(next(iter(_MAPPED))).close()
    return mapped


def release_mappings() -> None:
    """Unmap every kept output file (their bytes stay in the files)."""
    while _MAPPED:
        _MAPPED.popitem()[1].close()


_STAGING: dict[str, torch.Tensor] = {}


def _staging(nbytes: int) -> torch.Tensor:
    """A host buffer of ``nbytes`` for reads bound for the device: page-locked when the driver
    allows it."""
    buf = _STAGING.get("buf")
    if buf is None or buf.numel() < nbytes:
        _STAGING.pop("buf", None)
        size = max(nbytes, 1 << 20)
        try:
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:  # no pinned memory here: pageable still works, only slower
            buf = torch.empty(size, dtype=torch.uint8)
        _STAGING["buf"] = buf
    return buf[:nbytes]


def read_tensor(path: Path, *, expect_dtype: str | None = None, expect_shape: list[int] | None = None,
                max_bytes: int = 1 << 34, device: str | torch.device = "cpu") -> torch.Tensor:
    """Read a tensor file written by ``write_tensor``, validating before trusting it, onto
    ``device`` (a device copy goes through a page-locked staging buffer)."""
    device = torch.device(device)
    path = Path(path)
    try:
        # Never follow a link, never block on a FIFO, never read a device: a regular file only.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise TensorFileError(f"{path.name}: not a regular file")
        size = info.st_size
        with os.fdopen(fd, "rb") as f:
            if f.read(4) != MAGIC:
                raise TensorFileError(f"{path.name}: not a tensor file")
            (hlen,) = _HEADER_LEN.unpack(f.read(4))
            if hlen > MAX_HEADER:
                raise TensorFileError(f"{path.name}: header of {hlen} bytes")
            header = json.loads(f.read(hlen).decode())
            dtype, shape = header.get("dtype"), header.get("shape")
            if dtype not in DTYPES or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise TensorFileError(f"{path.name}: bad header {header!r}")
            if expect_dtype is not None and dtype != expect_dtype:
                raise TensorFileError(f"dtype {dtype}, expected {expect_dtype}")
            if expect_shape is not None and list(shape) != list(expect_shape):
                raise TensorFileError(f"shape {shape}, expected {expect_shape}")
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=DTYPES[dtype]).element_size()
            if nbytes > max_bytes or size < 8 + hlen + nbytes:  # bytes after the data are stale: ignored
                raise TensorFileError(f"{path.name}: {size} bytes on disk do not match {dtype}{shape}")
            host = _staging(nbytes) if device.type != "cpu" else torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                _read_exactly(f.fileno(), 8 + hlen, memoryview(host.numpy()), path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, struct.error) as err:
        raise TensorFileError(f"{path.name}: unreadable ({err})") from None
    tensor = host.view(DTYPES[dtype]).reshape(shape)
    return tensor.to(device) if device.type != "cpu" else tensor


#: reads of large files are split over threads: one thread copies page cache at a few GB/s
READ_CHUNK = 32 << 20
#: few: the candidate's worker copies its next outputs on the same cores meanwhile
READ_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))
_POOL: list[Any] = []


def _read_exactly(fd: int, offset: int, into: memoryview, path: Path) -> None:
    """Fill ``into`` from ``fd`` at ``offset``, in parallel chunks for large files (only the
    trusted reader does this: a candidate's process is never handed a thread pool)."""
    chunks = [(start, into[start: start + READ_CHUNK]) for start in range(0, len(into), READ_CHUNK)]
    if len(chunks) == 1:
        done = [_read_chunk(fd, offset, *chunks[0])]
    else:
        if not _POOL:
            from concurrent.futures import ThreadPoolExecutor

            _POOL.append(ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="kf-read"))
        done = list(_POOL[0].map(lambda c: _read_chunk(fd, offset, *c), chunks))
    if sum(done) < len(into):  # the file shrank under us: its writer is still at work, or hostile
        raise TensorFileError(f"{path.name}: ended after {sum(done)} of {len(into)} bytes")


def _read_chunk(fd: int, offset: int, start: int, chunk: memoryview) -> int:
    got = 0
    while got < len(chunk):
        n = os.preadv(fd, [chunk[got:]], offset + start + got)
        if not n:
            break
        got += n
    return got
