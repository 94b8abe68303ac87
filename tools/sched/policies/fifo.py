"""fifo: LSF-like first come first served on whole nodes.

A job asking for R GPUs gets wholly free nodes with at least R GPUs together (one node if one is
big enough, else the largest first; any node size), exclusively, and computes on R of their GPUs
(the largest nodes filled first). The queue is strict: nothing passes a head job that does not fit.
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import exclusive_shape
from mlsyskit.tools.sched.state import ClusterState, Decision, Start


class Fifo(Policy):
    name = "fifo"
    description = "LSF-like FCFS, whole nodes per job"

    def decide(self, state: ClusterState) -> Decision:
        if not state.queue or state.free.whole_free_gpus() == 0:
            return Decision()
        free = state.free.copy()
        actions = []
        for job in state.queue.values():
            placement = free.whole_nodes(job.gpus)
            if placement is None:
                break
            free.take(placement)
            actions.append(Start(job.job_id, placement, exclusive_shape(placement, job.gpus)))
        return Decision(tuple(actions))
