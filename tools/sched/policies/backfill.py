"""backfill: FCFS on whole nodes with EASY backfilling (Lifka, 1995).

The head job that does not fit gets a reservation at the earliest time enough whole-node GPUs
free up (the shadow time); a later job may start now if it fits and either ends before the shadow
time or uses only GPUs the head will not need then. Nodes of any size are taken whole (fifo.py).
"""
from __future__ import annotations

from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import exclusive_shape, gpu_shadow, runtime
from mlsyskit.tools.sched.state import ClusterState, Decision, Start


class Backfill(Policy):
    name = "backfill"
    description = "FCFS, whole nodes, EASY backfilling"

    def decide(self, state: ClusterState) -> Decision:
        if not state.queue or state.free.whole_free_gpus() == 0:
            return Decision()
        free = state.free.copy()
        actions = []
        shadow, extra = None, 0
        scanned = 0
        for job in state.queue.values():
            if free.whole_free_gpus() == 0:
                break
            placement = free.whole_nodes(job.gpus)
            if shadow is None and placement is None:
                shadow, extra = gpu_shadow(state, free.whole_free_gpus(), job.gpus)
                continue
            if shadow is not None:
                scanned += 1
                if scanned > self.options.backfill_depth:
                    break
                if placement is None:
                    continue
                held = sum(g for _, g in placement)
                ends_in_time = state.now + runtime(self.model, state, job, exclusive_shape(placement, job.gpus)) <= shadow
                if not ends_in_time and held > extra:
                    continue
                if not ends_in_time:
                    extra -= held
            free.take(placement)
            actions.append(Start(job.job_id, placement, exclusive_shape(placement, job.gpus)))
        return Decision(tuple(actions))
