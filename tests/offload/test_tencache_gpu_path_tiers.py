"""The GPU path's storage pieces, checked on the CPU (issue 10 item 5): asynchronous device->NVMe eviction
with read-after-write ordering, pinned pools that page-lock exactly what they use, and the batching plan
of small copies."""
from __future__ import annotations

import gc
import random
import threading

import pytest
import torch

from mlsyskit.tools.offload import memory
from mlsyskit.tools.offload.copy_kernels import batched_copy, plan_batches, segment_table
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.memory import BufferPool, PoolError, aligned_empty
from mlsyskit.tools.offload.tiers import BATCH_SEGMENTS, DEVICE, NVME, SMALL_COPY, Entry, TierStore


# -- asynchronous device -> NVMe ----------------------------------------------------------------------
class GatedTier(FileTier):
    """A file tier whose writes wait for `gate` (bounded, so a wrong test fails instead of hanging) and
    which logs when writes finish and reads start."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.gate = threading.Event()
        self.log: list[tuple[str, str]] = []

    def write(self, key, buf, length=None):
        if not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        n = super().write(key, buf, length)
        self.log.append(("written", key))
        return n

    def read_into(self, key, buf):
        self.log.append(("read", key))
        return super().read_into(key, buf)


def _one_entry_store(tmp_path, numel=5000) -> tuple[TierStore, GatedTier, Entry]:
    p = torch.nn.Parameter(torch.zeros(numel, dtype=torch.bfloat16))
    e = Entry(0, "w", p, p.shape, p.dtype, numel * 2)
    tier = GatedTier(tmp_path)
    st = TierStore([e], device=torch.device("cpu"), device_slots={e.nbytes: 1}, cpu_slots={e.nbytes: 1},
                   nvme=tier)
    return st, tier, e


def _put_on_device(st: TierStore, e: Entry, values: torch.Tensor) -> None:
    e.dev = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
    e.dev.view(e.dtype, e.shape).copy_(values)
    e.where = DEVICE


def test_async_eviction_returns_at_once_and_a_later_read_waits_for_the_write(tmp_path):
    st, tier, e = _one_entry_store(tmp_path)
    values = torch.arange(5000, dtype=torch.bfloat16)
    _put_on_device(st, e, values)
    st.device_to_nvme(e, sync=False)  # the gate is closed: a synchronous write would block here
    assert e.where == NVME and not e.pending.done()
    assert st.dev_pool.free_count(e.nbytes) == 0  # the slot is the write's source until it completes
    buf = aligned_empty(e.nbytes)
    read = st.blocks.read(e, buf, sync=False)  # a read issued while the write is in flight
    assert not read.done()
    tier.gate.set()
    read.result(timeout=30)
    assert torch.equal(buf.view(torch.bfloat16), values)
    assert tier.log == [("written", e.key), ("read", e.key)]
    st.settle(e)
    assert st.dev_pool.free_count(e.nbytes) == 1 and e.dev is None
    assert torch.equal(st.read_home(e), values)
    st.close()


def test_an_unordered_read_would_see_the_old_block(tmp_path):
    """The attacker: a read submitted straight to the file tier's pool runs while the newer write still
    waits, and returns the old bytes; the store's ordered read returns the new ones."""
    st, tier, e = _one_entry_store(tmp_path)
    tier.gate.set()
    _put_on_device(st, e, torch.ones(5000, dtype=torch.bfloat16))
    st.device_to_nvme(e, sync=True)  # version 1 on NVMe
    tier.gate.clear()
    st.nvme_to_cpu(e, st.cpu_pool.acquire(e.nbytes, e.idx, exact=True))
    st.settle(e)
    st.cpu_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
    st.settle(e)
    st.device_view(e).fill_(3.0)
    st.device_to_nvme(e, sync=False)  # version 2, queued behind the gate
    stale_buf, ordered_buf = aligned_empty(e.nbytes), aligned_empty(e.nbytes)
    tier.submit_read(e.key, stale_buf).result(timeout=30)
    ordered = st.blocks.read(e, ordered_buf, sync=False)
    tier.gate.set()
    ordered.result(timeout=30)
    assert torch.equal(stale_buf.view(torch.bfloat16), torch.ones(5000, dtype=torch.bfloat16))
    assert torch.equal(ordered_buf.view(torch.bfloat16), torch.full((5000,), 3.0, dtype=torch.bfloat16))
    st.settle(e)
    st.close()


