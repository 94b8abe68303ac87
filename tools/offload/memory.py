"""Size-class buffer pools carved from one contiguous allocation.

    pool = BufferPool({4096: 8, 65536: 2})            # size class (bytes) -> number of slots
    slot = pool.acquire(3000, owner="layer0.weight")  # smallest class that fits, from its free list
    w = slot.view(torch.float32, (750,))              # typed view over the slot's bytes, no copy
    pool.release(slot, owner="layer0.weight")         # checked: only the owner may release, once

One torch allocation is made at construction (pinned when CUDA is available and the pool lives on the
CPU); every slot is a view into it, 4096-aligned so it can be handed to the O_DIRECT file tier. After
construction nothing is allocated: `stats.allocations` stays 1 and slots are reused LIFO from per-class
free lists. A miss (no free slot in any class that fits) is counted and raises `PoolExhaustedError`
from `acquire` or returns None from `try_acquire`; the caller decides what to evict.
"""
from __future__ import annotations

import bisect
import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import torch

ALIGN = 4096


class PoolError(Exception):
    """Base class for buffer-pool errors."""


class PoolExhaustedError(PoolError):
    """No free slot in any size class that can hold the request."""


class OwnershipError(PoolError):
    """A slot released by someone who does not hold it, twice, or into the wrong pool."""


def round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def aligned_empty(nbytes: int, *, device: str | torch.device = "cpu", pin: bool = False,
                  alignment: int = ALIGN) -> torch.Tensor:
    """A uint8 tensor of `nbytes` whose first byte is `alignment`-aligned (over-allocates, then slices).
    `pin`: page-locked with cudaHostRegister over exactly these `nbytes` (see `pin_exactly`)."""
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device)
    skip = (-raw.data_ptr()) % alignment
    out = raw[skip:skip + nbytes]
    if pin and torch.device(device).type == "cpu":
        pin_exactly(out)
    return out


def _cuda_runtime():  # the CUDA runtime binding (tests substitute a recording fake)
    return torch.cuda.cudart()


