"""Offload policies behind one interface (policies.base.Policy), by CLI name."""
from __future__ import annotations

from mlsyskit.tools.offload.policies.base import Plan, PlanContext, Policy
from mlsyskit.tools.offload.policies.lru import LRUPolicy
from mlsyskit.tools.offload.policies.on_demand import OnDemandPolicy
from mlsyskit.tools.offload.policies.tencache import TenCachePolicy

POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    if cls.name in POLICIES:
        raise ValueError(f"policy {cls.name!r} is registered twice")
    POLICIES[cls.name] = cls
    return cls


for _cls in (TenCachePolicy, OnDemandPolicy, LRUPolicy):
    register(_cls)


def make_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[name]()


__all__ = ["POLICIES", "Plan", "PlanContext", "Policy", "make_policy", "register"]