# -- pinned pools: exactly one registration of exactly the bytes used ---------------------------------
class FakeCudart:
    """Records cudaHostRegister/Unregister calls instead of page-locking."""

    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.calls: list[tuple] = []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 (the CUDA runtime's name)
        self.calls.append(("register", ptr, size, flags))
        return self.rc

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return 0


@pytest.fixture
def fake_cudart(monkeypatch) -> FakeCudart:
    fake = FakeCudart()
    monkeypatch.setattr(memory, "_cuda_runtime", lambda: fake)
    return fake


def test_pinned_pool_registers_its_capacity_once_not_a_power_of_two(fake_cudart):
    classes = {5000: 3, 70_000: 2, 3 << 20: 1}  # odd sizes: 8 KiB, 72 KiB, 3 MiB strides
    pool = BufferPool(classes, pin=True)
    expected = 3 * 8192 + 2 * 73728 + (3 << 20)
    assert pool.capacity_bytes == expected and expected & (expected - 1)  # not a power of two
    assert fake_cudart.calls == [("register", pool.arena.data_ptr(), expected, 0)]
    assert pool.arena.data_ptr() % 4096 == 0
    ptr = pool.arena.data_ptr()
    del pool
    gc.collect()
    assert fake_cudart.calls[-1] == ("unregister", ptr)


@pytest.mark.parametrize("nbytes", [1, 4095, 4097, 123_457])
def test_aligned_pinned_buffer_registers_exactly_its_bytes(fake_cudart, nbytes):
    t = aligned_empty(nbytes, pin=True)
    assert t.numel() == nbytes and t.data_ptr() % 4096 == 0
    assert fake_cudart.calls == [("register", t.data_ptr(), nbytes, 0)]


def test_a_failed_registration_is_an_error_naming_the_size(monkeypatch):
    monkeypatch.setattr(memory, "_cuda_runtime", lambda: FakeCudart(rc=2))
    with pytest.raises(PoolError, match="cudaHostRegister of 12288 bytes failed"):
        BufferPool({10_000: 1}, pin=True)


def test_unpinned_pool_never_touches_the_cuda_runtime(fake_cudart):
    BufferPool({5000: 2}, pin=False)
    assert fake_cudart.calls == []


# -- batching plan of small copies --------------------------------------------------------------------
def test_plan_groups_consecutive_copies_within_the_limits():
    assert plan_batches([100] * 5, max_segments=2, max_bytes=10_000) == [[0, 1], [2, 3], [4]]
    assert plan_batches([3000, 3000, 5000, 20_000, 10], max_segments=8, max_bytes=8000) == [[0, 1], [2], [3], [4]]
    assert plan_batches([], max_segments=4, max_bytes=10) == []
    with pytest.raises(ValueError):
        plan_batches([1], max_segments=0, max_bytes=10)


@pytest.mark.parametrize("seed", range(5))
def test_plan_covers_every_copy_once_in_order_within_limits(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([2, 64, 4096, 60_000, 70_000, 300_000]) for _ in range(rng.randrange(1, 400))]
    batches = plan_batches(sizes, max_segments=17, max_bytes=256 * 1024)
    assert [i for b in batches for i in b] == list(range(len(sizes)))
    for b in batches:
        assert len(b) <= 17
        assert len(b) == 1 or sum(sizes[i] for i in b) <= 256 * 1024


@pytest.mark.parametrize("seed", range(3))
def test_batched_copies_of_a_plan_equal_per_tensor_copies_and_the_table_names_the_slots(seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    sizes = [rng.randrange(1, SMALL_COPY + 1) for _ in range(40)]
    src_pool = BufferPool({n: 1 for n in sizes}, name="src")  # one slot per distinct size
    srcs_by_size = {n: src_pool.acquire(n, n, exact=True).data[:n] for n in set(sizes)}
    for t in srcs_by_size.values():
        t.copy_(torch.randint(0, 256, (t.numel(),), dtype=torch.uint8, generator=g))
    srcs = [srcs_by_size[n] for n in sizes]
    batched = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    single = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
    base = src_pool.arena.data_ptr()
    for batch in plan_batches(sizes, max_segments=BATCH_SEGMENTS, max_bytes=256 * 1024):
        dsts, parts = [batched[i] for i in batch], [srcs[i] for i in batch]
        batched_copy(dsts, parts)
        table = segment_table(dsts, parts)
        assert table.shape == (3, len(batch))
        for col, i in enumerate(batch):  # one row per segment: source offset in its arena, target, bytes
            slot_offset = srcs[i].data_ptr() - base
            assert int(table[0, col]) == base + slot_offset and slot_offset % 4096 == 0
            assert int(table[1, col]) == batched[i].data_ptr() and int(table[2, col]) == sizes[i]
    for d, s in zip(single, srcs, strict=True):
        d.copy_(s)
    assert all(torch.equal(a, b) for a, b in zip(batched, single, strict=True))