def pin_exactly(t: torch.Tensor) -> None:
    """Page-lock exactly `t`'s bytes, one cudaHostRegister call, and unregister them when `t` is collected.
    torch's pin_memory goes through the caching host allocator, which rounds every request up to a power
    of two (an 8 GiB pool would pin 16 GiB) and keeps freed blocks pinned; a pool pins what it uses.
    Views of `t` that outlive it keep valid, merely pageable, memory."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise PoolError("only contiguous CPU memory can be pinned")
    cudart = _cuda_runtime()
    ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    rc = cudart.cudaHostRegister(ptr, nbytes, 0)
    if int(getattr(rc, "value", rc)) != 0:
        raise PoolError(f"cudaHostRegister of {nbytes} bytes failed ({rc}): is the memlock limit too low?")
    weakref.finalize(t, cudart.cudaHostUnregister, ptr)


@dataclass(eq=False)
class Slot:
    """One reusable buffer: `data` is a uint8 view of `capacity` bytes inside the pool's arena."""

    pool: BufferPool
    size_class: int
    index: int
    data: torch.Tensor
    owner: Hashable | None = None
    nbytes: int = 0  # bytes requested by the current owner

    @property
    def capacity(self) -> int:
        return self.data.numel()

    def view(self, dtype: torch.dtype, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """A typed tensor over the first bytes of the slot (shares memory)."""
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.capacity:
            raise ValueError(f"view of {nbytes} bytes does not fit a {self.capacity}-byte slot")
        return self.data[:nbytes].view(dtype).view(shape)


@dataclass
class PoolStats:
    hits: int = 0
    misses: int = 0
    allocations: int = 0
    bytes_in_use: int = 0
    slots_in_use: int = 0
    peak_bytes_in_use: int = 0
    per_class_hits: dict[int, int] = field(default_factory=dict)
    per_class_misses: dict[int, int] = field(default_factory=dict)


class BufferPool:
    """Per-size-class free lists over one contiguous (optionally pinned) allocation."""

    def __init__(self, class_slots: Mapping[int, int], *, device: str | torch.device = "cpu",
                 pin: bool | None = None, alignment: int = ALIGN, name: str = "pool") -> None:
        bad = [(s, n) for s, n in class_slots.items() if int(s) <= 0 or int(n) < 0]
        if bad:
            raise ValueError(f"{name}: size classes and slot counts must be positive, got {bad}")
        self.name = name
        self.device = torch.device(device)
        if pin is None:
            pin = self.device.type == "cpu" and torch.cuda.is_available()
        self.pinned = bool(pin)
        self.alignment = alignment
        self.classes = sorted(int(s) for s, n in class_slots.items() if n > 0)
        strides = {s: round_up(s, alignment) for s in self.classes}
        self.capacity_bytes = sum(strides[s] * int(class_slots[s]) for s in self.classes)
        self.stats = PoolStats()
        self.arena = aligned_empty(max(self.capacity_bytes, 1), device=self.device, pin=self.pinned,
                                   alignment=alignment)
        self.stats.allocations = 1
        self._slots: dict[int, list[Slot]] = {}
        self._free: dict[int, list[Slot]] = {}
        offset = 0
        for s in self.classes:
            slots = []
            for i in range(int(class_slots[s])):
                slots.append(Slot(self, s, i, self.arena[offset:offset + strides[s]]))
                offset += strides[s]
            self._slots[s] = slots
            self._free[s] = list(reversed(slots))  # pop() hands out slot 0 first

    # -- queries ------------------------------------------------------------------------------------
    def slot_count(self, size_class: int) -> int:
        return len(self._slots.get(size_class, ()))

    def free_count(self, size_class: int) -> int:
        return len(self._free.get(size_class, ()))

    def class_for(self, nbytes: int) -> int | None:
        """The smallest size class that can hold `nbytes`, or None."""
        i = bisect.bisect_left(self.classes, nbytes)
        return self.classes[i] if i < len(self.classes) else None

    # -- acquire / release --------------------------------------------------------------------------
    def try_acquire(self, nbytes: int, owner: Hashable, *, exact: bool = False) -> Slot | None:
        """A free slot of the smallest class >= nbytes (only that class when `exact`), or None (a miss)."""
        if owner is None:
            raise ValueError("a slot owner must not be None")
        start = bisect.bisect_left(self.classes, nbytes)
        candidates = self.classes[start:start + 1] if exact else self.classes[start:]
        home = candidates[0] if candidates else nbytes
        for size_class in candidates:
            free = self._free[size_class]
            if free:
                slot = free.pop()
                slot.owner, slot.nbytes = owner, nbytes
                st = self.stats
                st.hits += 1
                st.per_class_hits[home] = st.per_class_hits.get(home, 0) + 1
                st.bytes_in_use += slot.capacity
                st.slots_in_use += 1
                st.peak_bytes_in_use = max(st.peak_bytes_in_use, st.bytes_in_use)
                return slot
        self.stats.misses += 1
        self.stats.per_class_misses[home] = self.stats.per_class_misses.get(home, 0) + 1
        return None

    def acquire(self, nbytes: int, owner: Hashable, *, exact: bool = False) -> Slot:
        slot = self.try_acquire(nbytes, owner, exact=exact)
        if slot is None:
            fits = self.class_for(nbytes)
            why = (f"all {self.slot_count(fits)} slots of class {fits} B are in use" if fits is not None
                   else f"the largest class is {self.classes[-1] if self.classes else 0} B")
            raise PoolExhaustedError(f"{self.name}: no free slot for {nbytes} B ({why})")
        return slot

    def release(self, slot: Slot, owner: Hashable) -> None:
        if slot.pool is not self:
            raise OwnershipError(f"{self.name}: slot belongs to pool {slot.pool.name!r}")
        if slot.owner is None:
            raise OwnershipError(f"{self.name}: slot {slot.size_class}#{slot.index} released twice")
        if slot.owner != owner:
            raise OwnershipError(f"{self.name}: slot {slot.size_class}#{slot.index} is held by {slot.owner!r}, "
                                 f"not {owner!r}")
        slot.owner, slot.nbytes = None, 0
        self._free[slot.size_class].append(slot)
        self.stats.bytes_in_use -= slot.capacity
        self.stats.slots_in_use -= 1

    def __repr__(self) -> str:
        return (f"BufferPool({self.name!r}, {len(self.classes)} classes, {self.capacity_bytes} B, "
                f"device={self.device}, pinned={self.pinned})")
