"""CPU Adam on cached fp32 optimizer state (master weight, gradient, Adam m and v).

The optimizer-state cache is a size-class `BufferPool` on the CPU whose slots hold 4 fp32 tensors
(layout: master | m | v | grad; only the first three are persisted). Slot counts per class follow the
same formula as the parameter pools (pools.class_slots) on the state budget. Walking the optimizer
order (the order gradients become ready, from the profile), states get a permanent slot while the
class has slots beyond its rotation reserve; the rest live on NVMe and rotate through the reserved
slots. With read-ahead (tencache) the next NVMe-homed state of a class is read as soon as a rotation
slot is written back, so it is resident before its gradient arrives; without it (baselines) a state is
read synchronously when its gradient arrives. A state access that finds its state not yet resident
is an optimizer-state miss.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from mlsyskit.core.filetier import FileTier
from mlsyskit.core.memory import BufferPool, Slot
from mlsyskit.tools.offload.pools import BudgetError, class_slots


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0


def adam_update(master: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int,
                cfg: AdamConfig) -> None:
    """One AdamW step in place, vectorised; `grad` is used as scratch afterwards (no allocation)."""
    if cfg.weight_decay:
        master.mul_(1.0 - cfg.lr * cfg.weight_decay)
    m.mul_(cfg.beta1).add_(grad, alpha=1.0 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1.0 - cfg.beta2)
    bias1 = 1.0 - cfg.beta1 ** step
    bias2 = 1.0 - cfg.beta2 ** step
    torch.sqrt(v, out=grad)
    grad.div_(math.sqrt(bias2)).add_(cfg.eps)
    master.addcdiv_(m, grad, value=-cfg.lr / bias1)


@dataclass
class StateStats:
    accesses: int = 0
    misses: int = 0
    wait_s: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(eq=False)
class _Rotation:
    slot: Slot
    holder: int | None = None
    dirty: bool = False
    future: Future | None = None


@dataclass
class _Class:
    numel: int
    rotation: list[_Rotation] = field(default_factory=list)
    nvme_order: list[int] = field(default_factory=list)


class OptimizerStateCache:
    """fp32 state for every parameter: permanent CPU slots first, NVMe overflow through rotation slots."""

    def __init__(self, numels: dict[int, int], order: list[int], budget: int, nvme: FileTier | None, *,
                 read_ahead: bool, rotation: int = 3, workers: int = 4) -> None:
        self.numels = numels
        self.order = order
        self.nvme = nvme
        self.read_ahead = read_ahead
        self.stats = StateStats()
        sizes = {i: 16 * n for i, n in numels.items()}
        dist: dict[int, int] = {}
        for s in sizes.values():
            dist[s] = dist.get(s, 0) + 1
        slots = class_slots(dist, budget, tier="optimizer-state (CPU)")
        self.pool = BufferPool(slots, name="optimizer-state")
        self.home: dict[int, Slot] = {}
        self.classes: dict[int, _Class] = {}
        reserve: dict[int, int] = {}
        for s, c in dist.items():
            n = slots.get(s, 0)
            # small states are read in quick succession: give their classes a deeper rotation (cheap)
            depth = max(rotation, min(16, c // 8))
            reserve[s] = 0 if n >= c else min(depth, n)
            self.classes[s] = _Class(numel=s // 16)
        placed: dict[int, int] = {}
        for idx in order:
            s = sizes[idx]
            if placed.get(s, 0) < slots.get(s, 0) - reserve[s]:
                self.home[idx] = self.pool.acquire(s, owner=idx, exact=True)
                placed[s] = placed.get(s, 0) + 1
            else:
                self.classes[s].nvme_order.append(idx)
        for s, cls in self.classes.items():
            if cls.nvme_order:
                if nvme is None:
                    raise BudgetError(f"optimizer states of {len(cls.nvme_order)} tensors do not fit the CPU budget "
                                      f"and no --nvme-dir was given")
                cls.rotation = [_Rotation(self.pool.acquire(s, owner=("rotation", s, i), exact=True))
                                for i in range(reserve[s])]
        self.class_of = sizes
        self._io = ThreadPoolExecutor(workers, thread_name_prefix="tencache-opt") if self.nvme_homed else None

    @property
    def nvme_homed(self) -> int:
        return sum(len(c.nvme_order) for c in self.classes.values())

    # -- views ----------------------------------------------------------------------------------------
    def _views(self, slot: Slot, numel: int) -> tuple[torch.Tensor, ...]:
        flat = slot.view(torch.float32, (4 * numel,))
        return tuple(flat[i * numel:(i + 1) * numel] for i in range(4))  # master, m, v, grad

    def initialize(self, idx: int, master: torch.Tensor, m: torch.Tensor | None = None,
                   v: torch.Tensor | None = None) -> None:
        """Set a tensor's state (fp32 master, optionally m and v; zeros otherwise), before training."""
        numel = self.numels[idx]
        if idx in self.home:
            views = self._views(self.home[idx], numel)
        else:
            rot = self.classes[self.class_of[idx]].rotation[0]
            self._wait(rot)
            self._write_back(rot)
            views = self._views(rot.slot, numel)
        views[0].copy_(master.reshape(-1))
        for view, src in ((views[1], m), (views[2], v)):
            view.zero_() if src is None else view.copy_(src.reshape(-1))
        if idx not in self.home:
            self.nvme.write(f"s{idx}", rot.slot.data, 12 * numel)
            rot.holder, rot.dirty = idx, False

    # -- per-step protocol ------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Read ahead the first NVMe-homed states of each class (tencache only)."""
        if not self.read_ahead:
            return
        for cls in self.classes.values():
            for rot, idx in zip(cls.rotation, cls.nvme_order, strict=False):
                if rot.holder != idx:
                    self._swap_async(rot, idx, cls.numel)

    def get(self, idx: int) -> tuple[torch.Tensor, ...]:
        """(master, m, v, grad) views for `idx`, resident on the CPU; counts hits and misses."""
        self.stats.accesses += 1
        numel = self.numels[idx]
        if idx in self.home:
            return self._views(self.home[idx], numel)
        cls = self.classes[self.class_of[idx]]
        rot = next((r for r in cls.rotation if r.holder == idx), None)
        if rot is None or (rot.future is not None and not rot.future.done()):
            self.stats.misses += 1
            t0 = time.perf_counter()
            if rot is None:
                rot = min(cls.rotation, key=lambda r: self._distance(cls, r.holder, idx))
                self._swap_async(rot, idx, numel)
            self._wait(rot)
            self.stats.wait_s += time.perf_counter() - t0
        else:
            self._wait(rot)
        return self._views(rot.slot, numel)

    def put(self, idx: int) -> None:
        """The optimizer is done with `idx`: NVMe-homed state is dirty; with read-ahead, swap in the next one."""
        if idx in self.home:
            return
        cls = self.classes[self.class_of[idx]]
        rot = next(r for r in cls.rotation if r.holder == idx)
        rot.dirty = True
        if self.read_ahead:
            held = {r.holder for r in cls.rotation}
            pos = cls.nvme_order.index(idx)
            upcoming = [i for i in cls.nvme_order[pos + 1:] if i not in held]
            if upcoming:
                self._swap_async(rot, upcoming[0], cls.numel)
            else:
                self._swap_async(rot, None, cls.numel)  # last of the step: write back now

    def flush(self) -> None:
        """Wait for all I/O and write every dirty state back (before a checkpoint or at shutdown)."""
        for cls in self.classes.values():
            for rot in cls.rotation:
                self._wait(rot)
                self._write_back(rot)

    def export(self, idx: int, out: torch.Tensor) -> None:
        """Copy master|m|v (3*numel fp32) of `idx` into `out` (call flush() first)."""
        numel = self.numels[idx]
        if idx in self.home:
            out.copy_(self.home[idx].view(torch.float32, (4 * numel,))[:3 * numel])
        else:
            self.nvme.read_into(f"s{idx}", out)

    # -- rotation slot I/O ----------------------------------------------------------------------------
    def _distance(self, cls: _Class, holder: int | None, idx: int) -> int:
        """Rotation victim choice: an empty slot, else the holder whose next use is farthest."""
        if holder is None:
            return -(1 << 62)
        order = cls.nvme_order
        return -((order.index(holder) - order.index(idx)) % len(order))

    def _swap_async(self, rot: _Rotation, incoming: int | None, numel: int) -> None:
        prev, out = rot.future, (rot.holder if rot.dirty else None)
        rot.holder, rot.dirty = incoming, False

        def swap() -> None:
            if prev is not None:
                prev.result()
            if out is not None:
                self.nvme.write(f"s{out}", rot.slot.data, 12 * numel)
            if incoming is not None:
                self.nvme.read_into(f"s{incoming}", rot.slot.data)

        self.stats.bytes_written += 12 * numel if out is not None else 0
        self.stats.bytes_read += 12 * numel if incoming is not None else 0
        rot.future = self._io.submit(swap)

    def _wait(self, rot: _Rotation) -> None:
        if rot.future is not None:
            fut, rot.future = rot.future, None
            fut.result()

    def _write_back(self, rot: _Rotation) -> None:
        if rot.dirty and rot.holder is not None:
            numel = self.numels[rot.holder]
            self.nvme.write(f"s{rot.holder}", rot.slot.data, 12 * numel)
            self.stats.bytes_written += 12 * numel
            rot.dirty = False

    def close(self) -> None:
        if self._io is not None:
            for cls in self.classes.values():
                for rot in cls.rotation:
                    self._wait(rot)
            self._io.shutdown(wait=True)
