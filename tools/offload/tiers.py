"""The three tiers and the moves between them; policies decide, this module only moves bytes.

Every parameter tensor (its bf16 compute copy) is an `Entry` with exactly one authoritative location:
"device", "cpu" or "nvme". A move starts asynchronously and records a future plus what to release
when it completes; `settle` waits for it and releases the source slot, `reap` settles finished moves
without waiting. While a move is in flight both slots stay held, so no slot is reused early.

Device tier: a `BufferPool` on the CUDA GPU, or, on a CPU-only machine, a budgeted arena in host memory
labelled "emulated device". Copies between CPU and device run on a side stream with one event per copy
(streams.py: a module waits on its own tensors' events, never on the whole side stream), or on a copy
thread for the emulated device. Copies of small tensors (<= 64 KiB) to the device are queued and launched
together by `flush_copies` (one batched kernel for many tensors, copy_kernels.plan_batches). CPU tier: a
`BufferPool` (pinned with CUDA). NVMe tier: `mlsyskit.tools.offload.filetier.FileTier` (O_DIRECT, checksums,
thread pool), one block per chunk of a tensor (tier_blocks.py: a large tensor is read and written as
several blocks in flight at once; a read waits for a write of its block still in flight). A tensor moves
from NVMe straight into its device slot (`nvme_to_device`: on the emulated device the blocks are read
into the slot itself, no CPU slot and no copy; on a GPU through a reused pinned staging buffer), so the
CPU tier need not hold any tensor; a device resident evicted to NVMe goes through the same staging
buffer on a GPU, asynchronously unless `sync`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mlsyskit.tools.offload.copy_kernels import plan_batches
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.memory import BufferPool, Slot, aligned_empty
from mlsyskit.tools.offload.stealing import StealingPool
from mlsyskit.tools.offload.streams import Mover, QueuedCopy, StreamOps, ThreadCopy
from mlsyskit.tools.offload.tier_blocks import BlockIO

DEVICE, CPU, NVME = "device", "cpu", "nvme"
REMOTE = "remote"  # another rank owns the tensor (shards.py): no slot or block here
SMALL_COPY = 64 * 1024  # bytes: device copies up to this size are batched
BATCH_SEGMENTS = 256  # most tensors in one batched launch
BATCH_BYTES = 4 << 20  # most bytes in one batched launch


class _DoneFuture:
    """A move that already happened (synchronous path)."""

    def done(self) -> bool:
        return True

    def result(self) -> None:
        return None


@dataclass(eq=False)
class Entry:
    idx: int
    name: str
    param: nn.Parameter
    shape: torch.Size
    dtype: torch.dtype
    nbytes: int
    where: str = CPU
    dev: Slot | None = None
    cpu: Slot | None = None
    fresh: torch.Tensor | None = None  # device copy from a fresh allocation (on-demand baseline)
    pending: Any = None
    on_done: Callable[[], None] | None = None
    last_use: int = 0
    bound: bool = False
    trainable: bool = True
    view_refs: int = 0  # live views of the tensor's storage returned to the model (they keep it held)

    @property
    def key(self) -> str:
        return f"p{self.idx}"


@dataclass
class MoveStats:
    bytes: Counter = field(default_factory=Counter)  # (src, dst) -> bytes
    allocations: int = 0

    def add(self, src: str, dst: str, n: int) -> None:
        self.bytes[f"{src}->{dst}"] += n


class TierStore:
    """Pools, movers and entries; the primitive moves every policy is built from."""

    def __init__(self, entries: list[Entry], *, device: torch.device, device_slots: dict[int, int] | None,
                 cpu_slots: dict[int, int], nvme: FileTier | None, streams: StreamOps | None = None) -> None:
        self.entries = entries
        self.device = device
        self.emulated = device.type != "cuda"
        self.dev_pool = (BufferPool(device_slots, device=device, name="emulated device" if self.emulated else "device")
                         if device_slots is not None else None)
        self.cpu_pool = BufferPool(cpu_slots, name="cpu")
        self.nvme = nvme
        self.blocks = BlockIO(nvme, entries) if nvme is not None else None
        self.mover = Mover(device, streams)
        self.stats = MoveStats()
        self.inflight: set[Entry] = set()
        self._queued: list[tuple[QueuedCopy, torch.Tensor, torch.Tensor]] = []  # small copies for the next batch
        self.queued_idx: list[int] = []  # the entries whose copies are queued, in order
        self._staging: dict[int, list[torch.Tensor]] = {}  # free pinned staging buffers per size (device<->NVMe)
        # device<->NVMe moves through streams (a GPU) wait for their device<->host copy: off this thread
        self._spill_io = (StealingPool(2, "tencache-spill")
                          if self.mover.streams is not None else None)
        # an unbound parameter points at an empty tensor of its own dtype: any use outside the tracked
        # forward fails loudly (shape mismatch) instead of reading another tensor's bytes
        self.placeholders = {dt: torch.empty(0, dtype=dt, device=device) for dt in {e.dtype for e in entries}}
        # during backward, autograd's AccumulateGrad reads the parameter's shape and strides (never its
        # data: backward reads parameters only through saved references); an unbound parameter then points
        # at a NaN-filled shape stand-in, so a read that should not happen poisons the loss instead of
        # silently using another tensor's bytes
        largest: dict[torch.dtype, int] = {}
        for e in entries:
            largest[e.dtype] = max(largest.get(e.dtype, 0), e.shape.numel())
        self.standins = {dt: torch.full((n,), float("nan"), dtype=dt, device=device) for dt, n in largest.items()}
        self.in_backward = False

    # -- binding the parameter to its device storage -------------------------------------------------
    def device_view(self, e: Entry) -> torch.Tensor:
        if e.fresh is not None:
            return e.fresh
        if e.dev is None:
            raise RuntimeError(f"tensor {e.name} is not on the device")
        return e.dev.view(e.dtype, e.shape)

    def bind(self, e: Entry) -> None:
        e.param.data = self.device_view(e)
        e.bound = True

    def unbind(self, e: Entry) -> None:
        if self.in_backward:
            e.param.data = self.standins[e.dtype][:e.shape.numel()].view(e.shape)
        else:
            e.param.data = self.placeholders[e.dtype]
        e.bound = False

    def set_backward(self, on: bool) -> None:
        """Enter or leave backward: unbound parameters get (or lose) their shape stand-ins."""
        self.in_backward = on
        for e in self.entries:
            if not e.bound:
                self.unbind(e)

    def ready_on_device(self, e: Entry) -> bool:
        return e.where == DEVICE and (e.pending is None or e.pending.done())

    def ready_for_compute(self, e: Entry) -> bool:
        """True when e is on the device and compute may use it: a copy still arriving is consumed (the
        compute stream waits on that copy's own event, no host wait; the source slot is released when
        the copy is reaped). False when e is elsewhere."""
        if e.where != DEVICE:
            return False
        if e.pending is not None:
            e.pending.consume()
        return True

    # -- completion -------------------------------------------------------------------------------------
    def _start(self, e: Entry, where: str, fut: Any, on_done: Callable[[], None] | None) -> None:
        if e.pending is not None:
            raise RuntimeError(f"tensor {e.name} already has a move in flight")
        e.where, e.pending, e.on_done = where, fut, on_done
        self.inflight.add(e)

    def settle(self, e: Entry) -> None:
        """Wait for `e`'s move (re-raising its storage error) and release the source slot."""
        if e.pending is None:
            return
        fut, done = e.pending, e.on_done
        e.pending, e.on_done = None, None
        self.inflight.discard(e)
        fut.result()
        if done is not None:
            done()

    def reap(self) -> None:
        for e in [e for e in self.inflight if e.pending.done()]:
            self.settle(e)

    def drain(self) -> None:
        self.flush_copies()
        for e in list(self.inflight):
            self.settle(e)

    def flush_copies(self) -> None:
        """Launch the queued small copies, grouped by copy_kernels.plan_batches (one launch per batch)."""
        queued, self._queued = self._queued, []
        self.queued_idx = []
        if not queued:
            return
        for batch in plan_batches([d.numel() for _, d, _ in queued], max_segments=BATCH_SEGMENTS,
                                  max_bytes=BATCH_BYTES):
            copy = self.mover.copy([queued[i][1] for i in batch], [queued[i][2] for i in batch])
            for i in batch:
                queued[i][0].copy = copy

    # -- moves ------------------------------------------------------------------------------------------
    def _expect(self, e: Entry, where: str, *, nvme: bool = False) -> None:
        """A move starts only from a settled tensor in the expected tier (a policy bug otherwise)."""
        if e.where != where or e.pending is not None:
            raise RuntimeError(f"cannot move {e.name}: it is {'moving to ' if e.pending else 'on '}{e.where}, "
                               f"not settled on {where}")
        if nvme and self.nvme is None:
            raise RuntimeError(f"cannot move {e.name} to or from NVMe: no NVMe directory")

    def place(self, e: Entry, tier: str, data: torch.Tensor) -> None:
        """Before training: put e's compute copy (`data`, its bytes) in `tier`, taking a slot there."""
        if tier == DEVICE and self.dev_pool is not None:
            e.dev = self.dev_pool.acquire(e.nbytes, e.idx, exact=True)
            e.dev.data[:e.nbytes].copy_(data)
        elif tier in (CPU, DEVICE):
            e.cpu = self.cpu_pool.acquire(e.nbytes, e.idx, exact=True)
            e.cpu.data[:e.nbytes].copy_(data)
            tier = CPU
        else:
            self.blocks.write(e, data.contiguous())
        e.where = tier

    def nvme_to_cpu(self, e: Entry, slot: Slot) -> None:
        self._expect(e, NVME, nvme=True)
        e.cpu = slot
        self.stats.add(NVME, CPU, e.nbytes)
        self._start(e, CPU, self.blocks.read(e, slot.data, sync=False), None)

    def nvme_to_device(self, e: Entry, slot: Slot) -> None:
        """Read e's blocks into its device slot: on the emulated device straight into the slot (host memory);
        on a GPU into a reused pinned staging buffer, then one copy on the side stream (a spill thread waits)."""
        self._expect(e, NVME, nvme=True)
        e.dev = slot
        self.stats.add(NVME, DEVICE, e.nbytes)
        if self._spill_io is None:
            self._start(e, DEVICE, self.blocks.read(e, slot.data, sync=False), None)
            return
        staging = self._take_staging(e.nbytes)

        def read() -> None:
            self.blocks.read(e, staging)
            self.mover.copy([slot.data[:e.nbytes]], [staging]).result()

        self._start(e, DEVICE, ThreadCopy(self._spill_io.submit(read)),
                    lambda: self._staging[e.nbytes].append(staging))

    def cpu_to_nvme(self, e: Entry, *, sync: bool = False) -> None:
        self._expect(e, CPU, nvme=True)
        slot = e.cpu

        def release() -> None:
            self.cpu_pool.release(slot, e.idx)
            e.cpu = None

        self.stats.add(CPU, NVME, e.nbytes)
        self._start(e, NVME, self.blocks.write(e, slot.data, sync=sync) or _DoneFuture(), release)
        if sync:
            self.settle(e)

    def cpu_to_device(self, e: Entry, slot: Slot) -> None:
        self._expect(e, CPU)
        src, e.dev = e.cpu, slot

        def release() -> None:
            self.cpu_pool.release(src, e.idx)
            e.cpu = None

        self.stats.add(CPU, DEVICE, e.nbytes)
        dst, data = slot.data[:e.nbytes], src.data[:e.nbytes]
        if e.nbytes <= SMALL_COPY:
            queued = QueuedCopy(self.flush_copies)
            self._queued.append((queued, dst, data))
            self.queued_idx.append(e.idx)
            self._start(e, DEVICE, queued, release)
        else:
            self._start(e, DEVICE, self.mover.copy([dst], [data]), release)

    def device_to_cpu(self, e: Entry, slot: Slot) -> None:
        self._expect(e, DEVICE)
        src, e.cpu = e.dev, slot
        self.unbind(e)

        def release() -> None:
            self.dev_pool.release(src, e.idx)
            e.dev = None

        self.stats.add(DEVICE, CPU, e.nbytes)
        self._start(e, CPU, self.mover.copy([slot.data[:e.nbytes]], [src.data[:e.nbytes]]), release)

    def device_to_nvme(self, e: Entry, *, sync: bool = True) -> None:
        """Write a device resident straight to NVMe, asynchronously unless `sync`. With streams (a GPU) the
        slot is copied on the side stream into a reused pinned staging buffer of its size, and a spill
        thread writes the buffer once the copy's event completes; the emulated arena is aligned host
        memory, so the file tier reads the slot itself. The device slot and the buffer are released when
        the write settles."""
        self._expect(e, DEVICE, nvme=True)
        self.unbind(e)
        slot = e.dev
        staging = self._take_staging(e.nbytes) if self._spill_io is not None else None

        def release() -> None:
            self.dev_pool.release(slot, e.idx)
            e.dev = None
            if staging is not None:
                self._staging[e.nbytes].append(staging)

        self.stats.add(DEVICE, NVME, e.nbytes)
        if staging is None:
            fut: Any = self.blocks.write(e, slot.data, sync=sync) or _DoneFuture()
        else:
            self.blocks.await_writes(e)
            copy = self.mover.copy([staging], [slot.data[:e.nbytes]])

            def write() -> None:
                copy.result()  # the device->host copy has landed in the staging buffer
                self.blocks.write(e, staging)

            fut = _DoneFuture() if sync else self._spill_io.submit(write)
            if sync:
                write()
        self._start(e, NVME, fut, release)
        if sync:
            self.settle(e)

    def _take_staging(self, nbytes: int) -> torch.Tensor:
        """A free pinned buffer of `nbytes`; made on first need, then reused (in-flight evictions per class
        are bounded by the policy, so the number made is too)."""
        free = self._staging.setdefault(nbytes, [])
        if free:
            return free.pop()
        self.stats.allocations += 1
        return aligned_empty(nbytes, pin=torch.cuda.is_available())

    # -- writing or reading the compute copy wherever it lives (after an update outside a module's use) --
    def write_home(self, e: Entry, values: torch.Tensor, scratch: torch.Tensor, *, non_blocking: bool = False,
                   lo: int = 0) -> Any:
        """Store `values` (flat, any float dtype) as elements [lo, lo + len(values)) of e's compute copy in its
        current tier (on NVMe: whole chunks); `scratch` (>= the bytes written, free memory) stages the cast for
        an NVMe write, so nothing is allocated. `non_blocking` (values in pinned memory): a device copy is
        enqueued on the compute stream and its event returned; `values` must stay untouched until it
        completes. Otherwise None: the write is done."""
        self.settle(e)
        hi = lo + values.numel()
        if e.fresh is not None or e.where == DEVICE:
            dst = e.fresh.view(-1) if e.fresh is not None else e.dev.view(e.dtype, (e.shape.numel(),))
            dst[lo:hi].copy_(values, non_blocking=non_blocking)
            ops = self.mover.streams
            return ops.record(ops.compute) if non_blocking and ops is not None else None
        if e.where == CPU:
            e.cpu.view(e.dtype, (e.shape.numel(),))[lo:hi].copy_(values)
        else:
            size = e.nbytes // e.shape.numel()
            stage = scratch.reshape(-1).view(torch.uint8)[:(hi - lo) * size]
            stage.view(e.dtype).copy_(values)
            self.blocks.write(e, stage, lo=lo * size, hi=hi * size)
            self.stats.add(CPU, NVME, (hi - lo) * size)
        return None

    def read_home(self, e: Entry, out: torch.Tensor | None = None) -> torch.Tensor:
        """e's compute copy in `out` (uint8, >= e.nbytes bytes) or a new tensor (handing frozen parameters back)."""
        self.settle(e)
        buf = aligned_empty(e.nbytes) if out is None else out
        if e.fresh is not None or e.where == DEVICE:
            src = e.fresh if e.fresh is not None else e.dev.data[:e.nbytes]
            buf[:e.nbytes].copy_(src.reshape(-1).view(torch.uint8))
        elif e.where == CPU:
            buf[:e.nbytes].copy_(e.cpu.data[:e.nbytes])
        else:
            self.blocks.read(e, buf)
        return buf[:e.nbytes].view(e.dtype).view(e.shape)

    def occupancy(self) -> dict[str, int]:
        return {tier: sum(e.nbytes for e in self.entries if e.where == tier) for tier in (DEVICE, CPU, NVME)}

    def close(self) -> None:
        self.drain()
        self.mover.close()
        if self._spill_io is not None:
            self._spill_io.shutdown(wait=True)
