"""optimus: greedy allocation by marginal gain in remaining time (Peng et al., EuroSys'18).

Optimus sizes jobs from a GPU-count scaling model (here the throughput model on a compact layout).
Every job first gets one GPU in arrival order while GPUs last; then, one GPU at a time, the job
whose estimated remaining time drops most from one more GPU gets it, up to what it asked for.
Every `optimus_interval` seconds all jobs are re-allocated this way and running jobs whose count
changed are checkpoint-restarted (paying the restart cost); between re-allocations only waiting
jobs share the free GPUs. Tasks are placed on the fewest nodes with free GPUs (most-free first),
without regard to how a job's speed depends on the per-node split.
"""
from __future__ import annotations

import heapq
import math

from mlsyskit.tools.sched.policies.base import Policy, register
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobRecord, Preempt, Resize, Start
from mlsyskit.tools.sched.throughput import compact_shape


@register
class Optimus(Policy):
    name = "optimus"
    description = "greedy marginal gain in remaining time, count-based model, periodic re-allocation"

    def _remaining_time(self, job: JobRecord, gpus: int, gpn: int, now: float) -> float:
        if gpus == 0:
            return math.inf
        return job.remaining(now) / self.model.rate(job.spec.app, compact_shape(gpus, gpn), job.spec.batch_size)

    def allocate(self, jobs: list[JobRecord], gpus: int, gpn: int, now: float) -> dict[int, int]:
        """Greedy GPU counts per job id for `jobs` (in priority order) sharing `gpus` GPUs."""
        counts: dict[int, int] = {}
        for job in jobs:
            if gpus == 0:
                break
            counts[job.spec.job_id] = 1
            gpus -= 1
        by_id = {j.spec.job_id: j for j in jobs}
        heap = []
        for job_id, k in counts.items():
            job = by_id[job_id]
            if k < job.spec.gpus:
                gain = self._remaining_time(job, k, gpn, now) - self._remaining_time(job, k + 1, gpn, now)
                heap.append((-gain, job_id))
        heapq.heapify(heap)
        while gpus > 0 and heap:
            neg_gain, job_id = heapq.heappop(heap)
            if -neg_gain <= 0:
                break
            counts[job_id] += 1
            gpus -= 1
            job, k = by_id[job_id], counts[job_id]
            if k < job.spec.gpus:
                gain = self._remaining_time(job, k, gpn, now) - self._remaining_time(job, k + 1, gpn, now)
                heapq.heappush(heap, (-gain, job_id))
        return counts

    def decide(self, state: ClusterState) -> Decision:
        now, gpn = state.now, state.spec.gpus_per_node
        interval = self.options.optimus_interval
        next_round = (math.floor(now / interval) + 1) * interval
        on_round = math.isclose(now % interval, 0.0, abs_tol=1e-6) or math.isclose(now % interval, interval)
        wake = next_round if (state.queue or state.running) else None
        free = state.free.copy()
        actions: list[Action] = []
        if on_round and state.running:
            jobs = sorted([*state.running.values(), *state.queue.values()], key=lambda j: (j.spec.arrival, j.spec.job_id))
            counts = self.allocate(jobs, state.spec.total_gpus, gpn, now)
            changed = []
            for job_id, job in state.running.items():
                if counts.get(job_id, 0) != job.held_gpus:
                    free.give(job.placement)
                    changed.append(job)
            for job in changed:
                k = counts.get(job.spec.job_id, 0)
                placement = free.spread(k) if k else None
                if placement is None:
                    actions.append(Preempt(job.spec.job_id))
                    continue
                free.take(placement)
                actions.append(Resize(job.spec.job_id, placement, _shape(placement)))
            waiting = [j for j in state.queue.values() if counts.get(j.spec.job_id, 0) > 0]
        else:
            if not state.queue or free.total == 0:
                return Decision((), wake)
            waiting = list(state.queue.values())[: free.total]
            counts = self.allocate(waiting, free.total, gpn, now)
        for job in waiting:
            k = counts.get(job.spec.job_id, 0)
            placement = free.spread(k) if k else None
            if placement is None:
                continue
            free.take(placement)
            actions.append(Start(job.spec.job_id, placement, _shape(placement)))
        return Decision(tuple(actions), wake)


def _shape(placement) -> tuple[int, ...]:
    return tuple(sorted((g for _, g in placement), reverse=True))
