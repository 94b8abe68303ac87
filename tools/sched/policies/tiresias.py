"""tiresias: discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

A job's attained service is GPUs x seconds held. Jobs sit in priority queues by attained service
(`tiresias_thresholds` split them); lower queues first, FIFO (by arrival) inside a queue. Each
decision walks jobs in that order and admits each whose requested GPU count still fits in the
cluster's capacity; running jobs left out are preempted (they pay the restart cost when resumed).
Admitted waiting jobs are placed consolidated (fewest nodes, best fit). Jobs get exactly what they
asked for. The policy asks to be woken when a running job will cross into the next queue.
"""
from __future__ import annotations

import bisect
import math

from mlsyskit.tools.sched.policies.base import Policy, register
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobView, Preempt, Start
from mlsyskit.tools.sched.throughput import compact_shape


@register
class Tiresias(Policy):
    name = "tiresias"
    description = "discretised 2D-LAS with preemption, requested GPUs, consolidated placement"

    def level(self, attained: float) -> int:
        return bisect.bisect_right(self.options.tiresias_thresholds, attained)

    def decide(self, state: ClusterState) -> Decision:
        now, gpn = state.now, state.spec.gpus_per_node
        thresholds = self.options.tiresias_thresholds
        jobs: list[tuple[int, float, int, JobView]] = []
        for job in state.queue.values():
            jobs.append((self.level(job.attained), job.arrival, job.job_id, job))
        for job in state.running.values():
            jobs.append((self.level(job.attained_at(now)), job.arrival, job.job_id, job))
        jobs.sort(key=lambda t: t[:3])
        capacity = state.spec.total_gpus
        admitted: list[JobView] = []
        keep: set[int] = set()
        for _, _, job_id, job in jobs:
            if capacity <= 0:
                break
            if job.gpus <= capacity:
                capacity -= job.gpus
                if job_id in state.running:
                    keep.add(job_id)
                else:
                    admitted.append(job)
        actions: list[Action] = []
        free = state.free.copy()
        if admitted:
            for job_id, job in state.running.items():
                if job_id not in keep:
                    actions.append(Preempt(job_id))
                    free.give(job.placement)
            for job in admitted:
                shape = compact_shape(job.gpus, gpn)
                placement = free.fit(shape) or free.spread(job.gpus)
                if placement is None:
                    continue
                free.take(placement)
                actions.append(Start(job.job_id, placement, tuple(sorted((g for _, g in placement),
                                                                              reverse=True))))
        wake = math.inf
        for job in state.running.values():
            attained = job.attained_at(now)
            i = bisect.bisect_right(thresholds, attained)
            if i < len(thresholds):
                wake = min(wake, now + (thresholds[i] - attained) / job.held_gpus)
        return Decision(tuple(actions), None if math.isinf(wake) else wake)
