"""Tensors through files without pickle: a JSON header says dtype and shape, then raw bytes.

Candidate outputs reach the judge this way. The file is written by untrusted code, so the
reader trusts nothing in it: it checks the dtype against an allow-list, the byte count against
the header, and the shape against what the reference produced before reading a byte of data.
"""

from __future__ import annotations

import json
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

    A device tensor goes through a page-locked staging buffer kept for the process, and the
    file is written straight from it: outputs of hundreds of MB are checked dozens of times per
    candidate, so each extra host copy shows in the time to a verdict."""
    name = dtype_name(tensor.dtype)
    if name not in DTYPES:
        raise TensorFileError(f"dtype {name} cannot be transferred")
    t = tensor.detach().contiguous()
    header = {"dtype": name, "shape": list(t.shape)}
    blob = json.dumps(header).encode()
    nbytes = t.numel() * t.element_size()
    with open(path, "wb") as f:
        f.write(MAGIC + _HEADER_LEN.pack(len(blob)) + blob)
        if nbytes:
            raw = t.reshape(-1).view(torch.uint8)
            if raw.device.type != "cpu":
                host = _staging(nbytes)
                host.copy_(raw)
                raw = host
            f.write(memoryview(raw.numpy()))
    return {**header, "file": str(path), "nbytes": nbytes}


_STAGING: dict[str, torch.Tensor] = {}


def _staging(nbytes: int) -> torch.Tensor:
    """A host buffer of ``nbytes`` for device copies: page-locked when the driver allows it."""
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
            if nbytes > max_bytes or size != 8 + hlen + nbytes:
                raise TensorFileError(f"{path.name}: {size} bytes on disk do not match {dtype}{shape}")
            host = _staging(nbytes) if device.type != "cpu" else torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                _read_exactly(f, memoryview(host.numpy()), path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, struct.error) as err:
        raise TensorFileError(f"{path.name}: unreadable ({err})") from None
    tensor = host.view(DTYPES[dtype]).reshape(shape)
    return tensor.to(device) if device.type != "cpu" else tensor


def _read_exactly(f: Any, into: memoryview, path: Path) -> None:
    done = 0
    while done < len(into):
        n = f.readinto(into[done:])
        if not n:  # the file shrank under us: its writer is still at work, or hostile
            raise TensorFileError(f"{path.name}: ended after {done} of {len(into)} bytes")
        done += n
