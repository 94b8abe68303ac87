"""The GPU path's ordering, checked on the CPU with fake streams (issue 10 item 5).

`FakeStreams` implements streams.StreamOps with work that runs lazily, one enqueued operation at a time,
in an order drawn from a seeded RNG (and only when its stream's earlier work and awaited events allow),
as a GPU may run it. A read that is not ordered after its copy therefore sees stale bytes, and a copy
whose source is changed before it runs copies the new bytes: the attacker is the schedule.
"""
from __future__ import annotations

import itertools
import random
import threading
from collections import deque

import pytest
import torch

from mlsyskit.tools.offload.engine import Budgets, OffloadEngine
from mlsyskit.tools.offload.grad_pipeline import GradStager, OptimizerWorker
from mlsyskit.tools.offload.model import build_model
from mlsyskit.tools.offload.optimizer import AdamConfig, HyperParams, NonFiniteError
from mlsyskit.tools.offload.tiers import CPU, DEVICE, NVME, Entry, TierStore
from mlsyskit.tools.offload.trainer import one_step


class FakeEvent:
    def __init__(self, streams: FakeStreams, ident: int) -> None:
        self.streams, self.ident, self.complete = streams, ident, False

    def query(self) -> bool:
        return self.complete

    def synchronize(self) -> None:
        self.streams.run_until(lambda: self.complete)


class FakeStreams:
    """Lazy streams. `host_compute`: compute runs on the host as it is called (the engine's model), so a
    compute-stream wait is a host wait and a compute-stream record is complete at once; otherwise compute
    work is enqueued too (`on_compute`). Every enqueue also runs a few ready operations (seeded), so
    side-stream work progresses in the background as on a GPU."""

    compute, side = "compute", "side"

    def __init__(self, seed: int, *, host_compute: bool, progress: int = 2) -> None:
        self.rng = random.Random(seed)
        self.host_compute = host_compute
        self.progress = progress
        self.queues: dict[str, deque] = {self.compute: deque(), self.side: deque()}
        self.log: list[tuple] = []  # ("enqueue"|"run", stream, op kind, ident)
        self.lock = threading.RLock()
        self._ids = itertools.count()
        self.host_waits = 0
        self.copy_sizes: list[int] = []  # tensors per enqueued copy (a batched launch has several)

    # -- StreamOps ---------------------------------------------------------------------------------------
    def record(self, stream: str) -> FakeEvent:
        with self.lock:
            event = FakeEvent(self, next(self._ids))
            if stream == self.compute and self.host_compute:
                event.complete = True  # the host has run every compute operation issued so far
                self.log.append(("enqueue", stream, "record", event.ident))
            else:
                self._enqueue(stream, ("record", event))
            return event

    def wait(self, stream: str, event: FakeEvent) -> None:
        with self.lock:
            if stream == self.compute and self.host_compute:
                self.log.append(("enqueue", stream, "wait", event.ident))
                self.host_waits += not event.complete
                event.synchronize()
            else:
                self._enqueue(stream, ("wait", event))

    def copy(self, stream: str, dsts, srcs) -> None:
        with self.lock:
            self.copy_sizes.append(len(dsts))
            self._enqueue(stream, ("copy", list(dsts), list(srcs)))

    # -- test side -------------------------------------------------------------------------------------
    def on_compute(self, fn) -> None:
        with self.lock:
            self._enqueue(self.compute, ("call", fn))

    def _enqueue(self, stream: str, op: tuple) -> None:
        ident = op[1].ident if op[0] in ("record", "wait") else next(self._ids)
        self.queues[stream].append((op, ident))
        self.log.append(("enqueue", stream, op[0], ident))
        for _ in range(self.rng.randrange(self.progress + 1)):
            if not self._step():
                break

    def _ready(self, stream: str) -> bool:
        q = self.queues[stream]
        return bool(q) and (q[0][0][0] != "wait" or q[0][0][1].complete)

    def _step(self) -> bool:
        ready = [s for s in self.queues if self._ready(s)]
        if not ready:
            return False
        stream = self.rng.choice(ready)
        op, ident = self.queues[stream].popleft()
        kind = op[0]
        if kind == "record":
            op[1].complete = True
        elif kind == "copy":
            for d, s in zip(op[1], op[2], strict=True):
                d.copy_(s)
        elif kind == "call":
            op[1]()
        self.log.append(("run", stream, kind, ident))
        return True

    def run_until(self, done) -> None:
        with self.lock:
            while not done():
                if not self._step():
                    raise AssertionError("fake streams deadlocked: nothing can run and the wait is not over")

    def run_all(self) -> None:
        self.run_until(lambda: not any(self.queues.values()))


