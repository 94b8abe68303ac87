"""backfill: FCFS on whole nodes with EASY backfilling (Lifka, 1995).

The head job that does not fit gets a reservation at the earliest time enough nodes free up
(the shadow time); a later job may start now if it fits and either ends before the shadow time or
uses only nodes the head will not need then.
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import exclusive_shape, node_shadow, nodes_for, runtime
from mlsyskit.tools.sched.state import ClusterState, Decision, Start


class Backfill(Policy):
    name = "backfill"
    description = "FCFS, whole nodes, EASY backfilling"

    def decide(self, state: ClusterState) -> Decision:
        gpn = state.spec.gpus_per_node
        if not state.queue or state.free.whole_free_nodes() == 0:
            return Decision()
        free = state.free.copy()
        actions = []
        shadow, extra = None, 0
        scanned = 0
        for job in state.queue.values():
            if free.whole_free_nodes() == 0:
                break
            need = nodes_for(job.gpus, gpn)
            shape = exclusive_shape(job.gpus, gpn)
            if shadow is not None:
                scanned += 1
                if scanned > self.options.backfill_depth:
                    break
                if need > free.whole_free_nodes():
                    continue
                ends_in_time = state.now + runtime(self.model, state, job, shape) <= shadow
                if not ends_in_time and need > extra:
                    continue
                if not ends_in_time:
                    extra -= need
            placement = free.whole_nodes(need)
            if placement is None:
                shadow, extra = node_shadow(state, free.whole_free_nodes(), need)
                continue
            free.take(placement)
            actions.append(Start(job.job_id, placement, shape))
        return Decision(tuple(actions))
