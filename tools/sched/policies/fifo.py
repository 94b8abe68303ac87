"""fifo: LSF-like first come first served on whole nodes.

A job asking for R GPUs gets ceil(R / G) whole nodes, exclusively, and computes on R of their GPUs
(full nodes first). The queue is strict: nothing passes a head job that does not fit.
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import exclusive_shape, nodes_for
from mlsyskit.tools.sched.state import ClusterState, Decision, Start


class Fifo(Policy):
    name = "fifo"
    description = "LSF-like FCFS, whole nodes per job"

    def decide(self, state: ClusterState) -> Decision:
        gpn = state.spec.gpus_per_node
        if not state.queue or state.free.whole_free_nodes() == 0:
            return Decision()
        free = state.free.copy()
        actions = []
        for job in state.queue.values():
            placement = free.whole_nodes(nodes_for(job.gpus, gpn))
            if placement is None:
                break
            free.take(placement)
            actions.append(Start(job.job_id, placement, exclusive_shape(job.gpus, gpn)))
        return Decision(tuple(actions))
