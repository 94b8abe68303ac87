"""Scheduling policies, one per file, behind `Policy`; importing this package registers them all."""
from mlsyskit.tools.sched.policies import (  # noqa: F401
    backfill,
    fifo,
    marble,
    marble_elastic,
    marble_las,
    optimus,
    tiresias,
)
from mlsyskit.tools.sched.policies.base import POLICIES, Policy, PolicyOptions, create_policy, register

__all__ = ["POLICIES", "Policy", "PolicyOptions", "create_policy", "register"]
