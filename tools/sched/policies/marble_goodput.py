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
from mlsyskit.tools.sched.policies.step_table import StepTable, lookup
from mlsyskit.tools.sched.state import ClusterState, Decision, JobView


class MarbleGoodput(Pollux):
    name = "marble"
    description = "ours: Pollux-style goodput GPUs and batch on the concave envelope of measured curves, starvation guard"

    def __init__(self, model, options=None) -> None:
        super().__init__(model, options)
        self.wants_noise_scale = self.options.adapt_batch   # off: no noise scale, every batch kept
        self._steps = StepTable()   # _envelope_step's answers
        self._ends: dict[tuple, tuple[tuple[int, int], int, int]] = {}   # _chain_ends' per curve

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
        views: dict[tuple, tuple] = {}   # _view per curve, while no _envelope_step ran

        def step(job_id: int, k: int, room: int) -> tuple[float, int, int] | None:
            """(-gain per GPU, job, size) of the best step from k GPUs within `room` more."""
            curve = curves[job_id]
            hi = min(caps[job_id], k + room)
            view = views.get(curve)
            if view is None:
                view = views[curve] = self._view(curve)
            answers = view[2]   # lookup's, inline (the hot path): the exact answer, else the cap's
            found = answers.get((k, hi)) if answers and k in view[1] else None
            if found is not None and found[0] == view[0]:
                best, size = found[1]
            elif answers and k in view[1] and (answer := lookup(answers, k, hi, curve[4], view[0])) is not None:
                best, size = answer
            else:
                moved = self._moves()
                best, size = self._envelope_step(curve, rates[job_id], k, hi)
                if self._moves() != moved or moved is None:
                    views.clear()   # a stamp or a table moved
                else:
                    del views[curve]   # only this curve's kept answers may be new
            return (-best, job_id, size) if size else None

        heap = [s for i in rates if (s := step(i, 1, gpus))]
        ends = self._chain_ends(curves, rates, {i: size for _, i, size in heap}, gpus)
        if ends is not None:
            counts.update(ends)
            return counts
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

    def _moves(self) -> tuple | None:
        """What any stamp or kept table moves with: the model's version (a refresh that changes
        estimates bumps it with every curve's), the memo's and the step table's clears (None: a
        model without a version, assume it always moves)."""
        version = getattr(self.model, "version", None)
        return None if version is None else (version, self._noise.memo.generation, self._steps.generation)

    def _view(self, curve: tuple) -> tuple:
        """(stamp, goodputs kept under it, kept steps) of a curve, for allocate's fast path: where
        the goodput at k is kept (rate(k), read first, would only re-read it) and a kept step
        answers, _envelope_step would return that answer and change nothing, so it is skipped.
        Valid until the next _envelope_step moves one (only such a call can move a stamp or a table:
        _moves; one that moves none only adds to this curve's)."""
        stamp = self.curve_stamp(curve[0], curve[1])
        row = self._rows.get(curve[:4])
        kept = row[2] if row is not None and row[0] == stamp[0] and row[1] == stamp[1] else {}
        return stamp, kept, self._steps.answers(curve)

    def _chain_ends(self, curves: dict[int, tuple], rates: dict, firsts: dict[int, int], spare: int
                    ) -> dict[int, int] | None:
        """The greedy's sizes when no step in it can be cut short by the GPUs left: then each job
        takes its first step (`firsts`, the heap's) and follows its own envelope steps up to its
        cap, whatever order the greedy takes them in. Sufficient: the jobs' ends (the cap where a
        step is not kept yet) take at most `spare` GPUs, as the GPUs left then always cover each
        job's way to its end and the widest scan it may make. Exact, tables included: a kept end
        only re-reads kept steps and goodputs (what the greedy would), and the rest take the same
        steps as the greedy, in another order, which can matter only if the model or a table moved
        on the way, so where any is taken none may (no samples pending, no table near its size
        limit). None: the greedy runs."""
        ends, open_, bound = {}, [], 0
        for job_id, first in firsts.items():
            curve = curves[job_id]
            end = self._kept_end(curve, first)
            if end is None:
                open_.append(job_id)
                end = curve[4]
            else:
                ends[job_id] = end
            bound += end - 1
            if bound > spare:
                return None
        if open_:
            reads = sum(curves[i][4] for i in open_)   # at most the new entries of any table
            if getattr(self.model, "pending", True) or len(self._noise.memo) + reads > 100_000 \
                    or len(self._steps) + reads > self._steps.limit:
                return None
            for job_id in open_:
                curve, rate, k = curves[job_id], rates[job_id], firsts[job_id]
                while k < curve[4] and (size := self._envelope_step(curve, rate, k, curve[4])[1]):
                    k = size
                ends[job_id] = k
        return ends

    def _kept_end(self, curve: tuple, k: int) -> int | None:
        """The end of a curve's envelope steps from k GPUs (up to its cap) from kept steps alone,
        each with its goodput at k kept (the greedy reads it first), under the curve's current
        stamp; remembered per (curve, k) while the stamp and the kept steps stand. None: one is not."""
        stamp = self.curve_stamp(curve[0], curve[1])
        mark = self._ends.get((curve, k))
        if mark is not None and mark[0] == stamp and mark[1] == self._steps.generation:
            return mark[2]
        row, first = self._rows.get(curve[:4]), k
        if row is None or row[0] != stamp[0] or row[1] != stamp[1]:
            return None
        while k < curve[4]:
            found = self._steps.get(curve, k, curve[4], stamp)
            if found is None or k not in row[2]:
                return None
            if not found[1]:
                break
            k = found[1]
        if len(self._ends) > 100_000:
            self._ends.clear()
        self._ends[(curve, first)] = (stamp, self._steps.generation, k)
        return k

    @staticmethod
    def _scan(rate, w: float, now: float, k: int, hi: int, kept: dict | None = None) -> tuple[float, int]:
        """(gain per GPU, size) of the best step from k GPUs (now = w / rate(k)) to at most hi GPUs
        (size 0: no step gains). `kept`: goodputs by size that rate() would return without side
        effects, read directly until the first one missing (that rate() call may move them)."""
        best, size = 0.0, 0
        for q in range(k + 1, hi + 1):
            r = kept.get(q) if kept else None
            if r is None:
                r, kept = rate(q), None
            gain = (now - w / r) / (q - k)
            if gain > best:
                best, size = gain, q
        return best, size

    def _envelope_step(self, curve: tuple, rate, k: int, hi: int) -> tuple[float, int]:
        """_scan, its answers kept per (curve, k, hi) while the curve's stamp stands. Re-reading
        every larger size at each step was most of allocate's CPU; a hit skips only reads that
        return the same values without side effects (after rate(k), read first as the scan does, no
        refresh is pending), so decisions are unchanged."""
        w = curve[5]
        now = w / rate(k)
        stamp = self.curve_stamp(curve[0], curve[1])
        answer = self._steps.get(curve, k, hi, stamp)
        if answer is not None:
            return answer
        answer = self._scan(rate, w, now, k, hi, self._view(curve)[1])
        if stamp == self.curve_stamp(curve[0], curve[1]):   # nothing moved mid-scan
            self._steps.put(curve, k, hi, stamp, answer)
        return answer

    def decide(self, state: ClusterState) -> Decision:
        decision = super().decide(state)
        # a re-plan that changed something while GPUs were idle: look again after the interval (one
        # that changes nothing waits for the next event, so a lone long job costs no wake-ups)
        if decision.wake_at is None and decision.actions and state.running and state.free.total > 0:
            return Decision(decision.actions, state.now + self.options.optimus_interval)
        return decision
