"""LRU baseline: no profile. Tensors are fetched synchronously when a module needs them and stay on
the device until the least recently used one of their size class must make room; the CPU tier
spills its least recently used tensor to NVMe the same way. Same budgets and size-class pools
(sized from the model's own tensor sizes) as tencache, so only the use of the profile differs."""
from __future__ import annotations

from collections.abc import Iterable

from mlsyskit.tools.offload.policies.base import Plan, PlanContext, SyncFetch
from mlsyskit.tools.offload.pools import class_slots, place
from mlsyskit.tools.offload.tiers import Entry


class LRUPolicy(SyncFetch):
    name = "lru"

    def __init__(self) -> None:
        self.tick = 0

    def plan(self, ctx: PlanContext) -> Plan:
        dev = class_slots(ctx.distribution, ctx.device_budget, tier="device", min_slots=ctx.concurrent)
        cpu = class_slots(ctx.distribution, ctx.cpu_budget, tier="CPU", small_first=True, min_one=not ctx.has_nvme)
        return Plan(dev, cpu, place(ctx.model_order, ctx.sizes, dev, cpu))

    def acquire(self, pos: int | None, entries: list[Entry]) -> None:
        protect = {e.idx for e in entries}
        for e in entries:
            self.tick += 1
            e.last_use = self.tick
            if self.store.ready_on_device(e):
                self.store.settle(e)
                self.store.bind(e)
            else:
                self.fetch_sync(e, pos, protect)

    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None:
        for e in entries:
            self.store.unbind(e)

    def device_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None:
        return min(candidates, key=lambda e: e.last_use, default=None)

    def cpu_victim(self, candidates: Iterable[Entry], pos: int | None) -> Entry | None:
        return min(candidates, key=lambda e: e.last_use, default=None)
