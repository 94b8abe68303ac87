"""marble (ours; the default): Pollux's goodput allocation over MARBLE's measured scaling curves.

What it shares with `pollux` (policies.pollux): every job's curve is goodput, the learned
throughput at the best global batch times the statistical efficiency at its measured gradient
noise scale (policies.goodput); every job first gets one GPU while GPUs last, then GPUs go where
Pollux's objective at p = -1 gains most (1/S(k) - 1/S(k'), S = goodput / goodput on one GPU), up
to `elastic_max_scale` x the request; a job that reports a new noise scale moves to its best batch
in place (Rebatch, no restart).

What MARBLE adds:
- Steps along the curve's upper concave envelope. Throughput drops where a job first spans two
  nodes (e.g. imagenet on 6-GPU nodes: 8 GPUs on 6+2 run slower than 6 on one node), so the
  one-GPU-at-a-time greedy stops at the node boundary however many GPUs are idle; here each step
  goes to the size with the best gain per added GPU over every larger size (the next vertex of the
  envelope), so a job crosses the dip when the size beyond it pays.
- Re-plans again after `optimus_interval` when a re-plan changed something while GPUs were idle
  (the event-driven re-plan alone can leave a long job on its old size once arrivals stop).
- A starvation guard: a job waiting `starvation_s` gets its first GPU ahead of every other.
- Bounded restarts: running jobs change size only at a re-plan, at most every `optimus_interval`.
"""
from __future__ import annotations

import heapq

from mlsyskit.tools.sched.policies.pollux import Pollux
from mlsyskit.tools.sched.state import ClusterState, Decision, JobView


class MarbleGoodput(Pollux):
    name = "marble"
    description = "ours: Pollux-style goodput GPUs and batch on the concave envelope of measured curves, starvation guard"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self.wants_noise_scale = self.options.adapt_batch   # off: no noise scale, every batch kept
        self._steps: dict[tuple, tuple[tuple[int, int], tuple[float, int]]] = {}   # _envelope_step's, stamped

    def order(self, state: ClusterState, jobs) -> list[JobView]:
        """Arrival order, jobs that have waited `starvation_s` since they (re)entered the queue first."""
        limit, now = self.options.starvation_s, state.now
        return sorted(jobs, key=lambda j: (bool(j.placement) or now - j.since < limit, j.arrival, j.job_id))

    def queue_order(self, state: ClusterState):
        return self.order(state, state.queue.values())

    def allocate(self, state: ClusterState, jobs: list[JobView], gpus: int) -> dict[int, int]:
        """GPU counts per job id for `jobs` (in order) sharing `gpus`: one each, then envelope steps
        by the largest gain per added GPU (module docstring)."""
        gpn = state.spec.gpus_per_node
        counts, weight, by_id, caps, rates, gpus = self.one_gpu_each(state, jobs, gpus)

        curves = {i: (by_id[i].app, by_id[i].batch_size, self._noise.bucket(by_id[i]), gpn, caps[i], weight[i])
                  for i in rates}

        def step(job_id: int, k: int, room: int) -> tuple[float, int, int] | None:
            """(-gain per GPU, job, size) of the best step from k GPUs within `room` more."""
            best, size = self._envelope_step(curves[job_id], rates[job_id], k, min(caps[job_id], k + room))
            return (-best, job_id, size) if size else None

        heap = [s for i in rates if (s := step(i, 1, gpus))]
        heapq.heapify(heap)
        while gpus > 0 and heap:
            _, job_id, size = heapq.heappop(heap)
            k = counts[job_id]
            if size - k > gpus:   # fewer GPUs left than the step takes: the best step that fits
                s = step(job_id, k, gpus)
                if s:
                    heapq.heappush(heap, s)
                continue
            gpus -= size - k
            counts[job_id] = size
            if size < caps[job_id] and (s := step(job_id, size, gpus)):
                heapq.heappush(heap, s)
        return counts

    @staticmethod
    def _scan(rate, w: float, now: float, k: int, hi: int) -> tuple[float, int]:
        """(gain per GPU, size) of the best step from k GPUs (now = w / rate(k)) to at most hi GPUs
        (size 0: no step gains)."""
        best, size = 0.0, 0
        for q in range(k + 1, hi + 1):
            gain = (now - w / rate(q)) / (q - k)
            if gain > best:
                best, size = gain, q
        return best, size

    def _curve_stamp(self, app: str, batch: int) -> tuple[int, int]:
        """Moves whenever the curve's goodputs may: the model's estimates for (app, batch) (what
        best_batch's memo keys on; `version` for a model without per-curve ones) or a memo clear."""
        versions = getattr(self.model, "versions", None)
        mark = versions.get((app, batch), 0) if versions is not None else getattr(self.model, "version", 0)
        return mark, self._noise.memo.generation

    def _envelope_step(self, curve: tuple, rate, k: int, hi: int) -> tuple[float, int]:
        """_scan, its answers kept per (curve, k, hi) while the curve's stamp stands. Re-reading
        every larger size at each step was most of allocate's CPU; a hit skips only reads that
        return the same values without side effects (after rate(k), read first as the scan does, no
        refresh is pending), so decisions are unchanged. An answer up to the cap also serves a
        smaller bound: the range is a prefix, so a best size within it (or none) is its answer too."""
        w = curve[5]
        now = w / rate(k)
        stamp = self._curve_stamp(curve[0], curve[1])
        found = self._steps.get((curve, k, hi))
        if found is not None and found[0] == stamp:
            return found[1]
        full = self._steps.get((curve, k, curve[4]))
        if full is not None and full[0] == stamp and full[1][1] <= hi:
            return full[1]
        answer = self._scan(rate, w, now, k, hi)
        if stamp == self._curve_stamp(curve[0], curve[1]):   # nothing moved mid-scan
            if len(self._steps) > 100_000:
                self._steps.clear()
            self._steps[(curve, k, hi)] = (stamp, answer)
        return answer

    def decide(self, state: ClusterState) -> Decision:
        decision = super().decide(state)
        # a re-plan that changed something while GPUs were idle: look again after the interval (one
        # that changes nothing waits for the next event, so a lone long job costs no wake-ups)
        if decision.wake_at is None and decision.actions and state.running and state.free.total > 0:
            return Decision(decision.actions, state.now + self.options.optimus_interval)
        return decision
