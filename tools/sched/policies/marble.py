"""marble-admit (marble before its Pollux-style allocation, policies.marble_goodput): admits
each job at its efficient size and grows it onto idle GPUs.

Who runs: Tiresias' discretised least-attained-service order with preemption (tiresias.py, the
incremental index) on marble's own queues (`marble_thresholds`), inside a queue the least
estimated remaining time on one GPU first (`rank`), plus a starvation guard: a job that has
waited `starvation_s` since it (re)entered the queue goes ahead of every other until its next
queue crossing.

How many GPUs (MARBLE's insight, Pollux's use of it): training throughput grows sublinearly with
GPUs, and each job's curve T(k) is known from measurements (policies.learned: a fitted prior
corrected by the throughput the cluster reports; never the simulator's truth).
- A job is admitted on its efficient size p* <= its request (sizing.efficient_size at
  `admit_threshold`): fewer GPUs than asked where the curve flattens. Running jobs count at
  most their p* in the admission walk, so GPUs a job holds beyond p* never keep another job out.
- GPUs left over go one at a time where they save the most estimated job time: to the job whose
  (estimated remaining work, from the history of finished jobs) x (1/T(k) - 1/T(k+1)) is
  largest, while that GPU adds at least `grow_threshold` single-GPU throughputs on the job's
  curve and the job holds at most `elastic_max_scale` x its request. An idle cluster thus gives
  jobs more than they asked for.
- Newly admitted jobs start on their share at once. Running jobs grow by checkpoint-restart only
  when that saves more than `marble_grow_gain` restart costs, at most once per `resize_interval`
  each, in passes at most every `grow_period` (bounded restarts). When admitted jobs need GPUs
  that grown jobs hold, the lowest-priority grown jobs shrink back to p* (one restart each)
  before anything else happens.

Which batch (Pollux's co-adaptation, `adapt_batch`): a job may run with another global batch than
it asked for (efficiency.batch_choices); its curve is then goodput, the learned throughput at the
best batch times the statistical efficiency at its measured gradient noise scale (policies.goodput),
in samples at the submitted batch, and p*, the ladder and the order all read that curve
(`goodput_sizing`; off: sizes from the throughput at the submitted batch, batches still chosen).
Starts and resizes carry the chosen batch; a running job that reports a new noise scale moves to
its best batch in place (Rebatch, no restart). Without a measurement (the daemon) it keeps its batch.

Where: each count on its best layout (sizing.best_shape), best fit onto nodes so jobs share
nodes; a layout the node sizes cannot hold goes onto any nodes with free GPUs (`FreeMap.spread`),
so on mixed node sizes every job that fits the cluster's GPU count can start.
"""
from __future__ import annotations

import bisect
import heapq
import math

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.efficiency import gain
from mlsyskit.tools.sched.policies.common import remaining_work
from mlsyskit.tools.sched.policies.goodput import NoiseScales, Rebatcher, goodput_layouts, phi_of
from mlsyskit.tools.sched.policies.sizing import efficient_size, ladder
from mlsyskit.tools.sched.policies.tiresias import Tiresias
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import (
    Action,
    ClusterState,
    Decision,
    JobView,
    Preempt,
    Resize,
    Start,
    gpus_of,
)

# (p*, sizes to grow to, shapes, goodput rates, batch per size)
Curve = tuple[int, list[int], list[Shape], list[float], list[int]]
MAX_ELASTIC = 128   # the most GPUs a curve is laid out for (a job's own request may be more)


def _shape_of(placement: Placement) -> Shape:
    return tuple(sorted(map(gpus_of, placement), reverse=True))


