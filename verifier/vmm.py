"""GPU memory two processes share: CUDA's virtual memory management, handed over as a descriptor.

The trusted side creates physical device memory (``cuMemCreate``), maps it into its own address
space and exports it as a POSIX file descriptor; the candidate's worker receives the descriptor
over a Unix socket, imports it and maps the same bytes. The trusted side then reads what the
candidate's kernels wrote, and writes the candidate's inputs, with no copy and without believing
anything the candidate's process says about them. File descriptors, unlike CUDA's legacy IPC
handles, work across PID namespaces and containers.

Only the driver library (``libcuda.so.1``) through ctypes: the driver calls act on the calling
thread's current context, which is torch's primary context once torch has touched the device.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
CU_MEM_LOCATION_TYPE_DEVICE = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1


class VMMError(Exception):
    """A driver call for shared device memory failed (unsupported device, bad descriptor, no memory)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_lock = threading.Lock()
_driver: Any = None


def _cu() -> Any:
    global _driver
    with _lock:
        if _driver is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as err:
                raise VMMError(f"the CUDA driver library is not loadable: {err}") from None
            u64, size_t, p = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.POINTER
            sigs = {
                "cuMemGetAllocationGranularity": [p(size_t), p(_AllocationProp), ctypes.c_int],
                "cuMemCreate": [p(u64), size_t, p(_AllocationProp), u64],
                "cuMemRelease": [u64],
                "cuMemAddressReserve": [p(u64), size_t, size_t, u64, u64],
                "cuMemAddressFree": [u64, size_t],
                "cuMemMap": [u64, size_t, size_t, u64, u64],
                "cuMemUnmap": [u64, size_t],
                "cuMemSetAccess": [u64, size_t, p(_AccessDesc), size_t],
                "cuMemExportToShareableHandle": [ctypes.c_void_p, u64, ctypes.c_int, u64],
                "cuMemImportFromShareableHandle": [p(u64), ctypes.c_void_p, ctypes.c_int],
                "cuGetErrorName": [ctypes.c_int, p(ctypes.c_char_p)],
            }
            for name, args in sigs.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
            _driver = lib
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _cu().cuGetErrorName(result, ctypes.byref(name))
        raise VMMError(f"{what} failed: {(name.value or b'?').decode()} ({result})")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


def granularity(device: int) -> int:
    """The allocation size every shared block is rounded up to (2 MiB on Hopper)."""
    value = ctypes.c_size_t(0)
    prop = _prop(device)
    _check(_cu().cuMemGetAllocationGranularity(ctypes.byref(value), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
           "cuMemGetAllocationGranularity")
    return int(value.value)


@dataclass
class Shared:
    """One block of device memory mapped into this process (``ptr`` .. ``ptr + size``)."""

    handle: int
    ptr: int
    size: int
    device: int
    closed: bool = False

    def export(self) -> int:
        """A new file descriptor for this block, to hand to another process (the caller closes it)."""
        fd = ctypes.c_int(-1)
        _check(_cu().cuMemExportToShareableHandle(ctypes.byref(fd), self.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle")
        return int(fd.value)

    def tensor(self) -> Any:
        """The whole block as a flat ``uint8`` tensor on the device (no copy)."""
        import torch

        return torch.as_tensor(_DeviceBytes(self), device=f"cuda:{self.device}")

    def close(self) -> None:
        """Unmap and release; the memory lives on while another process still holds it."""
        if self.closed:
            return
        self.closed = True
        cu = _cu()
        cu.cuMemUnmap(self.ptr, self.size)
        cu.cuMemAddressFree(self.ptr, self.size)
        cu.cuMemRelease(self.handle)


class _DeviceBytes:
    """What ``torch.as_tensor`` reads to wrap raw device memory (CUDA array interface v3); the
    tensor keeps this object, and so the mapping's owner, alive."""

    def __init__(self, block: Shared):
        self._block = block
        self.__cuda_array_interface__ = {"shape": (block.size,), "typestr": "|u1", "data": (block.ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def _map(handle: int, size: int, device: int) -> Shared:
    cu = _cu()
    ptr = ctypes.c_ulonglong(0)
    _check(cu.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "cuMemAddressReserve")
    try:
        _check(cu.cuMemMap(ptr.value, size, 0, handle, 0), "cuMemMap")
        access = _AccessDesc()
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(cu.cuMemSetAccess(ptr.value, size, ctypes.byref(access), 1), "cuMemSetAccess")
    except VMMError:
        cu.cuMemUnmap(ptr.value, size)
        cu.cuMemAddressFree(ptr.value, size)
        raise
    return Shared(handle=handle, ptr=int(ptr.value), size=size, device=device)


def create(size: int, device: int) -> Shared:
    """New device memory of at least ``size`` bytes (rounded up to the granularity), mapped here."""
    grain = granularity(device)
    size = max(grain, -(-int(size) // grain) * grain)
    handle = ctypes.c_ulonglong(0)
    prop = _prop(device)
    _check(_cu().cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), 0), f"cuMemCreate of {size} bytes")
    try:
        return _map(int(handle.value), size, device)
    except VMMError:
        _cu().cuMemRelease(handle.value)
        raise


def open_fd(fd: int, size: int, device: int) -> Shared:
    """Map memory another process exported as ``fd`` (``size`` as that process said; a size
    larger than the memory fails in the driver, never reads beyond it)."""
    handle = ctypes.c_ulonglong(0)
    _check(_cu().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(int(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           "cuMemImportFromShareableHandle")
    try:
        return _map(int(handle.value), int(size), device)
    except VMMError:
        _cu().cuMemRelease(handle.value)
        raise
