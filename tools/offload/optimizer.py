"""CPU Adam on cached fp32 optimizer state (master weight, gradient, Adam m and v).

The optimizer-state cache is a size-class `BufferPool` on the CPU whose slots hold 4 fp32 tensors of one
chunk of a tensor (chunks.py; layout: master | m | v | grad; only the first three are persisted), so the
budget never has to hold a whole tensor's state. Slot counts per chunk size class follow the same formula
as the parameter pools (pools.class_slots) on the state budget. Walking the optimizer order (the order
gradients become ready, from the profile), chunks get a permanent slot while the class has slots beyond
its rotation reserve; the rest live on NVMe and rotate through the reserved slots. With read-ahead (tencache) the next NVMe-homed state of a class is read as soon as a rotation
slot is written back (chunk by chunk), so it is resident before its gradient arrives; without it (baselines) a state is
read synchronously when its gradient arrives. A state access that finds its state not yet resident
is an optimizer-state miss.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.offload.chunks import chunk_ranges
from mlsyskit.tools.offload.filetier import FileTier
from mlsyskit.tools.offload.memory import BufferPool, Slot
from mlsyskit.tools.offload.pools import BudgetError, class_slots
from mlsyskit.tools.offload.stealing import StealingPool, Task


class NonFiniteError(RuntimeFailure):
    """A loss, gradient, gradient norm or learning rate that is inf or NaN: training stops."""


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        values = (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)
        if not all(math.isfinite(float(x)) for x in values):
            raise NonFiniteError(f"non-finite optimizer setting (lr {self.lr}, betas ({self.beta1}, {self.beta2}), "
                                 f"eps {self.eps}, weight_decay {self.weight_decay})")
        if self.lr < 0 or not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1) or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"invalid AdamW settings: lr {self.lr} must be >= 0, betas in [0, 1), eps > 0, "
                             f"weight_decay >= 0")


def adam_update(master: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int,
                cfg: AdamConfig) -> None:
    """One AdamW step in place with torch.optim.AdamW(foreach=False)'s arithmetic; `grad` is used as
    scratch afterwards (no allocation)."""
    if cfg.weight_decay:
        master.mul_(1.0 - cfg.lr * cfg.weight_decay)
    m.lerp_(grad, 1.0 - cfg.beta1)
    v.mul_(cfg.beta2).addcmul_(grad, grad, value=1.0 - cfg.beta2)
    bias1 = 1.0 - cfg.beta1 ** step
    bias2 = 1.0 - cfg.beta2 ** step
    torch.sqrt(v, out=grad)
    grad.div_(math.sqrt(bias2)).add_(cfg.eps)
    master.addcdiv_(m, grad, value=-cfg.lr / bias1)


class HyperParams:
    """AdamW settings per tensor from the optimizer's param groups, read again at every step, so a
    torch.optim.lr_scheduler that changes a group's lr between steps is honoured."""

    def __init__(self, groups: list[dict[str, Any]], group_of: dict[int, int],
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        self.groups = groups
        self.group_of = group_of
        self.optimizer = optimizer

    @classmethod
    def fixed(cls, cfg: AdamConfig, ids: list[int]) -> HyperParams:
        group = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        return cls([group], {i: 0 for i in ids})

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer | None, trainable: dict[int, Any]) -> HyperParams:
        """`trainable`: id(Parameter) -> tensor index. Only Adam/AdamW arithmetic is supported."""
        if optimizer is None:
            return cls.fixed(AdamConfig(), list(trainable.values()))
        kind = type(optimizer).__name__
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            raise UsageError(f"optimizer {kind} is not supported: tencache runs AdamW on the CPU (use "
                             f"torch.optim.AdamW, or Adam without weight_decay)")
        group_of: dict[int, int] = {}
        for gi, group in enumerate(optimizer.param_groups):
            for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
                if group.get(flag):
                    raise UsageError(f"{kind} param group {gi}: {flag}=True is not supported")
            if isinstance(optimizer, torch.optim.Adam) and not isinstance(optimizer, torch.optim.AdamW) \
                    and group.get("weight_decay", 0):
                raise UsageError(f"Adam param group {gi}: weight_decay adds an L2 term to the gradient, which "
                                 f"tencache does not implement; use torch.optim.AdamW (decoupled decay)")
            for p in group["params"]:
                if id(p) in trainable:
                    group_of[trainable[id(p)]] = gi
        missing = [i for i in trainable.values() if i not in group_of]
        if missing:
            raise UsageError(f"{len(missing)} trainable parameters are in no param group of the optimizer; "
                             f"freeze them (requires_grad=False) or add them")
        return cls(optimizer.param_groups, group_of, optimizer)

    def step_done(self) -> None:
        """The engine finished an optimizer step: call the torch optimizer's own step() with no gradient
        set (the engine consumed them), which updates nothing but runs its step hooks and lets an
        lr_scheduler see the step (torch warns "lr_scheduler.step() before optimizer.step()" otherwise)."""
        if self.optimizer is None:
            return
        for gi, group in enumerate(self.groups):
            for p in group["params"]:
                if p.grad is not None:  # torch's step would apply it: a second, wrong update
                    raise UsageError(f"param group {gi} holds a parameter of shape {tuple(p.shape)} with a "
                                     f"gradient the engine did not consume (not a parameter of the model?)")
        self.optimizer.step()

    def snapshot(self) -> dict[int, AdamConfig]:
        """The settings of this step, validated (a non-finite lr stops training)."""
        configs = []
        for gi, g in enumerate(self.groups):
            beta1, beta2 = g.get("betas", (0.9, 0.999))
            try:
                configs.append(AdamConfig(float(g["lr"]), float(beta1), float(beta2), float(g.get("eps", 1e-8)),
                                          float(g.get("weight_decay", 0.0))))
            except NonFiniteError as e:
                raise NonFiniteError(f"param group {gi}: {e}") from None
        return {i: configs[gi] for i, gi in self.group_of.items()}


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
    holder: int | None = None  # a chunk (unit) id
    dirty: bool = False
    future: Task | None = None


