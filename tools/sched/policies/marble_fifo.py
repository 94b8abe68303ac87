"""marble-fifo: MARBLE's multi-GPU-aware FIFO scheduling (Han et al., CCGrid'20), a baseline.

1. Size: a job asking for R GPUs gets p* <= R GPUs, where the marginal gain of one more GPU
   (on the concave envelope of its application's throughput curve at its global batch) drops
   below `efficiency_threshold` single-GPU throughputs (`sized_shapes`). Each count p is laid
   out on its best shape: full nodes plus a remainder, or the same nodes split evenly, whichever
   the model says is faster. Under queue pressure (the waiting jobs' p* add up to more than the
   free GPUs) the bar is `pressure_threshold`: sizing for the cluster's throughput, not one job's.
2. Pack: the shape goes best-fit onto nodes (fewest free GPUs that still fit), so several jobs
   share a node and nodes stay busy; nodes are never held exclusively.
3. Order: FIFO. A job whose p* GPUs do not fit may start now on fewer GPUs when that finishes it
   sooner than waiting for p* (the wait is the EASY shadow time on GPU counts). The first job
   that waits keeps a reservation; later jobs backfill around it as in EASY (they end before
   the shadow time or use GPUs the reservation leaves spare), also shrinking where that helps.
"""
from __future__ import annotations

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.common import gpu_shadow, remaining_work, runtime
from mlsyskit.tools.sched.policies.sizing import sized_shapes
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobView, Start


