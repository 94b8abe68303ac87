"""The policy interface: plan the pools and initial placement, then make tensors resident on demand.

The engine calls `acquire(pos, entries)` when a module is about to use its tensors (pos is the index
of this use in the profiled order, or None when execution deviates from the profile) and
`release(pos, entries, updated)` when the module is done with them (after the forward, or after the
optimizer updated a tensor in the backward). Policies decide which tensors move and where; the moves
themselves are `TierStore` primitives. `SyncFetch` is the synchronous fetch path all policies share,
parameterised by the policy's choice of eviction victim.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from mlsyskit.tools.offload.memory import Slot
from mlsyskit.tools.offload.pools import Placement
from mlsyskit.tools.offload.profiler import Profile
from mlsyskit.tools.offload.tiers import CPU, DEVICE, NVME, Entry, TierStore


@dataclass(frozen=True)
class PlanContext:
    sizes: dict[int, int]  # tensor id -> bytes
    model_order: list[int]  # tensor ids in model definition order
    profile: Profile | None
    device_budget: int
    cpu_budget: int
    has_nvme: bool
    concurrent: dict[int, int] = field(default_factory=dict)  # size class -> most tensors one module uses at once

    @property
    def distribution(self) -> dict[int, int]:
        dist: dict[int, int] = {}
        for s in self.sizes.values():
            dist[s] = dist.get(s, 0) + 1
        return dist


@dataclass(frozen=True)
class Plan:
    device_slots: dict[int, int] | None  # None: no device pool (fresh allocation per fetch)
    cpu_slots: dict[int, int]
    placement: Placement


class Policy(ABC):
    name: ClassVar[str]
    needs_profile: ClassVar[bool] = False
    prefetches: ClassVar[bool] = False

    store: TierStore

    @abstractmethod
    def plan(self, ctx: PlanContext) -> Plan: ...

    def attach(self, store: TierStore, ctx: PlanContext) -> None:
        self.store = store
        self.by_class: dict[int, list[Entry]] = {}
        for e in store.entries:
            self.by_class.setdefault(e.nbytes, []).append(e)

    @abstractmethod
    def acquire(self, pos: int | None, entries: list[Entry]) -> None: ...

    @abstractmethod
    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None: ...

    def end_step(self) -> None:
        self.store.reap()


class NoSlotError(RuntimeError):
    """Every slot of a class is pinned by tensors in use: the budget cannot run this module."""


class SyncFetch(Policy, ABC):
    """Synchronous fetch NVMe -> device and CPU -> device, evicting the victims the subclass picks."""

    @abstractmethod
    def device_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None: ...

    @abstractmethod
    def cpu_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None: ...

    def fetch_sync(self, e: Entry, pos: int | None, protect: set[int]) -> None:
        st = self.store
        st.settle(e)
        if e.where == NVME:  # straight into the device slot: no CPU slot, no extra copy
            st.nvme_to_device(e, self.device_slot(e, pos, protect))
            st.settle(e)
        if e.where == CPU:
            st.cpu_to_device(e, self.device_slot(e, pos, protect))
            st.settle(e)
        st.bind(e)

    def device_slot(self, e: Entry, pos: int | None, protect: set[int]) -> Slot:
        st = self.store
        while True:
            slot = st.dev_pool.try_acquire(e.nbytes, e.idx, exact=True)
            if slot is not None:
                return slot
            leaving = [x for x in self.by_class[e.nbytes] if x.pending is not None and x.dev is not None
                       and x.where != DEVICE]
            if leaving:
                st.settle(leaving[0])
                continue
            candidates = [x for x in self.by_class[e.nbytes] if x.where == DEVICE and not x.bound
                          and x.idx not in protect]
            victim = self.device_victim(candidates, pos)
            if victim is None:
                arriving = [x for x in self.by_class[e.nbytes] if x.where == DEVICE and x.pending is not None]
                if arriving:
                    st.settle(arriving[0])
                    continue
                raise NoSlotError(f"no device slot for {e.name} ({e.nbytes} B): all are held by tensors in use")
            st.settle(victim)
            cpu = self.cpu_slot(victim, pos, protect, required=st.nvme is None)
            if cpu is None:
                st.device_to_nvme(victim)  # every CPU slot of the class is pinned: straight to NVMe
            else:
                st.device_to_cpu(victim, cpu)
                st.settle(victim)

    def cpu_slot(self, e: Entry, pos: int | None, protect: set[int], required: bool = True) -> Slot | None:
        st = self.store
        while True:
            slot = st.cpu_pool.try_acquire(e.nbytes, e.idx, exact=True)
            if slot is not None:
                return slot
            leaving = [x for x in self.by_class[e.nbytes] if x.pending is not None and x.cpu is not None
                       and x.where != CPU]
            if leaving:
                st.settle(leaving[0])
                continue
            candidates = [x for x in self.by_class[e.nbytes] if x.where == CPU and x.pending is None
                          and x.idx not in protect and x is not e]
            victim = self.cpu_victim(candidates, pos)
            if victim is None:
                arriving = [x for x in self.by_class[e.nbytes] if x.where == CPU and x.pending is not None]
                if arriving:
                    st.settle(arriving[0])
                    continue
            if victim is None and not required:
                return None
            if victim is None or st.nvme is None:
                raise NoSlotError(f"no CPU slot for {e.name} ({e.nbytes} B) and nothing can be spilled to NVMe")
            st.cpu_to_nvme(victim, sync=True)
