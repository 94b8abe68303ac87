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
        self._rows: dict[tuple[str, int, int, int], tuple[int, int, dict[int, float]]] = {}
        self._versions = getattr(model, "versions", {})   # what best_batch's memo keys on
        self._rate_fns: dict[tuple, Callable[[int], float]] = {}   # _rates' per row

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
        row = self._rows.get((job.app, job.batch_size, bucket, gpn))   # _rates' row: best_batch's answer
        if row is not None and row[0] == self._versions.get((job.app, job.batch_size), 0) \
                and row[1] == self._noise.memo.generation and gpus in row[2]:
            return row[2][gpus]
        return best_batch(self.model, job.app, job.batch_size, shape, bucket, self._noise.memo)[0]

    def curve_stamp(self, app: str, batch: int) -> tuple[int, int]:
        """Moves whenever goodputs for (app, batch) may: the model's estimates for it (what
        best_batch's memo keys on; `version` for a model without per-curve ones) or a memo clear."""
        versions = getattr(self.model, "versions", None)
        mark = versions.get((app, batch), 0) if versions is not None else getattr(self.model, "version", 0)
        return mark, self._noise.memo.generation

    def _rates(self, job: JobView, gpn: int) -> Callable[[int], float]:
        """_rate by GPU count, read from a row per (application, batch, bucket, GPUs per node) that
        mirrors best_batch's memo while its key and the memo stand: stamped with the model's version
        for (application, batch) and the memo's generation, read before each lookup as best_batch
        reads its key, so another application's refresh keeps the row (exact: a memo answer never
        changes in between). The bucket is read once: within one allocation every job was bucketed
        by remaining_work first, so no first start moves an application's early one. The function
        depends on the row alone, so one per row is kept."""
        bucket = self._noise.bucket(job)
        if bucket is None:
            return super()._rates(job, gpn)
        row_key = (job.app, job.batch_size, bucket, gpn)
        found = self._rate_fns.get(row_key)
        if found is None:
            if len(self._rate_fns) > 10_000:
                self._rate_fns.clear()
            found = self._rate_fns[row_key] = self._row_rate(row_key)
        return found

    def _row_rate(self, row_key: tuple) -> Callable[[int], float]:
        model, memo, versions, rows = self.model, self._noise.memo, self._versions, self._rows
        app, batch, bucket, gpn = row_key
        version_key = (app, batch)

        def rate(gpus: int) -> float:
            row = rows.get(row_key)
            if row is None or row[0] != versions.get(version_key, 0) or row[1] != memo.generation:
                row = rows[row_key] = (versions.get(version_key, 0), memo.generation, {})
            value = row[2].get(gpus)
            if value is None:
                value = row[2][gpus] = best_batch(model, app, batch, compact_shape(gpus, gpn), bucket, memo)[0]
            return value
        rate.row_key = row_key   # for _kept_row
        return rate

    def _kept_row(self, row_key: tuple | None) -> dict[int, float]:
        """The goodputs by GPU count that a row's rate() would return as they are (no side
        effects), or {} (a job without a row, or a row its stamp has left)."""
        row = self._rows.get(row_key) if row_key else None
        if row is None or row[0] != self._versions.get(row_key[:2], 0) or row[1] != self._noise.memo.generation:
            return {}
        return row[2]

    def _gain(self, work: dict[int, float], rates: dict) -> Callable[[int, int], float]:
        """Optimus' gain, reading kept goodputs directly (what rate() would return, with nothing
        else done) until a rate() call that is not one, which may move them (then read afresh)."""
        kept: dict[tuple, dict[int, float]] = {}

        def gain(job_id: int, k: int) -> float:
            left, rate = work[job_id], rates[job_id]
            key = getattr(rate, "row_key", None)
            row = kept.get(key)
            if row is None:
                row = kept[key] = self._kept_row(key)
            now, then = row.get(k), row.get(k + 1)
            if now is None or then is None:
                kept.clear()
                return left / rate(k) - left / rate(k + 1)
            return left / now - left / then
        return gain

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
