"""Offload policies behind one interface (policies.base.Policy), by CLI name."""
from __future__ import annotations

from mlsyskit.core.registry import Registry
from mlsyskit.tools.offload.policies.base import Plan, PlanContext, Policy
from mlsyskit.tools.offload.policies.lru import LRUPolicy
from mlsyskit.tools.offload.policies.on_demand import OnDemandPolicy
from mlsyskit.tools.offload.policies.tencache import TenCachePolicy

POLICIES: Registry[Policy] = Registry("policy")
register = POLICIES.add
for _cls in (TenCachePolicy, OnDemandPolicy, LRUPolicy):
    register(_cls)


def make_policy(name: str) -> Policy:
    return POLICIES.get(name)()


__all__ = ["POLICIES", "Plan", "PlanContext", "Policy", "make_policy", "register"]
