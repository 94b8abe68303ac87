"""Trace-driven cluster simulator: a thin driver around a policy on the core event loop.

Events: job arrivals (all jobs arriving at one instant are queued together), job completions,
and policy wake-ups. After any of them one decision runs at the same virtual time; its actions
are applied one by one, and every GPU taken must be free (FreeMap raises otherwise), so a policy
can never allocate more GPUs than exist. All per-event work is incremental: queue and running
sets are insertion-ordered dicts, end estimates a sorted list, free GPUs bucketed by node.

Ground truth (true work, true rate, loss curves) lives in `JobRecord`s and `ground_truth`; the
policy sees `JobView`s only (see state.py): reported progress, measured rate, loss reports and
the history of finished jobs.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mlsyskit.core.sim import EventHandle, EventLoop
from mlsyskit.core.telemetry import Telemetry
from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap
from mlsyskit.tools.sched.efficiency import gain
from mlsyskit.tools.sched.ground_truth import (
    LossCurve,
    loss_curve,
    measured_noise_scale,
    measured_rate,
    noise_scale_segments,
    noisy_loss,
)
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.state import (
    ClusterState,
    JobRecord,
    JobSpec,
    JobView,
    Preempt,
    Rebatch,
    Resize,
    Start,
    estimated_remaining,
    gpus_of,
)
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape

RELEASES = (Preempt, Resize)   # actions that give GPUs back (applied before any start)
LOSS_REPORT_S = 300.0    # a running job reports its loss at most this often (seconds)
MAX_LOSS_REPORTS = 64    # older reports are thinned to every other one beyond this
GNS_REPORT_S = 1800.0    # a running job reports its gradient noise scale this often (seconds)


class PolicyError(RuntimeError):
    """A policy returned an action that cannot be applied (a bug in the policy)."""


@dataclass
class SimResult:
    policy: str
    cluster: str
    jobs: list[JobRecord]
    finish: dict[int, float]
    makespan_start: float
    makespan_end: float
    gpu_seconds_held: float
    effective_gpu_seconds: float
    timeline: list[tuple[float, int, float]]   # (time, GPUs allocated, effective GPUs)
    counters: dict[str, int]
    ideal: dict[int, float] = field(default_factory=dict)   # run time alone on the GPUs asked (compact)
    decision_ms: list[float] = field(default_factory=list)  # wall time; not part of the deterministic result
    wall_s: float = 0.0
    events: int = 0


def check_jobs(jobs: list[JobSpec], spec: ClusterSpec) -> None:
    """Refuse a trace the replay could not run faithfully (ValueError naming a culprit)."""
    if not jobs:
        raise ValueError("the workload has no jobs")
    too_big = [j.name for j in jobs if j.gpus > spec.total_gpus]
    if too_big:
        raise ValueError(f"{len(too_big)} job(s) ask for more GPUs than the cluster has ({spec.total_gpus}), "
                         f"e.g. {too_big[0]}")
    # A NaN arrival would never compare as due (the replay would spin); infinite work never ends.
    bad = [j.name for j in jobs if not (math.isfinite(j.arrival) and 0 < j.work < math.inf)]
    if bad:
        raise ValueError(f"{len(bad)} job(s) have a non-finite arrival or no finite positive work, e.g. {bad[0]}")
    names: set[str] = set()
    ids: set[int] = set()
    for j in jobs:
        if j.name in names or j.job_id in ids:
            raise ValueError(f"duplicate job name or id: {j.name} (id {j.job_id}); every job needs its own")
        names.add(j.name)
        ids.add(j.job_id)


class Simulator:
    def __init__(self, spec: ClusterSpec, policy: Policy, model: ThroughputModel, jobs: list[JobSpec],
                 restart_cost: float = 30.0, telemetry: Telemetry | None = None,
                 on_finish: Callable[[int], None] | None = None, seed: int = 0, rate_noise: float = 0.03,
                 samples: list | None = None) -> None:
        check_jobs(jobs, spec)
        if not (math.isfinite(restart_cost) and restart_cost >= 0):
            raise ValueError(f"restart cost must be a finite number of seconds >= 0, got {restart_cost}")
        if not 0 <= rate_noise < 0.5:
            raise ValueError(f"rate noise must be in [0, 0.5), got {rate_noise}")
        for j in jobs:
            model.check_app(j.app)
        self.spec, self.policy, self.model = spec, policy, model
        self.seed, self.rate_noise = seed, rate_noise
        self.jobs = sorted(jobs, key=lambda j: (j.arrival, j.job_id))
        self.loop = EventLoop()
        self.state = ClusterState(spec, FreeMap(spec), restart_cost=restart_cost)
        if samples is not None:   # the policy's learned model reads the measurements from this list
            self.state.samples = samples
        self.telemetry = telemetry or Telemetry(clock=self.loop.clock)
        self.on_finish = on_finish
        self.records = {j.job_id: JobRecord(j) for j in self.jobs}
        self.curves: dict[int, LossCurve] = {j.job_id: loss_curve(seed, j) for j in self.jobs}
        self.views = {j.job_id: JobView.of(j, self.curves[j.job_id].target) for j in self.jobs}
        self._wants_losses = getattr(policy, "wants_loss_reports", None)   # callable(now) -> bool
        self._wants_gns = bool(getattr(policy, "wants_noise_scale", False))
        self._phis: dict[int, tuple[float, ...]] = {}   # hidden noise scale per slice of work (efficiency.py)
        self._gns_event: dict[int, EventHandle] = {}    # a running job's next noise-scale report
        self._eff: dict[int, float] = {}                # effective GPUs each running job added
        self._gains: dict[int, dict[int, tuple[float, ...]]] = {}   # job -> batch -> its gains per slice
        self._last_report: dict[int, float] = {}
        self._released: dict[int, object] = {}     # placement a resized job gave back, for its event
        self.finish: dict[int, float] = {}
        self._next_arrival = 0
        self._completion: dict[int, EventHandle] = {}
        self._decision_pending = False
        self._wake: EventHandle | None = None
        self._effective_now = 0.0
        self._gpu_seconds = 0.0
        self.timeline: list[tuple[float, int, float]] = []
        self.decision_ms: list[float] = []
        self.counters = {"starts": 0, "preemptions": 0, "resizes": 0, "rebatches": 0, "decisions": 0}

    # ---- events -------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        self.loop.schedule_at(self.jobs[0].arrival, self._arrive)
        self.loop.run()
        if len(self.finish) != len(self.jobs):
            stuck = len(self.jobs) - len(self.finish)
            raise PolicyError(f"policy {self.policy.name} left {stuck} job(s) unfinished with no event pending")
        end = max(self.finish.values())
        gpn = self.spec.gpus_per_node
        ideal = {j.job_id: j.work / self.model.rate(j.app, compact_shape(j.gpus, gpn), j.batch_size) for j in self.jobs}
        return SimResult(self.policy.name, str(self.spec), list(self.records.values()), self.finish,
                         self.jobs[0].arrival, end, self._gpu_seconds, self._effective_gpu_seconds(),
                         self.timeline, dict(self.counters), ideal, self.decision_ms,
                         time.perf_counter() - wall0, self.loop.events_run)

    def _arrive(self) -> None:
        now = self.loop.now()
        while self._next_arrival < len(self.jobs) and self.jobs[self._next_arrival].arrival <= now:
            spec = self.jobs[self._next_arrival]
            self.records[spec.job_id].since = now
            view = self.views[spec.job_id]
            view.since = now
            self.state.queue[spec.job_id] = view
            self.state.arrived.append(spec.job_id)
            self._next_arrival += 1
        if self._next_arrival < len(self.jobs):
            self.loop.schedule_at(self.jobs[self._next_arrival].arrival, self._arrive)
        self._request_decision()

    def _complete(self, job_id: int) -> None:
        now = self.loop.now()
        rec = self.records[job_id]
        self._stop(rec, now)
        self._gains.pop(job_id, None)
        rec.done = rec.spec.work
        self.views[job_id].progress = rec.spec.work
        self.state.history.add(rec.spec.app, rec.spec.work)   # the scheduler learns a finished job's size
        self.finish[job_id] = now
        self.state.finished.append(job_id)
        self.telemetry.event("finish", job=rec.spec.name, jct=now - rec.spec.arrival)
        if self.on_finish is not None:
            self.on_finish(len(self.finish))
        self._request_decision()

    def _request_decision(self) -> None:
        if not self._decision_pending:
            self._decision_pending = True
            self.loop.schedule(0.0, self._decide)

    def _decide(self) -> None:
        self._decision_pending = False
        now = self.loop.now()
        self.state.now = now
        if self._wants_losses is not None and self._wants_losses(now):
            for job_id in self.state.running:
                if now - self._last_report.get(job_id, -math.inf) >= LOSS_REPORT_S:
                    self._report_loss(self.records[job_id], now)
        t0 = time.perf_counter()
        decision = self.policy.decide(self.state)
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)
        self.counters["decisions"] += 1
        # Releases first, then takes: a policy plans on a scratch copy where all its releases
        # happened before its placements, so the order inside `actions` does not matter.
        releases = [a for a in decision.actions if isinstance(a, RELEASES)]
        for action in releases:
            self._release(action, now)
        for action in decision.actions:
            self._apply(action, now)
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        if decision.wake_at is not None and decision.wake_at > now and (self.state.running or self.state.queue):
            self._wake = self.loop.schedule_at(decision.wake_at, self._request_decision)
        sample = (now, self.spec.total_gpus - self.state.free.total, self._effective_now)
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = sample
        else:
            self.timeline.append(sample)

    def _report_loss(self, rec: JobRecord, now: float) -> None:
        """The job reports (samples processed, loss), as a training script logs it."""
        view, done = self.views[rec.spec.job_id], rec.done_at(now)
        reports = view.loss_reports
        if reports and reports[-1][0] >= done:
            return
        reports.append((done, noisy_loss(self.seed, rec.spec, self.curves[rec.spec.job_id], done, len(reports))))
        if len(reports) > MAX_LOSS_REPORTS:
            view.loss_reports = reports[::-2][::-1]   # keep the newest and every other one before it
        self._last_report[rec.spec.job_id] = now

    # ---- actions ------------------------------------------------------------------------------
    def _release(self, action: Preempt | Resize, now: float) -> None:
        rec = self.records.get(action.job_id)
        if rec is None or action.job_id not in self.state.running:
            raise PolicyError(f"{self.policy.name}: {type(action).__name__.lower()} of job {action.job_id}, "
                              "which is not running")
        released = rec.placement
        self._stop(rec, now)
        rec.restarts += 1
        self.views[action.job_id].restarts = rec.restarts
        if isinstance(action, Preempt):
            self.state.queue[action.job_id] = self.views[action.job_id]
            self.counters["preemptions"] += 1
            self.telemetry.event("preempt", job=rec.spec.name, released=released)
        else:
            self._released[action.job_id] = released

    def _apply(self, action: Start | Preempt | Resize, now: float) -> None:
        rec = self.records.get(action.job_id)
        if rec is None:
            raise PolicyError(f"{self.policy.name}: unknown job {action.job_id}")
        if isinstance(action, Start):
            if action.job_id not in self.state.queue:
                raise PolicyError(f"{self.policy.name}: started job {rec.spec.name}, which is not waiting")
            del self.state.queue[action.job_id]
            self._run(rec, action.placement, action.shape, now, restart=rec.started_before, batch=action.batch)
            self.counters["starts"] += 1
            self.telemetry.event("start", job=rec.spec.name, placement=action.placement)
        elif isinstance(action, Preempt):
            pass  # released above
        elif isinstance(action, Rebatch):
            self._rebatch(rec, action.batch, now)
        elif isinstance(action, Resize):
            self._run(rec, action.placement, action.shape, now, restart=True, batch=action.batch)
            self.counters["resizes"] += 1
            self.telemetry.event("resize", job=rec.spec.name, placement=action.placement,
                                 released=self._released.pop(action.job_id))
        else:
            raise PolicyError(f"{self.policy.name}: unknown action {action!r}")

    def _run(self, rec: JobRecord, placement, shape, now: float, restart: bool, batch: int | None = None) -> None:
        try:
            self.state.free.take(placement)
        except (ValueError, IndexError, KeyError) as e:
            raise PolicyError(f"{self.policy.name}: bad placement for {rec.spec.name}: {e}") from None
        shape = tuple(sorted(shape if shape is not None else (g for _, g in placement), reverse=True))
        if sum(shape) > sum(map(gpus_of, placement)) or sum(shape) == 0:
            raise PolicyError(f"{self.policy.name}: {rec.spec.name} computes on {shape} but holds {placement}")
        rec.placement, rec.shape, rec.since = placement, shape, now
        rec.busy_until = now + (self.state.restart_cost if restart else 0.0)
        if rec.first_start is None:
            rec.first_start = now
        rec.started_before = True
        view = self.views[rec.spec.job_id]
        view.placement, view.shape, view.since, view.busy_until = placement, shape, now, rec.busy_until
        view.first_start, view.started_before = rec.first_start, True
        self._go(rec, batch, now, measure=True)
        self.state.running[rec.spec.job_id] = view

    def _go(self, rec: JobRecord, batch: int | None, now: float, measure: bool) -> None:
        """Run `rec` at `batch` from now: its true rate and end, the next noise-scale report, and
        what the scheduler sees (a measured rate, its own estimate of the end)."""
        spec, job_id = rec.spec, rec.spec.job_id
        batch = spec.batch_size if batch is None else batch
        if not 1 <= batch <= 1e7:
            raise PolicyError(f"{self.policy.name}: {spec.name} given a global batch of {batch}")
        rec.batch, rec.rate = batch, self.model.rate(spec.app, rec.shape, batch)
        phis = self._phis_of(spec) if self._wants_gns or batch != spec.batch_size else ()
        rec.gains = self._gains_of(spec, batch, phis) if batch != spec.batch_size else ()
        rec.end = max(rec.busy_until, now) + rec.seconds_left()
        self._completion[job_id] = self.loop.schedule_at(rec.end, lambda: self._complete(job_id))
        self._eff[job_id] = speedup = self._speedup(rec)
        self._effective_now += speedup
        view = self.views[job_id]
        if phis and (measure or not view.noise_scale):
            k = min(int(rec.done / spec.work * len(phis)), len(phis) - 1)
            view.noise_scale = measured_noise_scale(self.seed, spec, f"{rec.restarts}/{k}", phis[k])
        if phis and self._wants_gns and measure:
            self._next_report(rec, now, 0)
        # measured throughput (samples/s at `batch`), journalled for the learned model; the view's
        # rate is in samples at the submitted batch, by the efficiency the measured noise scale gives
        raw = measured_rate(self.seed, spec, rec.restarts, rec.rate, self.rate_noise)
        self.state.samples.append((spec.app, rec.shape, batch, raw))
        view.batch = batch
        view.measured_rate = raw if not rec.gains else raw * gain(view.noise_scale, spec.batch_size, batch)
        left = estimated_remaining(self.state.history, view, now, view.measured_rate)
        view.est_end = max(rec.busy_until, now) + left / view.measured_rate
        self.state.by_end.add((view.est_end, job_id))

    def _phis_of(self, spec: JobSpec) -> tuple[float, ...]:
        phis = self._phis.get(spec.job_id)
        if phis is None:
            phis = self._phis[spec.job_id] = noise_scale_segments(self.seed, spec.name, spec.app)
        return phis

    def _gains_of(self, spec: JobSpec, batch: int, phis: tuple[float, ...]) -> tuple[float, ...]:
        """Progress per sample at `batch` per slice of the job's work (jobs move between a few batches)."""
        mine = self._gains.setdefault(spec.job_id, {})
        gains = mine.get(batch)
        if gains is None:
            gains = mine[batch] = tuple(gain(p, spec.batch_size, batch) for p in phis)
        return gains

    def _next_report(self, rec: JobRecord, now: float, n: int) -> None:
        """A running job reports its noise scale every GNS_REPORT_S while it runs (times that
        depend on its run time only, never on its true work); the policy reads it at its next
        decision (state.noise_reports)."""
        job_id = rec.spec.job_id
        self._gns_event[job_id] = self.loop.schedule_at(now + GNS_REPORT_S, lambda: self._report_noise(job_id, n + 1))

    def _report_noise(self, job_id: int, n: int) -> None:
        rec, now = self.records[job_id], self.loop.now()
        phis = self._phis[job_id]
        k = min(int(rec.done_at(now) / rec.spec.work * len(phis)), len(phis) - 1)
        self.views[job_id].noise_scale = measured_noise_scale(self.seed, rec.spec, f"{rec.restarts}/r{n}", phis[k])
        self.state.noise_reports.append(job_id)
        self._next_report(rec, now, n)

    def _rebatch(self, rec: JobRecord, batch: int, now: float) -> None:
        job_id = rec.spec.job_id
        if job_id not in self.state.running:
            raise PolicyError(f"{self.policy.name}: rebatch of job {job_id}, which is not running")
        self._settle(rec, now, stop=False)
        view = self.views[job_id]
        self.state.by_end.remove((view.est_end, job_id))
        view.progress, view.attained, view.since = rec.done, rec.attained, now
        self._go(rec, batch, now, measure=False)
        self.counters["rebatches"] += 1

    def _settle(self, rec: JobRecord, now: float, stop: bool = True) -> None:
        """Progress and service up to now; its end event cancelled (and its reports when it stops)."""
        rec.done = min(rec.spec.work, rec.done_at(now))
        held = rec.held_gpus
        rec.attained += held * (now - rec.since)
        self._gpu_seconds += held * (now - rec.since)
        rec.since = now
        self._completion.pop(rec.spec.job_id).cancel()
        event = self._gns_event.pop(rec.spec.job_id, None) if stop else None
        if event is not None:
            event.cancel()
        self._effective_now -= self._eff.pop(rec.spec.job_id)

    def _stop(self, rec: JobRecord, now: float) -> None:
        """Settle progress and release GPUs of a running job."""
        self._settle(rec, now)
        self.state.free.give(rec.placement)
        view = self.views[rec.spec.job_id]
        self.state.by_end.remove((view.est_end, rec.spec.job_id))
        del self.state.running[rec.spec.job_id]
        if self._wants_losses is not None and rec.done < rec.spec.work:
            self._report_loss(rec, now)
        view.progress, view.attained, view.since = rec.done, rec.attained, now   # the job's step counter
        view.placement, view.shape, view.measured_rate, view.est_end = (), (), 0.0, math.inf
        rec.placement, rec.shape, rec.rate, rec.end = (), (), 0.0, math.inf

    def _speedup(self, rec: JobRecord) -> float:
        """Effective GPUs: the job's progress rate (at its current slice) over one GPU's at its own batch."""
        g = rec.gains[min(int(rec.done / rec.spec.work * len(rec.gains)), len(rec.gains) - 1)] if rec.gains else 1.0
        return rec.rate * g / self.model.rate(rec.spec.app, (1,), rec.spec.batch_size)

    def _effective_gpu_seconds(self) -> float:
        """Work done, in single-GPU seconds: the throughput-weighted GPU time."""
        return sum(j.work / self.model.rate(j.app, (1,), j.batch_size) for j in self.jobs)
