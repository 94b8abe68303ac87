"""marble: MARBLE's multi-GPU-aware FIFO scheduling (Han et al., CCGrid'20).

1. Size: a job asking for R GPUs gets p* <= R GPUs, the largest count at which the added GPUs
   still add at least `efficiency_threshold` of a single GPU's throughput each (the efficiency
   curve of its application at its global batch; see `sized_shapes`). Each count p is laid out on its best shape: full
   nodes plus a remainder, or the same nodes split evenly, whichever the model says is faster.
2. Pack: the shape goes best-fit onto nodes (fewest free GPUs that still fit), so several jobs
   share a node and nodes stay busy; nodes are never held exclusively.
3. Order: FIFO. A job whose p* GPUs do not fit may start now on fewer GPUs when that finishes it
   sooner than waiting for p* (the wait is the EASY shadow time on GPU counts). The first job
   that waits keeps a reservation; later jobs backfill around it as in EASY (they end before
   the shadow time or use GPUs the reservation leaves spare), also shrinking where that helps.
"""
from __future__ import annotations

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.policies.base import Policy, register
from mlsyskit.tools.sched.policies.common import gpu_shadow, runtime
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobRecord, Start
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape


def best_shape(model: ThroughputModel, app: str, batch: int, gpus: int, gpus_per_node: int) -> Shape:
    """The faster of the compact layout and the even split over the same number of nodes."""
    compact = compact_shape(gpus, gpus_per_node)
    nodes = len(compact)
    base, rest = divmod(gpus, nodes)
    even = tuple(sorted([base + 1] * rest + [base] * (nodes - rest), reverse=True))
    if even == compact:
        return compact
    return max((compact, even), key=lambda s: (model.rate(app, s, batch), s))


def sized_shapes(model: ThroughputModel, app: str, batch: int, request: int, gpus_per_node: int,
                 threshold: float) -> list[Shape]:
    """Best shapes for 1..p* GPUs (index p-1). Walking p upward from the last accepted size a, p is
    accepted when the GPUs added since a bring on average at least `threshold` single-GPU
    throughputs each: (T(p) - T(a)) / ((p - a) T(1)) >= threshold. A dip in the measured curve
    therefore does not end the walk if a larger size recovers."""
    shapes = [best_shape(model, app, batch, p, gpus_per_node) for p in range(1, request + 1)]
    rates = [model.rate(app, s, batch) for s in shapes]
    accepted = 0
    for p in range(1, request):
        if (rates[p] - rates[accepted]) / ((p - accepted) * rates[0]) >= threshold:
            accepted = p
    return shapes[: accepted + 1]


@register
class Marble(Policy):
    name = "marble"
    description = "FIFO, efficient GPUs per job from its scaling curve, best-fit node sharing, EASY"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._sizes: dict[tuple[str, int, int, int], list[Shape]] = {}

    def shapes_for(self, job: JobRecord, gpus_per_node: int) -> list[Shape]:
        key = (job.spec.app, job.spec.batch_size, job.spec.gpus, gpus_per_node)
        shapes = self._sizes.get(key)
        if shapes is None:
            shapes = sized_shapes(self.model, *key, self.options.efficiency_threshold)
            self._sizes[key] = shapes
        return shapes

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
        waits: dict[tuple[int, int], float] = {}
        for job in state.queue.values():
            if free.total == 0:
                break
            if shadow is not None:
                scanned += 1
                if scanned > self.options.backfill_depth:
                    break
            shapes = self.shapes_for(job, gpn)
            choice = self._choose(state, free, job, shapes, shadow, extra, waits)
            if choice is None:
                if shadow is None:
                    shadow, extra = gpu_shadow(state, free.total, sum(shapes[-1]))
                continue
            placement, shape, in_time = choice
            if shadow is not None and not in_time:
                extra -= sum(shape)
            free.take(placement)
            actions.append(Start(job.spec.job_id, placement, shape))
        return actions, shadow, extra

    def _choose(self, state: ClusterState, free: FreeMap, job: JobRecord, shapes: list[Shape],
                shadow: float | None, extra: int, waits: dict[tuple[int, int], float]
                ) -> tuple[Placement, Shape, bool] | None:
        """The largest shape (at most p*) that fits now and respects the reservation; a smaller
        shape than p* only if it finishes the job sooner than waiting for p* would."""
        now, cost = state.now, state.restart_cost
        target = shapes[-1]
        finish_wait = None
        widest = free.max_free()
        for gpus in range(min(len(shapes), free.total), 0, -1):  # shapes[p - 1] has p GPUs
            shape = shapes[gpus - 1]
            if shape[0] > widest:
                continue  # no node has that many GPUs free
            placement = free.fit(shape)
            if placement is None:
                continue
            run = runtime(self.model, job, shape, now, cost)
            in_time = shadow is None or now + run <= shadow
            if not in_time and gpus > extra:
                continue
            if shape is not target:
                if finish_wait is None:
                    key = (sum(target), free.total)
                    if key not in waits:
                        waits[key] = gpu_shadow(state, free.total, sum(target))[0]
                    finish_wait = waits[key] + runtime(self.model, job, target, now, cost)
                if now + run >= finish_wait:
                    return None
            return placement, shape, in_time
        return None
