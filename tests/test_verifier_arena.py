"""The shared arena on the CPU (a memfd both processes map), the trusted layout's slots, and the
heap's segment allocator (the GPU's, tested here on plain numbers)."""

from __future__ import annotations

import os

import torch
import pytest

from kernforge.verifier.arena import Arena, ArenaFull, Layout, Slots
from kernforge.verifier.heap import Region
from kernforge.verifier.messages import TensorRef


@pytest.fixture
def pair():
    a = Arena.create(Layout(1 << 20, 1 << 19), "cpu")
    b = Arena.open(a.export(), a.layout, "cpu")
    yield a, b
    a.close()
    b.close()


def test_both_sides_see_the_same_bytes(pair):
    a, b = pair
    x = torch.randn(5, 3, dtype=torch.bfloat16)
    ref = a.place(Slots(0, a.layout.input_bytes), x)
    assert torch.equal(b.view(ref), x)
    b.view(ref).mul_(2)
    assert torch.equal(a.view(ref), x * 2)


def test_strided_views_and_refs_round_trip(pair):
    a, b = pair
    base = a.slot(Slots(4096, 8192), "float32", [4, 6])
    full = a.view(base)
    full.copy_(torch.arange(24, dtype=torch.float32).view(4, 6))
    col = full.t()[1:3]  # a non-contiguous view
    ref = b.ref_of(b.view(base).t()[1:3])
    assert ref is not None and ref.strides == [1, 6]
    assert torch.equal(a.view(ref), col)


def test_refs_outside_the_arena_are_refused(pair):
    a, _ = pair
    with pytest.raises(ValueError, match="outside"):
        a.view(TensorRef(offset=(1 << 20) - 4, dtype="float32", shape=[2], strides=[1]))
    with pytest.raises(ValueError, match="multiple"):
        a.view(TensorRef(offset=2, dtype="float32", shape=[1], strides=[1]))
    assert a.ref_of(torch.zeros(4)) is None  # a tensor elsewhere has no place in it


def test_slots_are_aligned_and_bounded():
    s = Slots(0, 4096)
    first, second = s.take(10), s.take(10)
    assert first == 0 and second == 512
    with pytest.raises(ArenaFull):
        s.take(4096)
    s.reset()
    assert s.take(4096) == 0


def test_a_short_descriptor_is_refused(pair):
    import os

    a, _ = pair
    fd = a.export()
    with pytest.raises(ArenaFull):
        Arena.open(fd, Layout(2 << 20, 0), "cpu")
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by open, as documented


def test_heap_region_first_fit_and_coalescing():
    r = Region(0, 64 << 20)
    big = r.alloc(3 << 20)
    small = r.alloc(100)
    page = r.alloc(2 << 20)
    assert big == 0 and small == 3 << 20 and page % (2 << 20) == 0
    assert r.contains(small, 100) and not r.contains(64 << 20, 1)
    for p in (big, page, small):
        r.free(p)
    assert r.in_use() == 0 and r.alloc(64 << 20) == 0  # everything coalesced back into one block
    assert r.alloc(1) is None  # full: no address, never an exception inside torch's allocator


def _arena_descriptors() -> list[int]:
    """This process's open descriptors of an arena's memory."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kernforge-arena" in os.readlink(f"/proc/self/fd/{name}"):
                found.append(int(name))
        except OSError:
            pass
    return found


def test_no_descriptor_of_the_arena_stays_open_where_it_is_mapped():
    """The candidate's worker maps the arena it is handed and keeps no descriptor of it: with one,
    its code could resize the memory under the reference worker's mapping."""
    owner = Arena.create(Layout(1 << 16, 4096), "cpu")
    try:
        before = set(_arena_descriptors())  # the owner's own
        opened = Arena.open(owner.export(), Layout(1 << 16, 4096), "cpu")
        assert set(_arena_descriptors()) == before
        opened.data[:8] = 7
        assert owner.data[:8].tolist() == [7] * 8  # still the same bytes
    finally:
        owner.close()


def test_the_arena_cannot_be_resized_through_a_descriptor_of_it():
    owner = Arena.create(Layout(1 << 16, 4096), "cpu")
    fd = owner.export()
    try:
        for size in (0, 4096, 1 << 20):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        assert os.fstat(fd).st_size == 1 << 16
        owner.data[-1] = 3  # the owner's mapping is whole
        assert int(owner.data[-1]) == 3
    finally:
        os.close(fd)
        owner.close()
