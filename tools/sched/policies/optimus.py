"""optimus: greedy allocation by marginal gain in remaining time (Peng et al., EuroSys'18).

Optimus sizes jobs from a GPU-count scaling model (here the policy's fitted throughput model on a
compact layout) and estimates each job's remaining work online by fitting its loss curve
(`loss_fit`; before three loss reports, or when the fit cannot say, from the history of
finished jobs). Every job first gets one GPU in arrival order while GPUs last; then, one GPU at
a time, the job whose estimated remaining time drops most from one more GPU gets it, up to what
it asked for.

Re-allocation is driven by events: on an arrival or a completion at least `optimus_interval`
seconds after the last full re-allocation, all jobs are re-allocated and running jobs whose
count changed are checkpoint-restarted; in between only waiting jobs share the free GPUs, and
the policy asks to be woken when the interval has passed if jobs still wait. A full
re-allocation that changes nothing waits for the next event, so a very long job alone (or a
queue that cannot move) costs no periodic wake-ups. Each job is placed on the layout the
allocation assumed (compact, best fit), else on the fewest nodes with free GPUs.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import remaining_work
from mlsyskit.tools.sched.policies.loss_fit import MIN_REPORTS, total_work
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobView, Preempt, Resize, Start
from mlsyskit.tools.sched.throughput import compact_shape


class Optimus(Policy):
    name = "optimus"
    description = "greedy marginal gain in remaining time (loss-curve fit), count-based model, event-driven re-allocation"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._last_plan: float | None = None
        self._fits: dict[int, tuple[float, float | None]] = {}   # job -> (newest report fitted, total)

    def wants_loss_reports(self, now: float) -> bool:
        """Loss reports are read at full re-allocations only."""
        return self._last_plan is None or now - self._last_plan >= self.options.optimus_interval

    def remaining_work(self, state: ClusterState, job: JobView) -> float:
        reports = job.loss_reports
        newest = reports[-1][0] if reports else 0.0
        cached = self._fits.get(job.job_id)
        # Refit when the job's progress has doubled since the last fit (a fit costs ~0.1 ms).
        if (cached is None or newest > 2.0 * cached[0]) and len(reports) >= MIN_REPORTS:
            total = total_work(reports, job.target_loss) if job.target_loss > 0 else None
            cached = (newest, total)
            self._fits[job.job_id] = cached
        total, progress = (cached[1] if cached else None), job.progress_at(state.now)
        if total is not None and total > progress:
            return total - progress
        return remaining_work(self.model, state, job)

    def order(self, state: ClusterState, jobs) -> list[JobView]:
        """Who gets a GPU first when there are more jobs than GPUs: arrival order."""
        return sorted(jobs, key=lambda j: (j.arrival, j.job_id))

    def queue_order(self, state: ClusterState):
        """Waiting jobs in the order they share free GPUs between full re-allocations."""
        return state.queue.values()

    def one_gpu_each(self, state: ClusterState, jobs: list[JobView], gpus: int) -> tuple[
            dict[int, int], dict[int, float], dict[int, JobView], dict[int, int], dict[int, Callable[[int], float]], int]:
        """The first pass of the greedy allocations (this one and marble's): one GPU per job in order while
        GPUs last, with each such job's remaining work, GPU cap and rate curve (none for a cap of 1).
        Returns (counts, work, jobs by id, caps, rates, GPUs left)."""
        counts: dict[int, int] = {}
        work: dict[int, float] = {}
        for job in jobs:
            if gpus == 0:
                break
            counts[job.job_id] = 1
            work[job.job_id] = self.remaining_work(state, job)
            gpus -= 1
        by_id = {j.job_id: j for j in jobs}
        caps = {i: self._cap(state, by_id[i]) for i in counts}
        rates = {i: self._rates(by_id[i], state.spec.gpus_per_node) for i in counts if caps[i] > 1}
        return counts, work, by_id, caps, rates, gpus

    def allocate(self, state: ClusterState, jobs: list[JobView], gpus: int) -> dict[int, int]:
        """Greedy GPU counts per job id for `jobs` (in priority order) sharing `gpus` GPUs."""
        counts, work, _, caps, rates, gpus = self.one_gpu_each(state, jobs, gpus)
        gain = self._gain(work, rates)
        heap = [(-gain(i, 1), i) for i in rates]
        heapq.heapify(heap)
        while gpus > 0 and heap:
            neg_gain, job_id = heapq.heappop(heap)
            if -neg_gain <= 0:
                break
            counts[job_id] += 1
            gpus -= 1
            k = counts[job_id]
            if k < caps[job_id]:
                heapq.heappush(heap, (-gain(job_id, k), job_id))
        return counts

    def _gain(self, work: dict[int, float], rates: dict[int, Callable[[int], float]]
              ) -> Callable[[int, int], float]:
        """The greedy's gain of a job's (k+1)-th GPU: its estimated remaining time saved."""
        def gain(job_id: int, k: int) -> float:
            left, rate = work[job_id], rates[job_id]
            return left / rate(k) - left / rate(k + 1)
        return gain

    def _rates(self, job: JobView, gpn: int) -> Callable[[int], float]:
        """The job's _rate by GPU count, for one allocation (after every job in it was weighed)."""
        return lambda gpus: self._rate(job, gpus, gpn)

    def _rate(self, job: JobView, gpus: int, gpn: int) -> float:
        return self.model.rate(job.app, compact_shape(gpus, gpn), job.batch_size) if gpus else math.inf

    def _cap(self, state: ClusterState, job: JobView) -> int:
        """The most GPUs a job gets: what it asked for."""
        return job.gpus

    def _batch(self, job: JobView, gpus: int, gpn: int) -> int | None:
        """The global batch a job runs with on `gpus` GPUs (None: the submitted one, always here)."""
        return None

    def decide(self, state: ClusterState) -> Decision:
        now, gpn = state.now, state.spec.gpus_per_node
        interval = self.options.optimus_interval
        free = state.free.copy()
        actions: list[Action] = []
        due = self._last_plan is None or now - self._last_plan >= interval
        if due and state.running:
            self._last_plan = now
            jobs = self.order(state, [*state.running.values(), *state.queue.values()])
            counts = self.allocate(state, jobs, state.spec.total_gpus)
            changed = [j for i, j in state.running.items() if counts.get(i, 0) != j.held_gpus]
            for job in changed:
                free.give(job.placement)
            for job in changed:
                k = counts.get(job.job_id, 0)
                placement = _place(free, k, gpn) if k else None
                if placement is None:
                    actions.append(Preempt(job.job_id))
                    continue
                free.take(placement)
                actions.append(Resize(job.job_id, placement, _shape(placement), self._batch(job, k, gpn)))
            waiting = [j for j in state.queue.values() if counts.get(j.job_id, 0) > 0]
        else:
            if not state.queue or free.total == 0:
                return Decision((), self._wake(state, now, interval))
            if self._last_plan is None:
                self._last_plan = now
            waiting = list(itertools.islice(self.queue_order(state), free.total))
            counts = self.allocate(state, waiting, free.total)
        for job in waiting:
            k = counts.get(job.job_id, 0)
            placement = _place(free, k, gpn) if k else None
            if placement is None:
                continue
            free.take(placement)
            actions.append(Start(job.job_id, placement, _shape(placement), self._batch(job, k, gpn)))
        if due and state.running and not actions:
            return Decision()   # nothing to change: the next arrival or completion re-plans
        return Decision(tuple(actions), self._wake(state, now, interval))

    def _wake(self, state: ClusterState, now: float, interval: float) -> float | None:
        """Jobs wait: re-plan when the interval has passed (sooner events re-plan anyway)."""
        if not state.queue or self._last_plan is None:
            return None
        return max(now, self._last_plan) + interval if now - self._last_plan < interval else None


def _place(free: FreeMap, gpus: int, gpn: int) -> Placement | None:
    return free.fit(compact_shape(gpus, gpn)) or free.spread(gpus)


def _shape(placement: Placement) -> tuple[int, ...]:
    return tuple(sorted((g for _, g in placement), reverse=True))