class MarbleFifo(Policy):
    name = "marble-fifo"
    description = "FIFO, efficient GPUs per job from its scaling curve, best-fit node sharing, EASY"
    memoise_refusals = True

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._sizes: dict[tuple[str, int, int, int, float], list[Shape]] = {}
        self._fresh: dict[tuple, float] = {}   # estimates of never-started jobs, this decision only
        self._fresh_at: tuple[float, int] | None = None

    def shapes_for(self, job: JobView, gpus_per_node: int, threshold: float | None = None) -> list[Shape]:
        thr = self.options.efficiency_threshold if threshold is None else threshold
        key = (job.app, job.batch_size, job.gpus, gpus_per_node, thr)
        shapes = self._sizes.get(key)
        if shapes is None:
            shapes = sized_shapes(self.model, *key)
            self._sizes[key] = shapes
        return shapes

    def remaining(self, state: ClusterState, job: JobView) -> float:
        """remaining_work, memoised within one decision for jobs that never ran (a scan of a long
        queue then estimates each kind of job once: they differ only in application and request)."""
        if job.progress or job.placement:
            return remaining_work(self.model, state, job)
        moment = (state.now, len(state.finished))
        if moment != self._fresh_at:
            self._fresh, self._fresh_at = {}, moment
        key = (job.app, job.gpus, job.batch_size)
        if key not in self._fresh:
            self._fresh[key] = remaining_work(self.model, state, job)
        return self._fresh[key]

    def decide(self, state: ClusterState) -> Decision:
        if not state.queue or state.free.total == 0:
            return Decision()
        free = state.free.copy()
        actions, _, _ = self.place_queue(state, free)
        return Decision(tuple(actions))

    def place_queue(self, state: ClusterState, free: FreeMap) -> tuple[list[Action], float | None, int]:
        """FIFO with shrink-or-wait and EASY backfilling behind the first blocked job; takes from `free`.
        Returns the starts, and the reservation left at the end: its shadow time (None when no job
        waits) and the GPUs it leaves spare."""
        gpn = state.spec.gpus_per_node
        actions: list[Action] = []
        shadow, extra = None, 0
        scanned = 0
        # Queue pressure: the jobs from this one on want (at their p*) more GPUs than are free. A
        # GPU's alternative use is then a waiting job's first GPU, worth a whole single GPU, so the
        # bar for the GPUs a job adds rises to `pressure_threshold`. `window` sums p* from the
        # current job up to a look-ahead pointer that stops once the sum exceeds the free GPUs,
        # so a long queue is not summed in full.
        pressure = max(self.options.efficiency_threshold, self.options.pressure_threshold)
        ahead, window = iter(state.queue.values()), 0
        waits: dict[tuple[int, int], float] = {}
        # A job that never ran differs from another of its kind (application, request, batch) in
        # nothing `_choose` reads, so while the free GPUs and the reservation stay as they are, one
        # refusal answers for every later job of that kind: a long scan behind a blocked head then
        # costs a lookup per job, not a placement search (cleared at every start;
        # `memoise_refusals = False` gives the full rescan the tests compare with).
        refused: set[tuple[str, int, int, bool]] = set()
        for job in state.queue.values():
            if free.total == 0:
                break
            quiet = self.shapes_for(job, gpn)
            if shadow is not None:
                scanned += 1
                if scanned > self.options.backfill_depth:
                    break
            while window <= free.total and (nxt := next(ahead, None)) is not None:
                window += sum(self.shapes_for(nxt, gpn)[-1])
            pressured = window > free.total
            window -= sum(quiet[-1])
            kind = None if job.started_before else (job.app, job.gpus, job.batch_size, pressured)
            if kind is not None and kind in refused:
                continue
            shapes = self.shapes_for(job, gpn, pressure) if pressured else quiet
            choice = self._choose(state, free, job, shapes, shadow, extra, waits)
            if choice is None:
                if shadow is None:
                    shadow, extra = gpu_shadow(state, free.total, sum(shapes[-1]))
                elif kind is not None and self.memoise_refusals:
                    refused.add(kind)
                continue
            placement, shape, in_time = choice
            if shadow is not None and not in_time:
                extra -= sum(shape)
            free.take(placement)
            refused.clear()
            actions.append(Start(job.job_id, placement, shape))
        return actions, shadow, extra

    def _choose(self, state: ClusterState, free: FreeMap, job: JobView, shapes: list[Shape],
                shadow: float | None, extra: int, waits: dict[tuple[int, int], float]
                ) -> tuple[Placement, Shape, bool] | None:
        """The largest shape (at most p*) that fits now and respects the reservation; a smaller
        shape than p* only if it finishes the job sooner than waiting for p* would."""
        now = state.now
        target = shapes[-1]
        work: float | None = None
        finish_wait = None
        widest = free.max_free()
        if shadow is not None and extra <= 0:
            # Backfilling with no spare GPUs: only a job that ends before the shadow may start. We
            # take the largest shape it may use as its fastest (true where the model is monotone;
            # a measured dip, or model error, can make a smaller shape faster: then this errs
            # towards waiting), so one estimate settles it instead of one per size.
            work = self.remaining(state, job)
            largest = shapes[min(len(shapes), free.total) - 1]
            if now + runtime(self.model, state, job, largest, work) > shadow:
                return None
        for gpus in range(min(len(shapes), free.total), 0, -1):  # shapes[p - 1] has p GPUs
            shape = shapes[gpus - 1]
            placement = free.fit(shape) if shape[0] <= widest else None
            if placement is None and gpus == len(shapes) and not state.spec.can_hold(shape):
                # p* laid out for the largest node size may not fit these node sizes at all:
                # then any nodes with free GPUs (mixed clusters; never blocks forever)
                placement = free.spread(gpus)
                shape = target = tuple(sorted((g for _, g in placement), reverse=True)) if placement else shape
            if placement is None:
                continue
            if work is None:
                work = self.remaining(state, job)
            run = runtime(self.model, state, job, shape, work)
            in_time = shadow is None or now + run <= shadow
            if not in_time and gpus > extra:
                continue
            if shape is not target:
                if finish_wait is None:
                    key = (sum(target), free.total)
                    if key not in waits:
                        waits[key] = gpu_shadow(state, free.total, sum(target))[0]
                    finish_wait = waits[key] + runtime(self.model, state, job, target, work)
                if now + run >= finish_wait:
                    return None
            return placement, shape, in_time
        return None
