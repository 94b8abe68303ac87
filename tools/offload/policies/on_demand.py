"""On-demand baseline (naive offload): every tensor keeps a fixed home (CPU slots in model order until
the CPU budget is used, then NVMe). When a module needs a tensor it is copied synchronously into a
freshly allocated device tensor, which is freed after the use, written back to its home first when
the optimizer has updated it. No prefetch, no reuse of device buffers: every allocation is counted."""
from __future__ import annotations

import torch

from mlsyskit.tools.offload.memory import aligned_empty
from mlsyskit.tools.offload.policies.base import Plan, PlanContext, Policy
from mlsyskit.tools.offload.pools import class_slots, place
from mlsyskit.tools.offload.tiers import CPU, DEVICE, NVME, Entry


class OnDemandPolicy(Policy):
    name = "on-demand"

    def plan(self, ctx: PlanContext) -> Plan:
        cpu = class_slots(ctx.distribution, ctx.cpu_budget, tier="CPU", small_first=True, min_one=not ctx.has_nvme)
        return Plan(None, cpu, place(ctx.model_order, ctx.sizes, {}, cpu))

    def acquire(self, pos: int | None, entries: list[Entry]) -> None:
        for e in entries:
            if e.fresh is None:
                self.fetch_fresh(e)

    def release(self, pos: int | None, entries: list[Entry], *, updated: bool) -> None:
        for e in entries:
            if e.fresh is not None:
                self.drop_fresh(e, write_back=updated)

    def fetch_fresh(self, e: Entry) -> None:
        """Synchronously copy e's home (CPU slot or NVMe blocks) into a newly allocated device tensor."""
        st = self.store
        fresh = torch.empty(e.shape, dtype=e.dtype, device=st.device)
        st.stats.allocations += 1
        if e.where == CPU:
            fresh.view(-1).view(torch.uint8).copy_(e.cpu.data[:e.nbytes])
        else:
            st.stats.allocations += 1  # the staging buffer
            fresh.view(-1).view(torch.uint8).copy_(st.read_home(e).reshape(-1).view(torch.uint8))
        st.stats.add(e.where, DEVICE, e.nbytes)
        e.fresh = fresh
        st.bind(e)

    def drop_fresh(self, e: Entry, *, write_back: bool) -> None:
        """Free the device copy; after an optimizer update, write it back to its home first."""
        st = self.store
        if write_back:
            data = e.fresh.view(-1).view(torch.uint8)
            if e.where == CPU:
                e.cpu.data[:e.nbytes].copy_(data)
            else:
                staging = aligned_empty(e.nbytes)
                st.stats.allocations += 1
                staging.copy_(data)
                st.blocks.write(e, staging)
            st.stats.add(DEVICE, e.where if e.where == CPU else NVME, e.nbytes)
        st.unbind(e)
        e.fresh = None
