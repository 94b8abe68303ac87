"""On-demand baseline (naive offload): every tensor keeps a fixed home (CPU slots in model order until
the CPU budget is used, then NVMe). When a module needs a tensor it is copied synchronously into a
freshly allocated device tensor, which is freed after the use, written back to its home first when
the optimizer has updated it. No prefetch, no reuse of device buffers."""
from __future__ import annotations

from mlsyskit.tools.offload.policies.base import Plan, PlanContext, Policy
from mlsyskit.tools.offload.pools import class_slots, place
from mlsyskit.tools.offload.tiers import Entry


class OnDemandPolicy(Policy):
    name = "on-demand"

    def plan(self, ctx: PlanContext) -> Plan:
        cpu = class_slots(ctx.distribution, ctx.cpu_budget, tier="CPU", small_first=True)
        return Plan(None, cpu, place(ctx.model_order, ctx.sizes, {}, cpu))

    def acquire(self, pos: int | None, entries: list[Entry]) -> None:
        for e in entries:
            if e.fresh is None:
                self.store.fetch_fresh(e)

    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None:
        for e in entries:
            if e.fresh is not None:
                self.store.drop_fresh(e, write_back=updated)