@dataclass
class _Class:
    numel: int
    rotation: list[_Rotation] = field(default_factory=list)
    nvme_order: list[int] = field(default_factory=list)  # chunk ids, in optimizer order
    rank: dict[int, int] = field(default_factory=dict)  # chunk id -> its index in nvme_order


class OptimizerStateCache:
    """fp32 state for every parameter, in chunks (chunks.py): permanent CPU slots first, NVMe overflow
    through rotation slots. Callers address a chunk as (tensor idx, chunk j); `chunks(idx)` gives the
    element ranges."""

    def __init__(self, numels: dict[int, int], order: list[int], budget: int, nvme: FileTier | None, *,
                 read_ahead: bool, rotation: int = 3, workers: int = 4, persist_grad: bool = False,
                 chunk: int | None = None) -> None:
        self.numels = numels
        # fp32 values persisted per NVMe-homed state: master|m|v, plus the gradient sum when gradients
        # accumulate over several backward passes or wait for the global norm
        self.persist = 4 if persist_grad else 3
        self.order = order  # tensors, in optimizer order
        self.nvme = nvme
        self.read_ahead = read_ahead
        self.stats = StateStats()
        self._ranges = {i: chunk_ranges(n, chunk) for i, n in numels.items()}
        self.units: list[tuple[int, int, int, int]] = []  # chunk id -> (tensor idx, j, lo, hi), in optimizer order
        self._unit: dict[tuple[int, int], int] = {}
        for idx in order:
            for j, (lo, hi) in enumerate(self._ranges[idx]):
                self._unit[(idx, j)] = len(self.units)
                self.units.append((idx, j, lo, hi))
        sizes = [16 * (hi - lo) for _, _, lo, hi in self.units]
        dist: dict[int, int] = {}
        for s in sizes:
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
        for u, s in enumerate(sizes):
            if placed.get(s, 0) < slots.get(s, 0) - reserve[s]:
                self.home[u] = self.pool.acquire(s, owner=u, exact=True)
                placed[s] = placed.get(s, 0) + 1
            else:
                self.classes[s].nvme_order.append(u)
        for s, cls in self.classes.items():
            cls.rank = {u: k for k, u in enumerate(cls.nvme_order)}
            if cls.nvme_order:
                if nvme is None:
                    raise BudgetError(f"optimizer states of {len(cls.nvme_order)} chunks do not fit the CPU budget "
                                      f"and no --nvme-dir was given")
                cls.rotation = [_Rotation(self.pool.acquire(s, owner=("rotation", s, i), exact=True))
                                for i in range(reserve[s])]
        self.class_of = sizes
        self._writes: dict[int, Task] = {}  # chunk -> the swap that writes it back (latest)
        # a swap no helper has started when its chunk is needed is done by the waiting thread (stealing.py)
        self._io = StealingPool(workers, "tencache-opt") if self.nvme_homed else None

    @property
    def nvme_homed(self) -> int:
        """Chunks whose state lives on NVMe (rotating through the reserved slots)."""
        return sum(len(c.nvme_order) for c in self.classes.values())

    def chunks(self, idx: int) -> list[tuple[int, int]]:
        """The element ranges [lo, hi) of tensor `idx`'s chunks; chunk j of `get(idx, j)` is the j-th."""
        return self._ranges[idx]

    # -- views ----------------------------------------------------------------------------------------
    def _key(self, u: int) -> str:
        idx, j = self.units[u][:2]
        return f"s{idx}c{j}"

    def _numel(self, u: int) -> int:
        return self.units[u][3] - self.units[u][2]

    def _views(self, slot: Slot, numel: int) -> tuple[torch.Tensor, ...]:
        flat = slot.view(torch.float32, (4 * numel,))
        return tuple(flat[i * numel:(i + 1) * numel] for i in range(4))  # master, m, v, grad

    def initialize(self, idx: int, master: torch.Tensor, m: torch.Tensor | None = None,
                   v: torch.Tensor | None = None) -> None:
        """Set a tensor's state (fp32 master, optionally m and v; zeros otherwise), chunk by chunk, before training."""
        for j, (lo, hi) in enumerate(self._ranges[idx]):
            u = self._unit[(idx, j)]
            if u in self.home:
                views = self._views(self.home[u], hi - lo)
            else:
                rot = self.classes[self.class_of[u]].rotation[0]
                self._wait(rot)
                self._write_back(rot)
                views = self._views(rot.slot, hi - lo)
            views[0].copy_(master.reshape(-1)[lo:hi])
            for view, src in ((views[1], m), (views[2], v)):
                view.zero_() if src is None else view.copy_(src.reshape(-1)[lo:hi])
            if u not in self.home:
                self.nvme.write(self._key(u), rot.slot.data, 4 * self.persist * (hi - lo))
                rot.holder, rot.dirty = u, False

    # -- per-step protocol ------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Read ahead the first NVMe-homed chunks of each class (tencache only)."""
        if not self.read_ahead:
            return
        for cls in self.classes.values():
            wanted = cls.nvme_order[:len(cls.rotation)]
            held = {r.holder for r in cls.rotation}
            free = [r for r in cls.rotation if r.holder not in wanted]
            for u in wanted:
                if u not in held and free:  # a state already held stays where it is (one copy only)
                    self._swap_async(free.pop(0), u)

    def get(self, idx: int, j: int = 0) -> tuple[torch.Tensor, ...]:
        """(master, m, v, grad) views of chunk j of `idx`, resident on the CPU; counts hits and misses."""
        self.stats.accesses += 1
        u = self._unit[(idx, j)]
        numel = self._numel(u)
        if u in self.home:
            return self._views(self.home[u], numel)
        cls = self.classes[self.class_of[u]]
        rot = next((r for r in cls.rotation if r.holder == u), None)
        if rot is None or (rot.future is not None and not rot.future.done()):
            self.stats.misses += 1
            t0 = time.perf_counter()
            if rot is None:
                rot = min(cls.rotation, key=lambda r: self._distance(cls, r.holder, u))
                self._swap_async(rot, u)
            self._wait(rot)
            self.stats.wait_s += time.perf_counter() - t0
        else:
            self._wait(rot)
        return self._views(rot.slot, numel)

    def put(self, idx: int, j: int = 0) -> None:
        """The optimizer is done with chunk j of `idx`: NVMe-homed state is dirty; with read-ahead, swap in
        the next one."""
        u = self._unit[(idx, j)]
        if u in self.home:
            return
        cls = self.classes[self.class_of[u]]
        rot = next(r for r in cls.rotation if r.holder == u)
        rot.dirty = True
        if self.read_ahead:
            held = {r.holder for r in cls.rotation}
            upcoming = next((x for x in cls.nvme_order[cls.rank[u] + 1:] if x not in held), None)
            self._swap_async(rot, upcoming)  # None (the last of the step): write back now

    def flush(self) -> None:
        """Wait for all I/O and write every dirty state back (before a checkpoint or at shutdown)."""
        for cls in self.classes.values():
            for rot in cls.rotation:
                self._wait(rot)
                self._write_back(rot)

    def peek_chunks(self, idx: int):
        """(lo, hi, master|m|v of those elements: 3*(hi-lo) fp32) per chunk of `idx`, resident in its home or a
        rotation slot (call flush() first); each view is valid until the next peek or get."""
        for j, (lo, hi) in enumerate(self._ranges[idx]):
            u = self._unit[(idx, j)]
            numel = hi - lo
            if u in self.home:
                yield lo, hi, self.home[u].view(torch.float32, (4 * numel,))[:3 * numel]
                continue
            cls = self.classes[self.class_of[u]]
            rot = next((r for r in cls.rotation if r.holder == u), None)
            if rot is None:
                rot = cls.rotation[0]
                self._wait(rot)
                self._write_back(rot)
                self.nvme.read_into(self._key(u), rot.slot.data)
                rot.holder, rot.dirty = u, False
            self._wait(rot)
            yield lo, hi, rot.slot.view(torch.float32, (4 * numel,))[:3 * numel]

    def peek(self, idx: int) -> torch.Tensor:
        """master|m|v (3*numel fp32) of `idx` (call flush() first): a view of its slot, valid until the next peek
        or get, when the tensor is one chunk; a new tensor assembled chunk by chunk otherwise."""
        if len(self._ranges[idx]) == 1:
            return next(self.peek_chunks(idx))[2]
        numel = self.numels[idx]
        out = torch.empty(3 * numel, dtype=torch.float32)
        for lo, hi, view in self.peek_chunks(idx):  # again: each view is valid only until the next chunk
            n = hi - lo
            for k in range(3):
                out[k * numel + lo:k * numel + hi].copy_(view[k * n:(k + 1) * n])
        return out

    # -- rotation slot I/O ----------------------------------------------------------------------------
    def _distance(self, cls: _Class, holder: int | None, u: int) -> int:
        """Rotation victim choice: an empty slot, else the holder whose next use is farthest."""
        if holder is None:
            return -(1 << 62)
        return -((cls.rank[holder] - cls.rank[u]) % len(cls.nvme_order))

    def _swap_async(self, rot: _Rotation, incoming: int | None) -> None:
        prev, out = rot.future, (rot.holder if rot.dirty else None)
        rot.holder, rot.dirty = incoming, False
        # the incoming state may still be on its way out of another rotation slot: read it only after that
        # write, never a stale or half-written block (submitted earlier, so waiting on it cannot deadlock)
        writing = self._writes.get(incoming) if incoming is not None else None
        out_key = self._key(out) if out is not None else None
        in_key = self._key(incoming) if incoming is not None else None
        out_bytes = 4 * self.persist * self._numel(out) if out is not None else 0

        def swap() -> None:
            if prev is not None:
                prev.result()
            if out_key is not None:
                self.nvme.write(out_key, rot.slot.data, out_bytes)
            if writing is not None:
                writing.result()
            if in_key is not None:
                self.nvme.read_into(in_key, rot.slot.data)

        self.stats.bytes_written += out_bytes
        self.stats.bytes_read += 4 * self.persist * self._numel(incoming) if incoming is not None else 0
        rot.future = self._io.submit(swap)
        if out is not None:
            self._writes[out] = rot.future

    def _wait(self, rot: _Rotation) -> None:
        if rot.future is not None:
            fut, rot.future = rot.future, None
            fut.result()

    def _write_back(self, rot: _Rotation) -> None:
        if rot.dirty and rot.holder is not None:
            nbytes = 4 * self.persist * self._numel(rot.holder)
            self.nvme.write(self._key(rot.holder), rot.slot.data, nbytes)
            self.stats.bytes_written += nbytes
            rot.dirty = False

    def close(self) -> None:
        if self._io is not None:
            for cls in self.classes.values():
                for rot in cls.rotation:
                    self._wait(rot)
            self._io.shutdown(wait=True)