def _entries(n: int, numel: int) -> list[Entry]:
    out = []
    for i in range(n):
        p = torch.nn.Parameter(torch.zeros(numel, dtype=torch.bfloat16))
        out.append(Entry(i, f"t{i}", p, p.shape, p.dtype, numel * 2))
    return out


def _store(entries: list[Entry], streams: FakeStreams | None, slots: int) -> TierStore:
    sizes = {e.nbytes for e in entries}
    return TierStore(entries, device=torch.device("cpu"), device_slots={s: slots for s in sizes},
                     cpu_slots={s: slots for s in sizes}, nvme=None, streams=streams)


def _load_cpu(st: TierStore, e: Entry, values: torch.Tensor) -> None:
    e.cpu = st.cpu_pool.acquire(e.nbytes, e.idx, exact=True)
    e.cpu.view(e.dtype, e.shape).copy_(values)
    e.where = CPU


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("numel", [1000, 70_000])  # a batched small copy and a copy of its own
def test_compute_reads_a_prefetched_tensor_only_after_its_own_copy(seed, numel):
    fake = FakeStreams(seed, host_compute=False)
    entries = _entries(4, numel)
    st = _store(entries, fake, slots=4)
    seen: dict[int, torch.Tensor] = {}
    expected = {e.idx: torch.full((numel,), float(e.idx + 1), dtype=torch.bfloat16) for e in entries}
    for e in entries:
        _load_cpu(st, e, expected[e.idx])
        st.cpu_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
    st.flush_copies()
    for e in entries:
        assert st.ready_for_compute(e) and e.where == DEVICE
        view = st.device_view(e)
        fake.on_compute(lambda e=e, view=view: seen.__setitem__(e.idx, view.clone()))
    fake.run_all()
    for e in entries:
        assert torch.equal(seen[e.idx], expected[e.idx]), f"seed {seed}: compute read {e.name} before its copy"
    # the protocol as logged: each compute wait is on an event recorded on the side stream after a copy
    enq = [(s, k, i) for what, s, k, i in fake.log if what == "enqueue"]
    waits = [i for s, k, i in enq if s == "compute" and k == "wait"]
    side = [(k, i) for s, k, i in enq if s == "side"]
    for ident in waits:
        pos = side.index(("record", ident))
        assert pos > 0 and side[pos - 1][0] == "copy", "an event recorded before its copy was enqueued"
    assert len(set(waits)) == (1 if numel <= 64 * 1024 else 4)  # 4 small copies share one batched launch
    st.reap()
    st.close()


def test_without_the_event_wait_compute_sees_stale_bytes():
    """The attacker works: reading the device slot without consuming the copy's event reads old bytes for
    some seeds, so the test above would catch a missing wait."""
    stale = 0
    for seed in range(12):
        fake = FakeStreams(seed, host_compute=False)
        (e,) = _entries(1, 1000)
        st = _store([e], fake, slots=1)
        _load_cpu(st, e, torch.ones(1000, dtype=torch.bfloat16))
        slot = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
        slot.data.zero_()  # what the slot held before
        st.cpu_to_device(e, slot)
        st.flush_copies()
        got = {}
        view = st.device_view(e)
        fake.on_compute(lambda got=got, view=view: got.setdefault("v", view.clone()))  # no ready_for_compute
        fake.run_all()
        stale += not torch.equal(got["v"], torch.ones(1000, dtype=torch.bfloat16))
        st.drain()
        st.close()
    assert 0 < stale < 12


