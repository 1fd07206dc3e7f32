"""The shared arena: memory the trusted reference worker owns and the candidate's worker maps too.

The reference worker creates it (a memfd on the CPU, CUDA device memory through vmm.py on a GPU)
and the judge hands its file descriptor to the candidate's worker. Both then address the same
bytes, so inputs the trusted side writes are the ones the candidate computes on, and the outputs
the trusted side compares are the bytes the candidate's call left in memory: no file the
candidate names, no copy it could fake, no header it could forge.

Layout (byte offsets): ``[0, input_bytes)`` is the input region, laid out by the trusted side;
``[input_bytes, size)`` is the heap. On a GPU the heap serves the candidate's torch allocations
(heap.py), so the tensors ``forward`` returns stay where they are; on the CPU it holds output slots
the trusted side lays out and the candidate's worker copies its outputs into.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any

from .messages import TensorRef

ALIGN = 512
#: madvise(2): the mapping is not copied into a forked child
MADV_DONTFORK = 10


class ArenaFull(Exception):
    """The region has no room left for what was asked (a task too large for the arena)."""


@dataclass(frozen=True)
class Layout:
    size: int
    input_bytes: int

    @property
    def heap(self) -> tuple[int, int]:
        return self.input_bytes, self.size

    def to_dict(self) -> dict[str, int]:
        return {"size": self.size, "input_bytes": self.input_bytes}


class Slots:
    """Bump allocation inside ``[start, end)``, ALIGN-aligned; ``reset`` frees everything."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        self.next = start

    def take(self, nbytes: int) -> int:
        at = -(-self.next // ALIGN) * ALIGN
        if at + nbytes > self.end:
            raise ArenaFull(f"{nbytes} bytes do not fit in [{self.start}, {self.end}) ({self.end - at} left)")
        self.next = at + max(int(nbytes), 0)
        return at

    def reset(self) -> None:
        self.next = self.start


class Arena:
    """The arena as seen from one process: a flat ``uint8`` tensor over the shared bytes."""

    def __init__(self, data: Any, layout: Layout, device: str, keep: Any = None):
        self.data, self.layout, self.device = data, layout, device
        self._keep = keep  # the mapping (mmap or vmm.Shared) that must outlive the tensor

    # ---- creating and opening ----------------------------------------------------------------
    @classmethod
    def create(cls, layout: Layout, device: str) -> "Arena":
        if device.startswith("cuda"):
            from . import vmm

            block = vmm.create(layout.size, _index(device))
            return cls(block.tensor(), Layout(block.size, layout.input_bytes), device, keep=block)
        fd = os.memfd_create("kernforge-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, layout.size)
            # its size is fixed for good: a process holding it can write its bytes, never shrink it
            # under the reference worker's mapping (whose next write would die of SIGBUS)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mapping = mmap.mmap(fd, layout.size)
        except OSError:
            os.close(fd)
            raise
        return cls(_cpu_tensor(mapping), layout, device, keep=(mapping, fd))

    @classmethod
    def open(cls, fd: int, layout: Layout, device: str) -> "Arena":
        """Map an arena another process created (``fd`` is closed here, and no descriptor of the
        arena stays open in this process: on the CPU this is the candidate's worker)."""
        if device.startswith("cuda"):
            from . import vmm

            try:
                block = vmm.open_fd(fd, layout.size, _index(device))
            finally:
                os.close(fd)
            return cls(block.tensor(), layout, device, keep=block)
        try:
            if os.fstat(fd).st_size < layout.size:
                raise ArenaFull(f"the shared memory handed over holds {os.fstat(fd).st_size} bytes, not {layout.size}")
            mapped = _Mapped(fd, layout.size)
        finally:
            os.close(fd)
        return cls(_cpu_tensor(mapped.buffer), layout, device, keep=mapped)

    def export(self) -> int:
        """A new descriptor for this arena, to hand to another process (the caller closes it)."""
        if self.device.startswith("cuda"):
            return self._keep.export()
        return os.dup(self._keep[1])

    # ---- tensors inside it --------------------------------------------------------------------
    def view(self, ref: TensorRef) -> Any:
        """The tensor ``ref`` names (no copy). ValueError if it does not lie inside the arena."""
        import torch

        problem = ref.problem(self.layout.size)
        if problem:
            raise ValueError(problem)
        dtype = getattr(torch, ref.dtype)
        if ref.numel == 0:
            return torch.empty(tuple(ref.shape), dtype=dtype, device=self.data.device)
        raw = self.data[ref.offset: ref.offset + ref.span]
        return raw.view(dtype).as_strided(tuple(ref.shape), tuple(ref.strides))

    def ref_of(self, tensor: Any) -> TensorRef | None:
        """Where ``tensor`` lies in the arena, or None if any of its bytes lie outside."""
        offset = tensor.data_ptr() - self.data.data_ptr()
        ref = TensorRef(offset=offset, dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape),
                        strides=list(tensor.stride()))
        if offset < 0 or ref.dtype not in _dtypes() or ref.problem(self.layout.size) or any(s < 0 for s in ref.strides):
            return None
        return ref

    def place(self, slots: Slots, tensor: Any) -> TensorRef:
        """Copy ``tensor`` into fresh room taken from ``slots``, keeping its strides' shape
        (a contiguous layout of the same sizes); the reference to the copy."""
        nbytes = tensor.numel() * tensor.element_size()
        offset = slots.take(nbytes)
        ref = TensorRef(offset=offset, dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape),
                        strides=_contiguous_strides(list(tensor.shape)))
        if nbytes:
            self.view(ref).copy_(tensor)
        return ref

    def slot(self, slots: Slots, dtype: str, shape: list[int]) -> TensorRef:
        """Room for a contiguous tensor (not written)."""
        from .messages import ITEMSIZE

        n = 1
        for d in shape:
            n *= d
        return TensorRef(offset=slots.take(n * ITEMSIZE[dtype]), dtype=dtype, shape=list(shape),
                         strides=_contiguous_strides(list(shape)))

    def close(self) -> None:
        keep, self._keep = self._keep, None
        self.data = None
        if keep is None:
            return
        if isinstance(keep, tuple):
            mapping, fd = keep
            _close_mapping(mapping)
            os.close(fd)
        elif isinstance(keep, _Mapped):
            pass  # mapped for the process's life (tensors may still view it)
        else:
            keep.close()


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return list(reversed(strides))


class _Mapped:
    """A shared mapping of ``size`` bytes of ``fd`` that keeps no descriptor of its own (Python's
    ``mmap.mmap`` keeps a duplicate until it is closed: in the candidate's worker that was a
    writable descriptor of the arena, in reach of the candidate's code). It is never unmapped: the
    worker maps its arena once and keeps it until it exits."""

    def __init__(self, fd: int, size: int):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mapping the arena: {os.strerror(err)}")
        # a child the worker forks does not inherit it: the red team's child, forked at each call,
        # computed the outputs with torch and wrote them into its copy of this mapping, beyond
        # every trace of the worker; without it, its results must pass through the worker
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.madvise(address, size, MADV_DONTFORK) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"keeping the arena from children: {os.strerror(err)}")
        self.buffer = (ctypes.c_uint8 * size).from_address(address)


def _close_mapping(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:  # a tensor still views it: the mapping goes when the tensor does
        pass


def _cpu_tensor(mapping: Any) -> Any:
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.frombuffer(mapping, dtype=torch.uint8)


def _index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


def _dtypes() -> Any:
    from .messages import ITEMSIZE

    return ITEMSIZE
