"""BufferPool: one contiguous allocation, per-class free lists, ownership checks, stats; batched copies."""
from __future__ import annotations

import pytest
import torch

from mlsyskit.tools.offload.copy_kernels import batched_copy, cupy_available
from mlsyskit.tools.offload.memory import ALIGN, BufferPool, OwnershipError, PoolExhaustedError, aligned_empty


def make_pool():
    return BufferPool({100: 3, 5000: 2, 70_000: 1}, name="test")


def test_slots_are_aligned_disjoint_views_of_one_arena():
    pool = make_pool()
    assert pool.stats.allocations == 1
    base, end = pool.arena.data_ptr(), pool.arena.data_ptr() + pool.arena.numel()
    spans = []
    for size in (100, 100, 100, 5000, 5000, 70_000):
        slot = pool.acquire(size, owner=f"t{len(spans)}")
        ptr = slot.data.data_ptr()
        assert ptr % ALIGN == 0 and base <= ptr and ptr + slot.capacity <= end
        assert slot.data.untyped_storage().data_ptr() == pool.arena.untyped_storage().data_ptr()
        spans.append((ptr, ptr + slot.capacity))
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert pool.capacity_bytes == 3 * 4096 + 2 * 8192 + 73_728


def test_acquire_picks_smallest_fitting_class_and_counts_hits_misses():
    pool = make_pool()
    a = pool.acquire(80, "a")
    assert a.size_class == 100
    b = pool.acquire(4000, "b")
    assert b.size_class == 5000
    assert pool.try_acquire(80_000, "c") is None  # larger than every class
    with pytest.raises(PoolExhaustedError, match="the largest class is 70000 B"):
        pool.acquire(80_000, "c")
    pool.acquire(100, "d"), pool.acquire(100, "e")
    f = pool.acquire(100, "f")  # class 100 is full: spills to the next class that has room
    assert f.size_class == 5000
    assert pool.try_acquire(100, "g", exact=True) is None
    s = pool.stats
    assert (s.hits, s.misses) == (5, 3)
    assert s.slots_in_use == 5 and s.bytes_in_use == 3 * 4096 + 2 * 8192
    assert pool.free_count(100) == 0 and pool.free_count(5000) == 0 and pool.free_count(70_000) == 1


def test_ownership_checks():
    pool, other = make_pool(), make_pool()
    slot = pool.acquire(10, "owner")
    with pytest.raises(OwnershipError, match="held by 'owner', not 'thief'"):
        pool.release(slot, "thief")
    with pytest.raises(OwnershipError, match="belongs to pool"):
        other.release(slot, "owner")
    pool.release(slot, "owner")
    with pytest.raises(OwnershipError, match="released twice"):
        pool.release(slot, "owner")
    with pytest.raises(ValueError, match="owner must not be None"):
        pool.acquire(10, None)


def test_zero_allocations_after_warm_up_slots_are_reused():
    pool = make_pool()
    seen = {}
    for step in range(50):
        held = [pool.acquire(size, (step, i)) for i, size in enumerate((100, 100, 3000, 60_000))]
        for slot in held:
            seen.setdefault(id(slot), slot.data.data_ptr())
            assert seen[id(slot)] == slot.data.data_ptr()
        for i, slot in enumerate(held):
            pool.release(slot, (step, i))
    assert len(seen) == 4  # the same four slot objects every step
    assert pool.stats.allocations == 1 and pool.stats.misses == 0 and pool.stats.hits == 200
    assert pool.stats.bytes_in_use == 0 and pool.stats.peak_bytes_in_use == 2 * 4096 + 8192 + 73_728


def test_typed_views_share_memory():
    pool = make_pool()
    slot = pool.acquire(5000, "w")
    w = slot.view(torch.float32, (25, 50))
    w.fill_(2.0)
    assert slot.data[:4].view(torch.float32).item() == 2.0
    with pytest.raises(ValueError, match="does not fit"):
        slot.view(torch.float64, (2000,))


def test_bad_config_and_pinning_default():
    with pytest.raises(ValueError, match="must be positive"):
        BufferPool({0: 1})
    pool = BufferPool({10: 1})
    assert pool.pinned == torch.cuda.is_available()
    t = aligned_empty(123)
    assert t.numel() == 123 and t.data_ptr() % ALIGN == 0


def test_batched_copy_cpu_fallback():
    srcs = [torch.randn(n) for n in (1, 7, 300)] + [torch.arange(5, dtype=torch.int16)]
    dsts = [torch.empty_like(s) for s in srcs]
    path = batched_copy(dsts, srcs)
    assert path == "foreach"
    assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
    # different dtypes of the same byte size go byte-for-byte through the loop
    src, dst = torch.randn(8), torch.empty(16, dtype=torch.bfloat16)
    assert batched_copy([dst], [src]) == "loop"
    assert torch.equal(dst.view(torch.float32), src)
    with pytest.raises(ValueError, match="segment 0 copies 32 bytes into 16"):
        batched_copy([torch.empty(4)], [torch.empty(8)])


@pytest.mark.gpu
def test_pinned_pool_and_cupy_batched_copy_host_to_device_and_back():
    host = BufferPool({4096: 4, 1 << 20: 2}, name="pinned")
    assert host.pinned
    dev = BufferPool({4096: 4, 1 << 20: 2}, device="cuda", name="device")
    sizes = [100, 4096, 1000, (1 << 20) - 3]
    hs = [host.acquire(n, i) for i, n in enumerate(sizes)]
    ds = [dev.acquire(n, i) for i, n in enumerate(sizes)]
    for i, s in enumerate(hs):
        s.data[: sizes[i]].copy_(torch.randint(0, 256, (sizes[i],), dtype=torch.uint8))
    path = batched_copy([d.data[:n] for d, n in zip(ds, sizes, strict=True)],
                        [h.data[:n] for h, n in zip(hs, sizes, strict=True)])
    assert path == ("cupy" if cupy_available() else "foreach")
    torch.cuda.synchronize()
    for d, h, n in zip(ds, hs, sizes, strict=True):
        assert torch.equal(d.data[:n].cpu(), h.data[:n])
    back = [torch.empty(n, dtype=torch.uint8).pin_memory() for n in sizes]
    stream = torch.cuda.Stream()
    batched_copy(back, [d.data[:n] for d, n in zip(ds, sizes, strict=True)], stream=stream)
    stream.synchronize()
    assert all(torch.equal(b, h.data[:n]) for b, h, n in zip(back, hs, sizes, strict=True))