@pytest.mark.parametrize("seed", range(4))
def test_eviction_copy_waits_for_compute_that_writes_the_slot(seed):
    """A device->host copy starts only after the compute work enqueued before it (a write still queued on
    the compute stream lands in the copy); the source slot is released only when the copy completed."""
    fake = FakeStreams(seed, host_compute=False)
    (e,) = _entries(1, 3000)
    st = _store([e], fake, slots=1)
    e.dev = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
    e.where = DEVICE
    fake.on_compute(lambda: st.device_view(e).fill_(7.0))  # the last module's write, still queued
    st.device_to_cpu(e, st.cpu_pool.acquire(e.nbytes, e.idx, exact=True))
    assert st.dev_pool.free_count(e.nbytes) == 0  # held while the copy is in flight
    st.settle(e)
    assert st.dev_pool.free_count(e.nbytes) == 1
    assert torch.equal(e.cpu.view(e.dtype, e.shape), torch.full((3000,), 7.0, dtype=torch.bfloat16))
    st.close()


def _stage_and_read(seed: int, *, wait_for_copy: bool) -> dict[int, torch.Tensor]:
    """Five gradients staged through a 2-slot pool and read by the worker (with or without the copy wait)."""
    fake = FakeStreams(seed, host_compute=True)
    worker = OptimizerWorker(2)
    handbacks: list = []

    def not_reached(*_) -> None:
        raise AssertionError("the test hands slots back itself")

    stager = GradStager(fake, {2000: 5}, 2, write=not_reached)
    stager.pool.arena.view(torch.bfloat16).fill_(float("nan"))  # what a slot holds before its copy lands
    results: dict[int, torch.Tensor] = {}
    grads = [torch.full((1000,), float(i + 1), dtype=torch.bfloat16) for i in range(5)]
    try:
        for i, grad in enumerate(grads):
            while stager.pool.free_count(2000) == 0:  # the tier thread's hand-back loop, reduced
                assert worker.join() is None
                for idx, slot in handbacks:
                    stager.release(slot, idx)
                    stager.pool.arena.view(torch.bfloat16).fill_(float("nan"))
                handbacks.clear()
            buf, copy, slot = stager.stage(i, grad)

            def job(i=i, buf=buf, copy=copy, slot=slot):
                if wait_for_copy:
                    copy.result()
                results[i] = buf.clone()
                handbacks.append((i, slot))

            worker.submit(job)
        assert worker.join() is None
    finally:
        worker.close()
        fake.run_all()
    return results


@pytest.mark.parametrize("seed", range(4))
def test_gradient_staging_worker_reads_only_after_the_device_to_host_copy(seed):
    results = _stage_and_read(seed, wait_for_copy=True)
    for i in range(5):
        assert torch.equal(results[i], torch.full((1000,), float(i + 1), dtype=torch.bfloat16)), f"seed {seed}"


def test_gradient_staging_without_the_copy_wait_reads_unfinished_buffers():
    """The attacker works: a worker that skips the event reads a buffer whose copy has not run yet."""
    bad = 0
    for seed in range(8):
        results = _stage_and_read(seed, wait_for_copy=False)
        bad += sum(bool(torch.isnan(results[i].float()).any()) for i in range(5))
    assert bad > 0


def test_worker_error_stops_later_jobs_and_is_raised_once():
    worker = OptimizerWorker(1)
    ran: list[int] = []
    try:
        worker.submit(lambda: ran.append(1))
        worker.submit(lambda: (_ for _ in ()).throw(NonFiniteError("the gradient of w is not finite")))
        assert worker.join() is not None
        worker.submit(lambda: ran.append(3))
        assert worker.join() is None and ran == [1, 3]
    finally:
        worker.close()


def _engine(cfg, profile, streams) -> OffloadEngine:
    model, masters = build_model(cfg.model, cfg.seed)
    return OffloadEngine(model, masters, policy="tencache", profile=profile, streams=streams,
                         hyper=HyperParams.fixed(AdamConfig(lr=cfg.lr), list(range(len(masters)))),
                         budgets=Budgets(cfg.device_mem, cfg.cpu_mem, cfg.opt_mem, cfg.nvme_dir),
                         device=torch.device("cpu"))


