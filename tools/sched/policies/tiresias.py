"""tiresias: discretised two-dimensional least-attained-service (Gu et al., NSDI'19).

A job's attained service is GPUs x seconds held. Jobs sit in priority queues by attained service
(`tiresias_thresholds` split them); lower queues first, FIFO (by arrival) inside a queue. Each
decision walks jobs in that order and admits each whose requested GPU count still fits in the
cluster's capacity; running jobs left out are preempted (they pay the restart cost when resumed).
Admitted waiting jobs are placed consolidated (fewest nodes, best fit). Jobs get exactly what they
asked for. The policy asks to be woken when a running job will cross into the next queue.

Incremental (ours; the rule is the paper's): the priority order is kept in two sorted indexes,
waiting and running, updated from the state's arrival/finish journals, from the policy's own
starts and preemptions, and at queue crossings (a heap of crossing times). A decision walks the
merged order only until the capacity is used (and at most `backfill_depth` jobs that do not fit
once every running job is seen), and when no waiting job outranks a running one it only fills
free GPUs. The running jobs ranked between two waiting ones are taken in one step when together
they fit (running_order.py: prefix sums of what each keeps), so a walk costs about a bisection
per waiting job it visits, not a step per running job. If the state was not built by applying
this policy's decisions (a fresh state per call, or counts that disagree), the indexes are
rebuilt from it.
"""
from __future__ import annotations

import bisect
import heapq
import math
from bisect import bisect_left

from sortedcontainers import SortedList

from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.running_order import RunningOrder
from mlsyskit.tools.sched.state import Action, ClusterState, Decision, JobView, Preempt, Start, gpus_of
from mlsyskit.tools.sched.throughput import compact_shape

Key = tuple[int, float, int]   # (queue level, rank inside the queue: arrival, job id)
CROSSING_SLACK = 1e-6          # GPU-seconds


