"""pollux: a Pollux-style goodput baseline (Qiao et al., OSDI'21), built on optimus' machinery.

Pollux sizes every job for goodput, throughput x statistical efficiency, and picks each job's
batch for the GPUs it gets. Here: a job's goodput on k GPUs is the best over its allowed global
batches (efficiency.batch_choices) of the learned throughput times the efficiency at its measured
gradient noise scale (policies.goodput; without a measurement, the application's early one, else
throughput alone). GPUs are allocated as Pollux's cluster objective with its default fairness
(p = -1: maximise minus the sum of 1 / speedup, speedup = goodput(k) / goodput(1)): every job
first gets one GPU in arrival order while GPUs last, then one GPU at a time goes to the largest
1/S(k) - 1/S(k+1), up to `elastic_max_scale` x the request (Pollux ignores the request; the cap
keeps layouts bounded). Re-allocation is optimus' (every `optimus_interval`, changed jobs
restart); a job that reports a new noise scale moves to its best batch in place. Simplified from
Pollux: greedy instead of its genetic search, no interference avoidance or restart penalty term.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from mlsyskit.tools.sched.policies.goodput import NoiseScales, Rebatcher, best_batch
from mlsyskit.tools.sched.policies.optimus import Optimus
from mlsyskit.tools.sched.state import ClusterState, Decision, JobView
from mlsyskit.tools.sched.throughput import compact_shape


class Pollux(Optimus):
    name = "pollux"
    description = "Pollux-style baseline: GPU count and batch for goodput (measured noise scale), fairness p=-1, greedy"
    wants_noise_scale = True
    wants_loss_reports = None   # no loss-curve fit: the replay keeps no loss reports for it

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._noise = NoiseScales()
        self._rebatcher = Rebatcher(self._noise)
        self._rows: dict[tuple[str, int, int, int], tuple[tuple[int, int], dict[int, float]]] = {}

    def remaining_work(self, state: ClusterState, job: JobView) -> float:
        """Optimus' greedy weighs 1/rate(k) - 1/rate(k+1) by this: goodput on one GPU turns it
        into 1/S(k) - 1/S(k+1), Pollux's objective at p = -1."""
        return self._rate(job, 1, state.spec.gpus_per_node)

    def _cap(self, state: ClusterState, job: JobView) -> int:
        return max(job.gpus, min(state.spec.total_gpus, int(job.gpus * self.options.elastic_max_scale)))

    def _rate(self, job: JobView, gpus: int, gpn: int) -> float:
        if not gpus:
            return math.inf
        shape, bucket = compact_shape(gpus, gpn), self._noise.bucket(job)
        if bucket is None:
            return self.model.rate(job.app, shape, job.batch_size)
        return best_batch(self.model, job.app, job.batch_size, shape, bucket, self._noise.memo)[0]

    def _rates(self, job: JobView, gpn: int) -> Callable[[int], float]:
        """_rate by GPU count, read from a row per (application, batch, bucket, GPUs per node) that
        mirrors best_batch's memo while the model's estimates and the memo stand (exact: a memo
        answer never changes in between). The bucket is read once: within one allocation every job
        was bucketed by remaining_work first, so no first start moves an application's early one."""
        bucket = self._noise.bucket(job)
        if bucket is None:
            return super()._rates(job, gpn)
        model, memo, app, batch = self.model, self._noise.memo, job.app, job.batch_size
        row_key = (app, batch, bucket, gpn)

        def rate(gpus: int) -> float:
            stamp = (getattr(model, "version", 0), memo.generation)
            row = self._rows.get(row_key)
            if row is None or row[0] != stamp:
                row = self._rows[row_key] = (stamp, {})
            value = row[1].get(gpus)
            if value is None:
                value = row[1][gpus] = best_batch(model, app, batch, compact_shape(gpus, gpn), bucket, memo)[0]
            return value
        return rate

    def _batch(self, job: JobView, gpus: int, gpn: int) -> int | None:
        bucket = self._noise.bucket(job)
        if bucket is None:
            return None
        batch = best_batch(self.model, job.app, job.batch_size, compact_shape(gpus, gpn), bucket, self._noise.memo)[1]
        return None if batch == job.batch_size else batch

    def decide(self, state: ClusterState) -> Decision:
        decision = super().decide(state)
        extra = self._rebatcher.actions(self.model, state, {a.job_id for a in decision.actions})
        return Decision(decision.actions + tuple(extra), decision.wake_at) if extra else decision