class Marble(Tiresias):
    name = "marble-admit"
    description = "marble before its Pollux-style allocation: admit at p*, elastic goodput-aware GPU counts from measured scaling curves, LAS order, starvation guard"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self.thresholds = self.options.marble_thresholds
        self._curves: dict[tuple[str, int, int], tuple[int, tuple[int, int], Curve]] = {}
        self._spec, self._spec_key = None, (0, 0)
        self._job_curve: dict[int, tuple] = {}   # job id -> (its view, its noise scale, its _curves entry)
        self._base: dict[int, int] = {}        # running job -> its p* when it last started or changed
        self._model_versions: dict[str, int] = getattr(model, "versions", {})
        self._resized: dict[int, float] = {}   # job -> when this policy last resized it
        self._grown: set[int] = set()          # running jobs holding more than their p*
        self._promoted: set[int] = set()       # waiting jobs the starvation guard moved ahead
        self._last_grow = -math.inf
        self.wants_noise_scale = self.options.adapt_batch   # the simulator then reports measured noise scales
        self._noise = NoiseScales()
        self._rebatcher = Rebatcher(self._noise)
        self._refresh = getattr(model, "refresh", None)   # a learned model takes in measurements lazily

    # ---- sizes -----------------------------------------------------------------------------------
    def curve(self, state: ClusterState, job: JobView) -> Curve:
        """(p*, ladder, shapes, goodput rates, batches) of the job's kind and noise scale,
        recomputed when the model's estimates for its application and batch changed (a learned
        model's `versions`)."""
        phi = job.noise_scale
        mine = self._job_curve.get(job.job_id)
        if mine is not None and mine[0] is job and mine[1] == phi and state.spec is self._spec:
            # the commonest case: the job's curve as last read, while its measured noise scale
            # (so its bucket) stands; the same entry of _curves while its version and cluster do
            found = mine[2]
            if found[1] == self._spec_key and found[0] == self._model_versions.get((job.app, job.batch_size), 0):
                return found[2]
        bucket = self._noise.bucket(job) if self.wants_noise_scale else None
        key = (job.app, job.batch_size, job.gpus, bucket)
        found = self._curves.get(key)
        if found is not None and state.spec is self._spec and found[1] == self._spec_key \
                and found[0] == self._model_versions.get(key[:2], 0):
            if phi > 0 or not self.wants_noise_scale:   # without a measurement the bucket can move
                self._job_curve[job.job_id] = (job, phi, found)
            return found[2]   # the common case: called several times per job and decision
        spec = state.spec
        if spec is not self._spec:
            self._spec, self._spec_key = spec, (spec.gpus_per_node, spec.total_gpus)
        version = self._model_versions.get((job.app, job.batch_size), 0)
        if found is None or found[0] != version or found[1] != self._spec_key:
            gpn, total = self._spec_key
            opts = self.options
            cap = max(job.gpus, min(total, int(job.gpus * opts.elastic_max_scale), MAX_ELASTIC))
            shapes, plain, good, batches = goodput_layouts(self.model, job.app, job.batch_size, cap, gpn, bucket,
                                                          self._noise.memo, self._noise.layouts)
            rates = good if opts.goodput_sizing else plain
            base = efficient_size(rates, job.gpus, opts.admit_threshold)
            found = self._curves[key] = (version, self._spec_key,
                                         (base, ladder(rates, base, opts.grow_threshold), shapes, rates, batches))
        return found[2]

    def grant(self, state: ClusterState, job: JobView, capacity: int) -> int:
        base = self.curve(state, job)[0]
        return base if base <= capacity else 0

    def holds(self, state: ClusterState, job: JobView) -> int:
        base = self._base.get(job.job_id)
        if base is None:
            base = self._base[job.job_id] = self.curve(state, job)[0]
        held = job.held_gpus   # called for every running job in every walk: no min() call
        return held if held < base else base

    # ---- index upkeep ----------------------------------------------------------------------------
    def rank(self, job: JobView) -> float:
        """Order inside a queue: the least estimated remaining time on one GPU first (samples left
        by the history of finished jobs of its application, policies.common.remaining_work, over
        the single-GPU rate), as the state stood when the job entered the queue. One GPU, not p*:
        GPU-seconds on p* would rank a job that asked for many GPUs (and scales less than
        linearly on them) behind an equal job that asked for few."""
        if not self.options.rank_by_estimate:
            return job.arrival
        state = self._state
        return remaining_work(self.model, state, job) / self.curve(state, job)[3][1]

    def _rebuild(self, state: ClusterState) -> None:
        super()._rebuild(state)
        self._promoted.clear()
        self._base.clear()
        self._grown = {i for i, job in state.running.items() if job.held_gpus > self.curve(state, job)[0]}

    def _sync(self, state: ClusterState) -> None:
        # _grown follows running jobs: finished ones leave here, preempted ones in decide
        finished = state.finished[self._finished:] if state is self._state else ()
        super()._sync(state)
        self._grown.difference_update(finished)

    def _guard(self, state: ClusterState) -> float | None:
        """Promote jobs that waited `starvation_s` (the queue's front waited longest); the time
        the next one will have waited that long."""
        limit, now = self.options.starvation_s, state.now
        for job in state.queue.values():
            if now - job.since < limit:
                return job.since + limit
            if job.job_id in self._promoted:
                continue
            key = self._key.get(job.job_id)
            if key is None or key not in self._waiting:
                continue
            self._waiting.discard(key)
            self._key[job.job_id] = promoted = (-1, key[1], key[2])
            self._waiting.add(promoted)
            self._promoted.add(job.job_id)
        return None

    def _to_running(self, job: JobView, now: float, gpus: int) -> None:
        self._base.pop(job.job_id, None)   # read afresh: what was learned since may have moved p*
        key = self._key[job.job_id]
        self._waiting.discard(key)
        self._running.add(key)
        self._promoted.discard(job.job_id)
        self._push_crossing(job, now, job.attained, gpus)

    # ---- the decision ----------------------------------------------------------------------------
    def decide(self, state: ClusterState) -> Decision:
        self._sync(state)
        now = state.now
        starve_wake = self._guard(state)
        running = state.running
        free = state.free.copy()
        dropped: list[int] = []
        if self._waiting and (not self._running or self._waiting[0] < self._running[-1]):
            admitted, dropped = self._walk(state, state.spec.total_gpus)
        elif self._waiting:
            # no waiting job outranks a running one: they get the free GPUs and what grown jobs
            # hold beyond their p* (nothing is preempted)
            excess = sum(running[i].held_gpus - self.holds(state, running[i]) for i in self._grown)
            admitted = self._admit_waiting(state, free.total + excess) if free.total + excess > 0 else []
        else:
            admitted = []
        actions: list[Action] = []
        changed: set[int] = set()
        for job_id in self.in_running_order(state, dropped):
            actions.append(Preempt(job_id))
            free.give(running[job_id].placement)
            changed.add(job_id)
            self._grown.discard(job_id)
            key = self._key[job_id]
            self._running.discard(key)
            self._waiting.add(key)
        need = sum(map(gpus_of, admitted))
        if free.total < need:
            self._shrink(state, free, need, actions, changed)
        targets = {job.job_id: gpus for job, gpus in admitted}
        grow_wake = self._share(state, free.total - need, admitted, targets, changed, actions)
        for job, base in admitted:
            k = targets[job.job_id]
            placement = self._place(state, free, job, k) or (self._place(state, free, job, base) if k > base else None)
            if placement is None:
                continue
            free.take(placement)
            gpus = sum(map(gpus_of, placement))
            actions.append(Start(job.job_id, placement, _shape_of(placement), self._batch(state, job, gpus)))
            if gpus > base:
                self._grown.add(job.job_id)
            self._to_running(job, now, gpus)
        self._grow_running(state, free, targets, changed, actions)
        if self.wants_noise_scale:
            actions.extend(self._rebatcher.actions(self.model, state, changed))
        return Decision(tuple(actions), self._wake(state, now, actions, starve_wake, grow_wake))

    def _place(self, state: ClusterState, free: FreeMap, job: JobView, gpus: int) -> Placement | None:
        shapes = self.curve(state, job)[2]
        shape = shapes[gpus - 1] if gpus <= len(shapes) else None
        placement = free.fit(shape) if shape is not None and shape[0] <= free.max_free() else None
        return placement or free.spread(gpus)

    def _shrink(self, state: ClusterState, free: FreeMap, need: int, actions: list[Action], changed: set[int]) -> None:
        """Grown jobs back to their p*, lowest priority first, until `need` GPUs are free."""
        for job_id in sorted(self._grown, key=lambda i: self._key[i], reverse=True):
            if free.total >= need:
                break
            if job_id in changed:
                continue
            job = state.running[job_id]
            base = self.curve(state, job)[0]
            if job.held_gpus <= base:   # its p* rose with what was learned: not grown any more
                self._grown.discard(job_id)
                continue
            free.give(job.placement)
            placement = self._place(state, free, job, base)
            free.take(placement)
            actions.append(Resize(job_id, placement, _shape_of(placement), self._batch(state, job, base)))
            self._running.touch(self._key[job_id])
            changed.add(job_id)
            self._grown.discard(job_id)
            self._resized[job_id] = state.now
            self._push_crossing(job, state.now, job.attained_at(state.now), sum(map(gpus_of, placement)))

    def _share(self, state: ClusterState, spare: int, admitted: list[tuple[JobView, int]], targets: dict[int, int],
               changed: set[int], actions: list[Action]) -> float | None:
        """Give `spare` GPUs one at a time where they save the most estimated time (targets[job]
        grows); returns when a pass over running jobs that was not due yet should run."""
        if spare <= 0:
            return None
        now, opts = state.now, self.options
        jobs = [job for job, _ in admitted]
        wake = None
        if state.running:
            if now - self._last_grow >= opts.grow_period:
                self._last_grow = now
                for job_id, job in state.running.items():
                    if job_id in changed or now < job.busy_until:
                        continue
                    base, sizes = self.curve(state, job)[:2]
                    if job.held_gpus >= (sizes[-1] if sizes else base):
                        continue
                    since = self._resized.get(job_id, -math.inf)
                    if now - since < opts.resize_interval:
                        wake = since + opts.resize_interval if wake is None else min(wake, since + opts.resize_interval)
                        continue
                    targets[job_id] = job.held_gpus
                    jobs.append(job)
            else:
                wake = self._last_grow + opts.grow_period
        if not jobs:
            return wake
        if self._refresh is not None:
            self._refresh()   # ladders below are read with the measurements reported since the last decision
        tops = {job.job_id: self._top(state, job, targets[job.job_id]) for job in jobs}
        if self._covers(spare, tops, targets):
            # enough to take every job to the top of its ladder: the order of the steps (so the
            # estimates of work left that rank them) cannot matter
            targets.update(tops)
            return wake
        left = {job.job_id: remaining_work(self.model, state, job) for job in jobs}
        by_id = {job.job_id: job for job in jobs}
        heap = [step for job in jobs if (step := self._step(state, job, targets[job.job_id], left[job.job_id]))]
        heapq.heapify(heap)
        while spare > 0 and heap:
            _, job_id, size = heapq.heappop(heap)
            if size - targets[job_id] > spare:   # part of the step, if that is faster still
                rates = self.curve(state, by_id[job_id])[3]
                size = targets[job_id] + spare
                if rates[size] <= rates[targets[job_id]]:
                    continue
            spare -= size - targets[job_id]
            targets[job_id] = size
            step = self._step(state, by_id[job_id], size, left[job_id])
            if step:
                heapq.heappush(heap, step)
        return wake

    def _step(self, state: ClusterState, job: JobView, k: int, left: float) -> tuple[float, int, int] | None:
        """(-seconds saved per added GPU, job, size) of growing from k GPUs to the next size on
        the job's ladder (the concave envelope of its curve), None at the top."""
        base, ladder_sizes, _, rates, _ = self.curve(state, job)
        i = bisect.bisect_right(ladder_sizes, k)   # below p* (it rose with the noise scale): p* next
        size = base if k < base else ladder_sizes[i] if i < len(ladder_sizes) else 0
        if not size or rates[k] <= 0:
            return None
        saved = left * (1.0 / rates[k] - 1.0 / rates[size]) / (size - k)
        return (-saved, job.job_id, size) if saved > 0 else None

    @staticmethod
    def _covers(spare: int, tops: dict[int, int], targets: dict[int, int]) -> bool:
        return sum(tops.values()) - sum(targets[i] for i in tops) <= spare

    def _top(self, state: ClusterState, job: JobView, k: int) -> int:
        """The size repeated _steps take the job to from k GPUs with GPUs to spare: the estimated
        work left is > 0 (state.estimated_remaining), so a step saves time where its rate is higher."""
        base, ladder_sizes, _, rates, _ = self.curve(state, job)
        for size in ([base] if k < base else []) + ladder_sizes[bisect.bisect_right(ladder_sizes, k):]:
            if rates[k] <= 0 or 1.0 / rates[k] - 1.0 / rates[size] <= 0:
                break
            k = size
        return k

    def _grow_running(self, state: ClusterState, free: FreeMap, targets: dict[int, int], changed: set[int],
                      actions: list[Action]) -> None:
        now, cost = state.now, state.restart_cost
        for job_id, k in targets.items():
            job = state.running.get(job_id)
            if job is None or job_id in changed or k <= job.held_gpus:
                continue
            shapes = self.curve(state, job)[2]
            free.give(job.placement)
            placement = free.fit(shapes[k - 1])
            model_now = self._goodput(state, job)
            if placement is None or model_now <= 0 or job.measured_rate <= 0:
                free.take(job.placement)
                continue
            # The measured rate gives the level, the model the gain of the larger shape.
            left = remaining_work(self.model, state, job)
            grown = job.measured_rate * self.curve(state, job)[3][k] / model_now
            saves = left / job.measured_rate - (cost + left / grown)
            if saves <= self.options.marble_grow_gain * cost:
                free.take(job.placement)
                continue
            free.take(placement)
            actions.append(Resize(job_id, placement, shapes[k - 1], self._batch(state, job, k)))
            self._running.touch(self._key[job_id])
            if k > self.curve(state, job)[0]:
                self._grown.add(job_id)
            self._resized[job_id] = now
            self._push_crossing(job, now, job.attained_at(now), k)

    def _batch(self, state: ClusterState, job: JobView, gpus: int) -> int | None:
        """The batch of the job's goodput curve for `gpus` (None: the submitted one)."""
        batches = self.curve(state, job)[4]
        batch = batches[gpus] if gpus < len(batches) else job.batch_size
        return None if batch == job.batch_size else batch

    def _goodput(self, state: ClusterState, job: JobView) -> float:
        """The model's rate of a running job as it runs, as its curve counts (goodput, or the
        throughput at the submitted batch when sizes come from throughput)."""
        bucket = self._noise.bucket(job) if self.wants_noise_scale else None
        if not self.options.goodput_sizing:
            return self.model.rate(job.app, job.shape, job.batch_size)
        rate = self.model.rate(job.app, job.shape, job.batch)
        if job.batch == job.batch_size or bucket is None:
            return rate
        return rate * gain(phi_of(bucket), job.batch_size, job.batch)

    def _wake(self, state: ClusterState, now: float, actions: list[Action], *times: float | None) -> float | None:
        started = {a.job_id for a in actions if isinstance(a, Start)}
        while self._cross and self._cross[0][1] not in state.running and self._cross[0][1] not in started:
            heapq.heappop(self._cross)   # drop stale crossings so the wake-up is a live one
        candidates = [t for t in (*times, self._cross[0][0] if self._cross else None) if t is not None and t > now]
        return min(candidates) if candidates else None
