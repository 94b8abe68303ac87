"""The 10Cache policy: profile-guided placement, prefetch along the profiled order, Belady eviction.

Placement: walk the profile's first-use order; tensors fill the device slots (the active window),
then the CPU slots, the rest start on NVMe. After each use (`release`) a tensor leaves the window to a
CPU slot of its class unless it is used again within `keep_uses` uses (the forward->backward turn);
with no free CPU slot it waits on the device while the CPU resident of that class whose next use is
farthest in the profiled order is spilled to NVMe. After each `acquire`, `maintain` looks ahead in the
profiled (cyclic) order: CPU-resident tensors of the next uses are copied to free device slots on the
copy stream/thread, and NVMe-resident tensors further ahead are read asynchronously into CPU slots,
spilling a CPU resident only when its next use is later than the incoming tensor's (Belady's rule).
A use that does not match the profile falls back to the synchronous fetch and is counted by the engine.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from mlsyskit.tools.offload.policies.base import Plan, PlanContext, SyncFetch
from mlsyskit.tools.offload.pools import class_slots, first_use_order, place
from mlsyskit.tools.offload.tiers import CPU, DEVICE, NVME, Entry


class TenCachePolicy(SyncFetch):
    name = "tencache"
    needs_profile = True
    prefetches = True

    def __init__(self, *, device_ahead: int = 24, nvme_ahead: int = 96, keep_uses: int = 4,
                 max_spills: int = 4) -> None:
        self.device_ahead = device_ahead
        self.nvme_ahead = nvme_ahead
        self.keep_uses = keep_uses
        self.max_spills = max_spills
        self.waiting: list[Entry] = []

    def plan(self, ctx: PlanContext) -> Plan:
        assert ctx.profile is not None
        self.uses = [u.tensors for u in ctx.profile.uses]
        self.n_uses = len(self.uses)
        self.positions: dict[int, list[int]] = {}
        for pos, tensors in enumerate(self.uses):
            for t in tensors:
                self.positions.setdefault(t, []).append(pos)
        dev = class_slots(ctx.distribution, ctx.device_budget, tier="device")
        cpu = class_slots(ctx.distribution, ctx.cpu_budget, tier="CPU")
        order = first_use_order(self.uses, len(ctx.sizes))
        return Plan(dev, cpu, place(order, ctx.sizes, dev, cpu))

    # -- profile distances ---------------------------------------------------------------------------
    def distance(self, e: Entry, pos: int | None) -> int:
        """Uses from `pos` until e's next use in the cyclic profiled order (n_uses+ if never used)."""
        plist = self.positions.get(e.idx)
        if not plist:
            return 2 * self.n_uses
        pos = -1 if pos is None else pos
        i = bisect.bisect_right(plist, pos)
        return plist[i] - pos if i < len(plist) else plist[0] + self.n_uses - pos

    def device_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None:
        return max(candidates, key=lambda e: self.distance(e, pos), default=None)

    def cpu_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None:
        return max(candidates, key=lambda e: self.distance(e, pos), default=None)

    # -- engine callbacks -----------------------------------------------------------------------------
    def acquire(self, pos: int | None, entries: list[Entry]) -> None:
        protect = {e.idx for e in entries}
        for e in entries:
            if e.pending is not None and e.where == DEVICE:
                self.store.settle(e)  # the prefetch copy is in flight: wait for it
            if e in self.waiting:
                self.waiting.remove(e)
            if e.where == DEVICE and e.pending is None:
                self.store.bind(e)
            else:
                self.fetch_sync(e, pos, protect)
        if pos is not None:
            self.maintain(pos)

    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None:
        st = self.store
        for e in entries:
            st.unbind(e)
            if pos is not None and self.distance(e, pos) <= self.keep_uses:
                continue  # used again in a moment: stays in the window
            slot = st.cpu_pool.try_acquire(e.nbytes, e.idx, exact=True)
            if slot is not None:
                st.device_to_cpu(e, slot)
            elif e not in self.waiting:
                self.waiting.append(e)
        st.reap()

    def end_step(self) -> None:
        self.store.reap()

    # -- lookahead ------------------------------------------------------------------------------------
    def maintain(self, pos: int) -> None:
        st = self.store
        st.reap()
        self._flush_waiting(pos)
        free = {s: st.dev_pool.free_count(s) for s in self.by_class}
        for q in range(pos + 1, pos + 1 + self.device_ahead):
            for t in self.uses[q % self.n_uses]:
                e = st.entries[t]
                if e.where == DEVICE or free[e.nbytes] <= 0:
                    continue
                free[e.nbytes] -= 1  # nearer tensors still on their way from NVMe keep their claim
                if e.where == CPU and e.pending is None:
                    st.cpu_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
        if st.nvme is not None:
            self._read_ahead(pos)

    def _flush_waiting(self, pos: int) -> None:
        st = self.store
        for e in list(self.waiting):
            if e.where != DEVICE or e.pending is not None or e.bound:
                self.waiting.remove(e)
                continue
            slot = st.cpu_pool.try_acquire(e.nbytes, e.idx, exact=True)
            if slot is not None:
                self.waiting.remove(e)
                st.device_to_cpu(e, slot)
            else:
                self._spill_for(e, pos)

    def _spills_in_flight(self) -> int:
        return sum(1 for e in self.store.inflight if e.where == NVME)

    def _spill_for(self, e: Entry, pos: int, only_if_later: bool = False) -> bool:
        """Start spilling the CPU resident of e's class with the farthest next use; True if started."""
        st = self.store
        if st.nvme is None or self._spills_in_flight() >= self.max_spills:
            return False
        if any(x.where == NVME and x.cpu is not None for x in self.by_class[e.nbytes]):
            return False  # a slot of this class is already being freed
        candidates = [x for x in self.by_class[e.nbytes] if x.where == CPU and x.pending is None]
        victim = self.cpu_victim(candidates, pos)
        if victim is None or (only_if_later and self.distance(victim, pos) <= self.distance(e, pos)):
            return False
        st.cpu_to_nvme(victim)
        return True

    def _read_ahead(self, pos: int) -> None:
        st = self.store
        blocked: set[int] = set()
        for q in range(pos + 1, pos + 1 + self.nvme_ahead):
            for t in self.uses[q % self.n_uses]:
                e = st.entries[t]
                if e.where != NVME or e.pending is not None or e.nbytes in blocked:
                    continue
                slot = st.cpu_pool.try_acquire(e.nbytes, e.idx, exact=True)
                if slot is not None:
                    st.nvme_to_cpu(e, slot)
                else:
                    blocked.add(e.nbytes)
                    self._spill_for(e, pos, only_if_later=True)
