"""Goodput curves (Pollux, OSDI'21): for each GPU count, the global batch that makes the most
progress per second, throughput x statistical efficiency, from what the cluster measured.

Throughput comes from the policy's learned model (never the simulator's); efficiency from the
gradient noise scale the job reported when it last started (`JobView.noise_scale`, measured with
noise), or for a job that has not run yet the application's early noise scale learned from the
first starts of its other jobs (geometric mean); without either, the submitted batch alone
(plain throughput). Rates are in samples at the submitted batch, as `JobView.progress` counts.
"""
from __future__ import annotations

import math

from mlsyskit.tools.sched.efficiency import batch_choices, gain
from mlsyskit.tools.sched.policies.sizing import layouts
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import ClusterState, JobView, Rebatch


def bucket_of(phi: float) -> int:
    """Noise scales within a factor 2^(1/2) of each other share a curve (memo key; one
    measurement's error is about that, ground truth's MEASURE_NOISE)."""
    return round(2.0 * math.log2(phi))


def phi_of(bucket: int) -> float:
    return 2.0 ** (bucket / 2.0)


def goodput_layouts(model, app: str, submitted: int, most: int, gpus_per_node: int, bucket: int | None,
                    memo: dict | None = None, layout_memo: dict | None = None
                    ) -> tuple[list[Shape], list[float], list[float], list[int]]:
    """Shapes for 1..most GPUs (index p-1; the submitted batch's best layouts), throughput at the
    submitted batch and goodput rates (rates[p], rates[0] = 0), and the batch that reaches each
    goodput (batches[p]). `layout_memo`: the caller's, for this one model (_layouts)."""
    shapes, plain = _layouts(model, app, submitted, most, gpus_per_node, layout_memo)
    rates, batches = list(plain), [submitted] * (most + 1)
    if bucket is None:
        return shapes, plain, rates, batches
    for k, shape in enumerate(shapes, 1):
        rates[k], batches[k] = best_batch(model, app, submitted, shape, bucket, memo)
    return shapes, plain, rates, batches


def _layouts(model, app: str, submitted: int, most: int, gpus_per_node: int, memo: dict | None
             ) -> tuple[list[Shape], list[float]]:
    """sizing.layouts, kept in `memo` while the model's estimates for (app, submitted batch) stand:
    one curve per noise-scale bucket shares them (the rates at the submitted batch do not depend
    on phi), exact: a learned model drops its rates for (app, batch) exactly when it bumps that
    version. It takes in pending samples first, as its first `rate` call would."""
    if memo is None:
        return layouts(model, app, submitted, most, gpus_per_node)
    refresh = getattr(model, "refresh", None)
    if refresh is not None:
        refresh()
    key = (getattr(model, "versions", {}).get((app, submitted), 0), app, submitted, most, gpus_per_node)
    found = memo.get(key)
    if found is None:
        if len(memo) > 10_000:
            memo.clear()
        found = memo[key] = layouts(model, app, submitted, most, gpus_per_node)
    return list(found[0]), list(found[1])   # copies: a curve owns its lists


def best_batch(model, app: str, submitted: int, shape: Shape, bucket: int, memo: dict | None = None
               ) -> tuple[float, int]:
    """(goodput, batch) of the batch with the most goodput on `shape` at the bucket's noise scale;
    `memo` (the caller's, for this one model) keeps answers until the model's estimates for
    (app, submitted batch) move (`versions`, as marble's curves)."""
    if memo is not None:
        key = (getattr(model, "versions", {}).get((app, submitted), 0), app, submitted, shape, bucket)
        found = memo.get(key)
        if found is None:
            if len(memo) > 100_000:
                memo.clear()
            found = memo[key] = best_batch(model, app, submitted, shape, bucket)
        return found
    phi = phi_of(bucket)
    best, batch = model.rate(app, shape, submitted), submitted
    for m in batch_choices(app, submitted, sum(shape)):
        if m != submitted:
            r = model.rate(app, shape, m) * gain(phi, submitted, m)
            if r > best:
                best, batch = r, m
    return best, batch


class Memo(dict):
    """A memo table that counts how often it was emptied (best_batch empties a full one), so a
    table derived from its answers can tell when they may be recomputed differently."""

    generation = 0

    def clear(self) -> None:
        self.generation += 1
        super().clear()


class NoiseScales:
    """The noise scale a policy plans a job with (module docstring)."""

    def __init__(self) -> None:
        self._first: dict[str, list[float]] = {}   # app -> [sum of log phi at first starts, count]
        self._seen: set[int] = set()
        self._buckets: dict[int, tuple[float, int]] = {}   # job -> (its last phi, bucket)
        self._early: dict[str, tuple[int, int]] = {}       # app -> (first starts counted, their bucket)
        self.memo = Memo()   # best_batch answers for the policy's one model
        self.layouts: dict = {}   # _layouts answers for it

    def bucket(self, job: JobView) -> int | None:
        phi = job.noise_scale
        if phi > 0:
            found = self._buckets.get(job.job_id)
            if found is not None and found[0] == phi:   # the common case (a job in _buckets was
                return found[1]                         # seen at restarts 0, or can never be)
            if job.restarts == 0 and job.job_id not in self._seen:
                self._seen.add(job.job_id)
                acc = self._first.setdefault(job.app, [0.0, 0])
                acc[0] += math.log(phi)
                acc[1] += 1
            found = self._buckets[job.job_id] = (phi, bucket_of(phi))
            return found[1]
        acc = self._first.get(job.app)
        if not acc:
            return None
        early = self._early.get(job.app)
        if early is None or early[0] != acc[1]:   # recomputed when a first start was added
            early = self._early[job.app] = (acc[1], bucket_of(math.exp(acc[0] / acc[1])))
        return early[1]


class Rebatcher:
    """Running jobs that reported a new noise scale move to their best batch on the GPUs they hold
    (Rebatch: no restart, as an adaptive-batch job changes its batch between steps)."""

    def __init__(self, noise: NoiseScales) -> None:
        self.noise, self._seen = noise, 0

    def actions(self, model, state: ClusterState, changed: set[int]) -> list[Rebatch]:
        reports = state.noise_reports
        if self._seen > len(reports):   # a fresh state
            self._seen = 0
        fresh = dict.fromkeys(reports[self._seen:])
        self._seen = len(reports)
        out = []
        for job_id in fresh:
            job = state.running.get(job_id)
            if job is None or job_id in changed or not job.shape:
                continue
            bucket = self.noise.bucket(job)
            if bucket is None:
                continue
            batch = best_batch(model, job.app, job.batch_size, job.shape, bucket, self.noise.memo)[1]
            if batch != job.batch:
                out.append(Rebatch(job_id, batch))
        return out