class Tiresias(Policy):
    name = "tiresias"
    description = "discretised 2D-LAS with preemption, requested GPUs, consolidated placement"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self._state: ClusterState | None = None
        self.thresholds = self.options.tiresias_thresholds   # attained GPU-seconds between queues

    def level(self, attained: float) -> int:
        # A job woken at its crossing time may fall short of the threshold by float rounding.
        return bisect.bisect_right(self.thresholds, attained + CROSSING_SLACK)

    # ---- the index ------------------------------------------------------------------------------
    def _rebuild(self, state: ClusterState) -> None:
        self._state = state
        self._arrived, self._finished = len(state.arrived), len(state.finished)
        self._key: dict[int, Key] = {}
        self._waiting, self._running = SortedList(), RunningOrder(self._hold_of)
        self._cross: list[tuple[float, int]] = []
        for job in state.queue.values():
            self._add(job, self._waiting, job.attained)
        for job in state.running.values():
            self._add(job, self._running, job.attained_at(state.now))
            self._push_crossing(job, state.now, job.attained_at(state.now), job.held_gpus)

    def rank(self, job: JobView) -> float:
        """Order inside a queue: first come first served (by arrival)."""
        return job.arrival

    def _hold_of(self, job_id: int) -> int:
        return self.holds(self._state, self._state.running[job_id])

    def _add(self, job: JobView, index: SortedList | RunningOrder, attained: float) -> None:
        key = (self.level(attained), self.rank(job), job.job_id)
        self._key[job.job_id] = key
        index.add(key)

    def _push_crossing(self, job: JobView, now: float, attained: float, gpus: int) -> None:
        thresholds = self.thresholds
        i = self.level(attained)
        if i < len(thresholds) and gpus > 0:
            heapq.heappush(self._cross, (now + (thresholds[i] - attained) / gpus, job.job_id))

    def _sync(self, state: ClusterState) -> None:
        if (state is not self._state or len(state.arrived) < self._arrived or len(state.finished) < self._finished):
            self._rebuild(state)
            return
        for job_id in state.finished[self._finished:]:
            key = self._key.pop(job_id, None)
            if key is not None:
                (self._running if key in self._running else self._waiting).discard(key)
        for job_id in state.arrived[self._arrived:]:
            if job_id in state.queue and job_id not in self._key:
                self._add(state.queue[job_id], self._waiting, state.queue[job_id].attained)
        self._arrived, self._finished = len(state.arrived), len(state.finished)
        while self._cross and self._cross[0][0] <= state.now + 1e-9:   # queue crossings due
            _, job_id = heapq.heappop(self._cross)
            job = state.running.get(job_id)
            if job is None:
                continue   # stale: preempted or finished since
            attained = job.attained_at(state.now)
            key = self._key[job_id]
            if self.level(attained) != key[0]:
                self._running.discard(key)
                self._add(job, self._running, attained)
            self._push_crossing(job, state.now, attained, job.held_gpus)
        if len(self._running) != len(state.running) or len(self._waiting) != len(state.queue):
            self._rebuild(state)   # the caller did not apply our decisions as given

    # ---- the decision ---------------------------------------------------------------------------
    def decide(self, state: ClusterState) -> Decision:
        self._sync(state)
        now = state.now
        dropped: list[int] = []
        if self._waiting and (not self._running or self._waiting[0] < self._running[-1]):
            admitted, dropped = self._walk(state, state.spec.total_gpus)
        elif self._waiting and state.free.total > 0:
            admitted = self._admit_waiting(state, state.free.total)   # nothing is preempted
        else:
            admitted = []
        actions: list[Action] = []
        free = state.free.copy()
        if admitted:
            for job_id in self.in_running_order(state, dropped):
                actions.append(Preempt(job_id))
                free.give(state.running[job_id].placement)
                key = self._key[job_id]
                self._running.discard(key)
                self._waiting.add(key)
            for job, gpus in admitted:
                placed = self.place(state, free, job, gpus)
                if placed is None:
                    continue
                placement, shape = placed
                free.take(placement)
                actions.append(Start(job.job_id, placement, shape))
                key = self._key[job.job_id]
                self._waiting.discard(key)
                self._running.add(key)
                self._push_crossing(job, now, job.attained, sum(map(gpus_of, placement)))
        while self._cross and self._cross[0][1] not in state.running and \
                not any(isinstance(a, Start) and a.job_id == self._cross[0][1] for a in actions):
            heapq.heappop(self._cross)   # drop stale crossings so the wake-up is a live one
        wake = self._cross[0][0] if self._cross else math.inf
        return Decision(tuple(actions), None if math.isinf(wake) or wake <= now else wake)

    def grant(self, state: ClusterState, job: JobView, capacity: int) -> int:
        """GPUs a waiting job is admitted with when `capacity` remain (0: it does not fit):
        exactly what it asked for."""
        return job.gpus if job.gpus <= capacity else 0

    def holds(self, state: ClusterState, job: JobView) -> int:
        """GPUs a running job keeps if it stays admitted: all it holds."""
        return job.held_gpus

    def place(self, state: ClusterState, free, job: JobView, gpus: int):
        """(placement, shape) for an admitted job, consolidated; None if the GPUs are fragmented."""
        placement = free.fit(compact_shape(gpus, state.spec.gpus_per_node)) or free.spread(gpus)
        return None if placement is None else (placement, tuple(sorted(map(gpus_of, placement), reverse=True)))

    @staticmethod
    def in_running_order(state: ClusterState, job_ids: list[int]) -> list[int]:
        """`job_ids` (running jobs) in the order of `state.running`."""
        if len(job_ids) <= 1:
            return job_ids
        wanted = set(job_ids)
        return [i for i in state.running if i in wanted]

    def _admit_waiting(self, state: ClusterState, capacity: int) -> list[tuple[JobView, int]]:
        """Admit waiting jobs in priority order while they fit `capacity` (running jobs untouched)."""
        admitted: list[tuple[JobView, int]] = []
        misses, queue, grant = 0, state.queue, self.grant
        depth, any_running = self.options.backfill_depth, bool(state.running)
        for _, _, job_id in self._waiting:
            if capacity <= 0:
                break
            job = queue[job_id]
            gpus = grant(state, job, capacity)
            if gpus:
                capacity -= gpus
                admitted.append((job, gpus))
                continue
            misses += 1
            if misses > depth and not any_running:   # the depth counts once every running job is seen
                break
        return admitted

    def _walk(self, state: ClusterState, capacity: int) -> tuple[list[tuple[JobView, int]], list[int]]:
        """Admit jobs in the merged priority order of waiting and running jobs while they fit
        `capacity` (running jobs with what they keep, `holds`). Returns the admitted jobs and the
        running jobs left out. A job that does not fit is passed over; the walk stops when the
        capacity is used, or after `backfill_depth` misses once every running job was seen.
        Running jobs ranked between two waiting ones are taken in one step when they fit together."""
        admitted: list[tuple[JobView, int]] = []
        dropped: list[int] = []
        keys = self._running.keys
        n = len(keys)
        cum = self._running.prefix(n)
        queue, grant, depth = state.queue, self.grant, self.options.backfill_depth
        misses, i, stopped = 0, 0, False
        for key in self._waiting:
            if i < n:
                j = bisect_left(keys, key, i)   # running jobs ranked ahead of this one
                if j > i:
                    i, capacity, misses, stopped = self._keep(cum, keys, i, j, capacity, misses, dropped)
                    if stopped:
                        break
            if capacity <= 0:
                break
            job = queue[key[2]]
            gpus = grant(state, job, capacity)
            if gpus:
                capacity -= gpus
                admitted.append((job, gpus))
                continue
            misses += 1
            if misses > depth and i == n:
                break
        else:
            if i < n:
                i, capacity, misses, stopped = self._keep(cum, keys, i, n, capacity, misses, dropped)
        dropped.extend(key[2] for key in keys[i:])   # not reached: left out
        return admitted, dropped

    def _keep(self, cum: list[int], keys: list, i: int, j: int, capacity: int, misses: int,
              dropped: list[int]) -> tuple[int, int, int, bool]:
        """Running jobs keys[i:j] in order, each kept if what it keeps fits `capacity`, else
        passed over (`dropped`); returns (next position, capacity, misses, whether the walk stops)."""
        if capacity <= 0:
            return i, capacity, misses, True
        together = cum[j] - cum[i]
        if together <= capacity:   # all of them, in one step
            if together < capacity:
                return j, capacity - together, misses, False
            # the capacity is used up: the walk stops right after the job that used the last GPU
            return bisect_left(cum, cum[i] + capacity, i, j + 1), 0, misses, True
        depth, n = self.options.backfill_depth, len(keys)
        for p in range(i, j):
            if capacity <= 0:
                return p, capacity, misses, True
            gpus = cum[p + 1] - cum[p]
            if gpus <= capacity:
                capacity -= gpus
                continue
            dropped.append(keys[p][2])
            misses += 1
            if misses > depth and p + 1 == n:
                return p + 1, capacity, misses, True
        return j, capacity, misses, False