def test_engine_on_fake_streams_trains_bit_identically_with_overlapped_copies(small_cfg, small_profile, tmp_path):
    """The whole engine (prefetch, batched small copies, evictions, gradient staging, the optimizer worker)
    on lazily executed fake streams gives the same losses as on the copy thread; most prefetched tensors
    were consumed on the device without a host wait."""
    losses = {}
    for name, streams in (("thread", None), ("fake", FakeStreams(3, host_compute=True))):
        engine = _engine(small_cfg, small_profile, streams)
        try:
            losses[name] = [one_step(engine, small_cfg, step)["loss"] for step in range(2)]
        finally:
            engine.close()
        if streams is not None:
            fake = streams
            waits = [i for what, s, k, i in fake.log if what == "enqueue" and s == "compute" and k == "wait"]
            assert len(waits) > 0
            assert fake.host_waits < len(waits)  # some copies had already run: overlap, not a wait per tensor
            assert max(fake.copy_sizes) > 1  # small tensors went several to a launch
    assert losses["fake"] == losses["thread"]


@pytest.mark.parametrize("seed", range(4))
def test_eviction_to_nvme_through_streams_is_async_staged_and_reuses_its_buffer(seed, tmp_path):
    """The GPU's device->NVMe path on fake streams: the device->host copy into a staging buffer waits for
    the compute work before it, the file write waits for the copy's event (on a spill thread, not the
    caller's), the block read back holds what compute last wrote, and the staging buffer is reused."""
    from mlsyskit.tools.offload.filetier import FileTier

    fake = FakeStreams(seed, host_compute=False)
    (e,) = _entries(1, 3000)
    tier = FileTier(tmp_path)
    sizes = {e.nbytes: 1}
    st = TierStore([e], device=torch.device("cpu"), device_slots=sizes, cpu_slots=sizes, nvme=tier, streams=fake)
    try:
        for round_, value in enumerate((5.0, 6.0)):
            e.dev = st.dev_pool.acquire(e.nbytes, e.idx, exact=True)
            e.where = DEVICE
            fake.on_compute(lambda v=value: st.device_view(e).fill_(v))  # still queued when eviction starts
            before = st.stats.allocations
            st.device_to_nvme(e, sync=False)
            assert e.where == NVME and st.dev_pool.free_count(e.nbytes) == 0
            st.settle(e)
            assert st.stats.allocations == before + (1 if round_ == 0 else 0)  # one staging buffer, reused
            assert st.dev_pool.free_count(e.nbytes) == 1
            assert torch.equal(st.read_home(e), torch.full((3000,), value, dtype=torch.bfloat16)), f"seed {seed}"
    finally:
        st.close()
        tier.close()


@pytest.mark.parametrize("seed", range(3))
def test_stager_short_of_slots_waits_for_hand_backs_and_retiring_writes(seed):
    """One staging slot, five gradients: each stage after the first needs the slot back, which comes from
    the worker's hand-back and then from the write-back's event (still running on the fake stream)."""
    fake = FakeStreams(seed, host_compute=True)
    worker = OptimizerWorker(2)
    written: list[tuple[int, float]] = []

    def write(entry, values, non_blocking):
        assert non_blocking  # from a pinned staging slot
        written.append((entry.idx, float(values[0])))
        event = FakeEvent(fake, -1)
        fake.on_compute(lambda: setattr(event, "complete", True))  # lazy: completes when the fake runs it
        return event

    stager = GradStager(fake, {2000: 5}, 1, write=write)
    entries = _entries(5, 1000)
    try:
        for e in entries:
            grad = torch.full((1000,), float(e.idx + 1), dtype=torch.bfloat16)
            buf, copy, slot = stager.stage(e.idx, grad)

            def job(e=e, buf=buf, copy=copy, slot=slot):
                copy.result()
                buf.mul_(10)  # "the update": the new compute copy in the slot
                stager.hand_back(e, buf, slot)

            worker.submit(job)
        assert worker.join() is None
        stager.apply(wait=True)
    finally:
        worker.close()
    assert written == [(i, 10.0 * (i + 1)) for i in range(5)]
    assert stager.pool.free_count(2000) == 1
