"""Torch allocations inside shared memory: a ``MemPool`` whose segments are carved from a region.

The candidate's worker routes the allocations of each checked call and of each captured CUDA
graph to this pool, so the tensors ``forward`` returns lie in memory the trusted side has mapped
too, and the trusted side reads them where they are. Torch's caching allocator still does the
fine-grained work; this module only hands it segments (a first-fit free list over the region).

This code runs in the candidate's process and is as untrusted as everything there: a candidate
that allocates elsewhere only makes its outputs unreadable to the judge, which then rejects it.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from typing import Any

#: large segments start on the GPU's 2 MiB page; small ones on 512 bytes, torch's own alignment
PAGE = 2 << 20
SMALL_ALIGN = 512

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


class Region:
    """First-fit allocation of ``[base, base + size)``; frees coalesce with their neighbours."""

    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self._starts: list[int] = [base]
        self._sizes: dict[int, int] = {base: size}
        self._used: dict[int, int] = {}
        self._lock = threading.Lock()

    def alloc(self, n: int) -> int | None:
        """The address of ``n`` free bytes, or None when none are left (torch then frees its
        cached blocks and asks again, or reports out of memory)."""
        if n <= 0:
            return None
        align = PAGE if n >= PAGE else SMALL_ALIGN
        with self._lock:
            for start in self._starts:
                length = self._sizes[start]
                at = -(-start // align) * align
                if at + n <= start + length:
                    self._take(start, length, at, n)
                    return at
        return None

    def _take(self, start: int, length: int, at: int, n: int) -> None:
        self._starts.remove(start)
        del self._sizes[start]
        for s, ln in ((start, at - start), (at + n, start + length - at - n)):
            if ln > 0:
                bisect.insort(self._starts, s)
                self._sizes[s] = ln
        self._used[at] = n

    def free(self, ptr: int) -> None:
        with self._lock:
            n = self._used.pop(ptr, None)
            if n is None:
                return
            start, end = ptr, ptr + n
            i = bisect.bisect_left(self._starts, start)
            if i > 0 and self._starts[i - 1] + self._sizes[self._starts[i - 1]] == start:  # join the left one
                i -= 1
                start = self._starts[i]
                del self._sizes[start]
                self._starts.pop(i)
            if i < len(self._starts) and self._starts[i] == end:  # and the right one
                end += self._sizes.pop(end)
                self._starts.pop(i)
            bisect.insort(self._starts, start)
            self._sizes[start] = end - start

    def free_spans(self) -> list[tuple[int, int]]:
        """(address, bytes) of each free span, lowest address first (first fit takes those)."""
        with self._lock:
            return [(start, self._sizes[start]) for start in self._starts]

    def contains(self, ptr: int, nbytes: int) -> bool:
        return self.base <= ptr and ptr + nbytes <= self.base + self.size

    def in_use(self) -> int:
        with self._lock:
            return sum(self._used.values())


class HeapPool:
    """A torch ``MemPool`` over a region of device memory this process has mapped."""

    def __init__(self, base: int, size: int):
        import torch

        region = self.region = Region(base, size)
        # The callbacks must outlive the pool (torch keeps only their addresses); they close
        # over the region, not self, so they still work while the interpreter tears down.
        self._alloc_cb = _ALLOC(lambda n, device, stream: region.alloc(int(n)))
        self._free_cb = _FREE(lambda ptr, n, device, stream: region.free(int(ptr or 0)))
        alloc_fn = ctypes.cast(self._alloc_cb, ctypes.c_void_p).value
        free_fn = ctypes.cast(self._free_cb, ctypes.c_void_p).value
        self.allocator = torch._C._cuda_customAllocator(alloc_fn, free_fn)
        self.pool = torch.cuda.MemPool(self.allocator)

    @property
    def id(self) -> Any:
        return self.pool.id

    def use(self) -> Any:
        """Context manager: this thread's torch allocations come from the region."""
        import torch

        return torch.cuda.use_mem_pool(self.pool)

    def fresh(self) -> "HeapPool":
        """Another pool over the same region, whose memory ``release`` hands back whole: torch
        keeps the blocks a pool freed cached in that pool, so memory one timed shape's batches
        used would otherwise stay out of reach of the next shape's (a different size)."""
        import copy

        import torch

        other = copy.copy(self)  # the same region, allocator and callbacks
        other.pool = torch.cuda.MemPool(self.allocator)
        return other

    def release(self) -> None:
        """Free every cached block of this pool back to the region (its tensors and graphs must
        be gone): torch empties a pool's cache once nothing uses it any more."""
        import torch

        pool, self.pool = self.pool, None
        del pool
        torch.cuda.empty_cache()
