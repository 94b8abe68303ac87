"""The 10Cache policy: profile-guided placement, prefetch along the profiled order, Belady eviction.

Placement: walk the profile's first-use order; tensors fill the device slots (the active window),
then the CPU slots, the rest start on NVMe. After each use (`release`) a tensor leaves the active
window: it becomes evictable but keeps its device slot until a slot of its class is needed, so a
tensor used again soon (the forward->backward turn) is not moved at all. After each `acquire`,
`maintain` looks ahead in the profiled (cyclic) order:
  * device prefetch: the next uses' tensors are copied CPU->device on the copy stream/thread, or read
    NVMe->device (tiers.nvme_to_device), into free slots; when a class has none, the evictable resident whose next use is farthest is moved out, but
    only if that use is later than the incoming tensor's (Belady's rule);
  * NVMe read-ahead: tensors further ahead that live on NVMe are read asynchronously into CPU slots,
    spilling the CPU resident with the farthest next use when it is later than the incoming one's.
An evicted device tensor goes to a CPU slot, or, when every CPU resident of its class is needed
sooner than it is, straight to NVMe. A use that does not match the profile falls back to the
synchronous fetch (counted by the engine as a deviation).
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

    def __init__(self, *, device_ahead: int = 24, nvme_ahead: int = 96, max_spills: int = 4,
                 max_evictions: int = 8, batch_copies: int = 32, flush_ahead: int = 8) -> None:
        self.batch_copies = batch_copies
        self.flush_ahead = flush_ahead
        self.max_evictions = max_evictions
        self.device_ahead = device_ahead
        self.nvme_ahead = nvme_ahead
        self.max_spills = max_spills

    def plan(self, ctx: PlanContext) -> Plan:
        if ctx.profile is None:
            raise ValueError("the tencache policy needs a profile (run `tencache profile` or omit --profile)")
        self.uses = [u.tensors for u in ctx.profile.uses]
        self.n_uses = len(self.uses)
        self.positions: dict[int, list[int]] = {}
        for pos, tensors in enumerate(self.uses):
            for t in tensors:
                self.positions.setdefault(t, []).append(pos)
        dev = class_slots(ctx.distribution, ctx.device_budget, tier="device", min_slots=ctx.concurrent)
        cpu = class_slots(ctx.distribution, ctx.cpu_budget, tier="CPU", small_first=True, min_one=not ctx.has_nvme)
        # a rank's sizes are its own tensors only (shards.py): ids need not be 0..n-1
        order = [t for t in first_use_order(self.uses, max(ctx.sizes, default=-1) + 1) if t in ctx.sizes]
        return Plan(dev, cpu, place(order, ctx.sizes, dev, cpu))

    # -- profile distances ---------------------------------------------------------------------------
    def distance(self, e: Entry, pos: int | None) -> int:
        """Uses from `pos` until e's next use in the cyclic profiled order (2*n_uses if never used)."""
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
            # a prefetch copy still in flight: compute waits on that copy's own event (no host wait)
            if self.store.ready_for_compute(e):
                self.store.bind(e)
            else:
                self.fetch_sync(e, pos, protect)
        if pos is not None:
            self.maintain(pos)

    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None:
        for e in entries:
            self.store.unbind(e)  # leaves the active window; the slot is reclaimed when needed

    # -- lookahead ------------------------------------------------------------------------------------
    def maintain(self, pos: int) -> None:
        st = self.store
        st.reap()
        free = {s: st.dev_pool.free_count(s) for s in self.by_class}
        seen: set[int] = set()
        stuck: set[int] = set()  # classes where no resident may leave for now
        for q in range(pos + 1, pos + 1 + self.device_ahead):
            for t in self.uses[q % self.n_uses]:
                e = st.entries[t]
                if t in seen or e.where == DEVICE:
                    continue
                seen.add(t)
                if free[e.nbytes] <= 0:
                    if e.nbytes not in stuck and not self._evict_for(e, pos):
                        stuck.add(e.nbytes)  # the freed slot, if any, is claimed on a later call
                    continue
                free[e.nbytes] -= 1  # nearer tensors still on their way from NVMe keep their claim
                if e.pending is None and e.where == CPU:
                    st.cpu_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
                elif e.pending is None and e.where == NVME:
                    st.nvme_to_device(e, st.dev_pool.acquire(e.nbytes, e.idx, exact=True))
        # small tensors' copies wait in the store's queue and go in one batched launch once the batch is big
        # or one of them is needed within `flush_ahead` uses (a consumer launches it anyway if it comes first)
        if len(st.queued_idx) >= self.batch_copies or any(
                self.distance(st.entries[t], pos) <= self.flush_ahead for t in st.queued_idx):
            st.flush_copies()
        if st.nvme is not None:
            self._read_ahead(pos)

    def _evict_for(self, incoming: Entry, pos: int) -> bool:
        """Start freeing a device slot of incoming's class for it; False when none may leave now."""
        st = self.store
        leaving = sum(1 for x in self.by_class[incoming.nbytes] if x.where != DEVICE and x.dev is not None)
        if leaving >= self.max_evictions:
            return False
        candidates = [x for x in self.by_class[incoming.nbytes]
                      if x.where == DEVICE and x.pending is None and not x.bound]
        victim = self.device_victim(candidates, pos)
        if victim is None or self.distance(victim, pos) <= self.distance(incoming, pos):
            return False
        slot = st.cpu_pool.try_acquire(victim.nbytes, victim.idx, exact=True)
        if slot is not None:
            st.device_to_cpu(victim, slot)
            return True
        cpu_candidates = [x for x in self.by_class[victim.nbytes] if x.where == CPU and x.pending is None]
        cpu_victim = self.cpu_victim(cpu_candidates, pos)
        if cpu_victim is not None and self.distance(cpu_victim, pos) > self.distance(victim, pos):
            return self._spill(cpu_victim) and False  # its slot frees when the write completes
        if st.nvme is not None:
            st.device_to_nvme(victim, sync=False)
            return True
        return False

    def _spill(self, e: Entry) -> bool:
        st = self.store
        if st.nvme is None or sum(1 for x in st.inflight if x.where == NVME) >= self.max_spills:
            return False
        if any(x.where == NVME and x.cpu is not None for x in self.by_class[e.nbytes]):
            return False  # a slot of this class is already being freed
        st.cpu_to_nvme(e)
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
                    continue
                blocked.add(e.nbytes)
                candidates = [x for x in self.by_class[e.nbytes] if x.where == CPU and x.pending is None]
                victim = self.cpu_victim(candidates, pos)
                if victim is not None and self.distance(victim, pos) > self.distance(e, pos):
                    self._spill(victim)
