"""marble-las (ours): MARBLE's efficient sizing and node sharing under Tiresias' 2D-LAS order.

MARBLE (FIFO, non-preemptive) lets a job that arrived into an idle cluster hold many GPUs for
days while short jobs queue behind it; on the Pollux workloads with imagenet jobs its mean JCT
was 2-3x tiresias' and its worst slowdown hundreds of times. This policy keeps what MARBLE
contributes, the size rule (each job gets p* <= what it asked: where one more GPU adds less than
`efficiency_threshold` single-GPU throughputs, `pressure_threshold` while more jobs wait than GPUs
are free; `las_pressure_threshold`, 0.5 = off by cross-validation) and best-fit node sharing, and takes the order from Tiresias (least attained service
first, discretised into queues, preempting running jobs that fall out; see tiresias.py for the
incremental index): a job is admitted when its p* fits the capacity left, as Tiresias admits
a job when its request fits. When nothing waits and GPUs are free, jobs started
below their p* are grown onto it by checkpoint-restart if that saves more than `grow_min_gain`
restart costs (by the history-based estimate of their remaining work), as marble-elastic does;
only those jobs are looked at (a set kept by the policy), so a decision never scans all running
jobs.
"""
from __future__ import annotations

from mlsyskit.tools.sched.cluster import FreeMap
from mlsyskit.tools.sched.policies.common import remaining_work
from mlsyskit.tools.sched.policies.sizing import sized_shapes
from mlsyskit.tools.sched.policies.tiresias import Tiresias
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import ClusterState, Decision, JobView, Preempt, Resize, Start


class MarbleLas(Tiresias):
    name = "marble-las"
    description = "ours: marble's efficient sizes and node sharing in tiresias' least-attained-service order"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._sizes: dict[tuple[str, int, int, int, float], list[Shape]] = {}
        self._small: set[int] = set()   # running jobs started below their quiet p*

    def shapes_for(self, job: JobView, gpus_per_node: int, pressured: bool) -> list[Shape]:
        opts = self.options
        thr = max(opts.efficiency_threshold, opts.las_pressure_threshold) if pressured else opts.efficiency_threshold
        key = (job.app, job.batch_size, job.gpus, gpus_per_node, thr)
        shapes = self._sizes.get(key)
        if shapes is None:
            shapes = self._sizes[key] = sized_shapes(self.model, *key)
        return shapes

    def grant(self, state: ClusterState, job: JobView, capacity: int) -> int:
        need = len(self.shapes_for(job, state.spec.gpus_per_node, len(state.queue) > state.free.total))
        return need if need <= capacity else 0

    def place(self, state: ClusterState, free: FreeMap, job: JobView, gpus: int):
        shape = self.shapes_for(job, state.spec.gpus_per_node, len(state.queue) > state.free.total)[gpus - 1]
        placement = free.fit(shape) or free.spread(gpus)   # best fit, else any nodes with free GPUs
        return None if placement is None else (placement, tuple(sorted((g for _, g in placement), reverse=True)))

    def decide(self, state: ClusterState) -> Decision:
        decision = super().decide(state)
        gpn = state.spec.gpus_per_node
        started = {a.job_id: a for a in decision.actions if isinstance(a, Start)}
        for a in decision.actions:
            if isinstance(a, Start) and sum(a.shape) < sum(self.shapes_for(state.queue[a.job_id], gpn, False)[-1]):
                self._small.add(a.job_id)
            elif isinstance(a, Preempt):
                self._small.discard(a.job_id)
        if len(state.queue) > len(started) or not self._small:
            return decision
        free = state.free.copy()
        for a in decision.actions:
            if isinstance(a, Preempt):
                free.give(state.running[a.job_id].placement)
        for a in started.values():
            free.take(a.placement)
        actions = list(decision.actions)
        for job_id in sorted(self._small):
            job = state.running.get(job_id)
            if job is None or job_id in started:
                if job is None:
                    self._small.discard(job_id)
                continue
            if free.total == 0:
                break
            if state.now < job.busy_until:
                continue
            target = self.shapes_for(job, gpn, False)[-1]
            free.give(job.placement)
            placement = free.fit(target)
            left = remaining_work(self.model, state, job)
            model_now = self.model.rate(job.app, job.shape, job.batch_size)
            grown_rate = job.measured_rate * self.model.rate(job.app, target, job.batch_size) / model_now
            saves = left / job.measured_rate - (state.restart_cost + left / grown_rate)
            if placement is None or saves <= self.options.grow_min_gain * state.restart_cost:
                free.take(job.placement)
                continue
            free.take(placement)
            actions.append(Resize(job_id, placement, target))
            self._running.touch(self._key[job_id])
            self._small.discard(job_id)
        return Decision(tuple(actions), decision.wake_at)
