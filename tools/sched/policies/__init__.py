"""Scheduling policies, one per file, behind `Policy`; importing this package registers them all."""
from mlsyskit.tools.sched.policies import backfill, fifo, marble, marble_elastic, optimus, tiresias  # noqa: F401
from mlsyskit.tools.sched.policies.base import POLICIES, Policy, PolicyOptions, create_policy, register

__all__ = ["POLICIES", "Policy", "PolicyOptions", "create_policy", "register"]
