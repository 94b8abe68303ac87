"""The one bridge between the daemon's job table and the simulator's policies.

It builds the same `ClusterState` the simulator builds (state.py: `JobView`s, never ground truth)
from the jobs the store knows, calls `policy.decide`, and returns the starts to carry out. What the
daemon knows stands in for the simulator's signals: a running job's measured rate and progress are
what the job reported (progress.py: samples over time, and its losses); a job that reports nothing
gets the model's rate on its shape and elapsed time x that rate. The history of finished jobs
(`WorkHistory`) holds each finished job's last reported samples (else run time x rate), so policies
estimate remaining work exactly as they do in the simulator.

Real commands cannot be checkpointed by the daemon, so `Preempt` and `Resize` actions are not carried
out (the job keeps its GPUs) and starts that only fit after them are skipped; the daemon is meant for
non-preemptive policies (fifo, backfill, marble). A start below the job's `min_gpus` is raised to
`min_gpus` on a compact layout if that fits now, else the job waits.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sortedcontainers import SortedList

from mlsyskit.tools.sched.cluster import ClusterSpec, FreeMap, Placement
from mlsyskit.tools.sched.daemon.jobstore import ACTIVE, DONE, QUEUED, Job
from mlsyskit.tools.sched.daemon.progress import Progress
from mlsyskit.tools.sched.daemon.specs import ClusterConfig
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.state import (
    ClusterState,
    JobView,
    Preempt,
    Resize,
    Start,
    WorkHistory,
    estimated_remaining,
)
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape


@dataclass(frozen=True)
class PlannedStart:
    job_id: int
    placement: Placement           # ((node index, GPUs held), ...)
    shape: tuple[int, ...]         # GPUs computed on, per placement entry in the same order


@dataclass(frozen=True)
class Plan:
    starts: tuple[PlannedStart, ...]
    ignored: tuple[str, ...]       # why actions were not carried out (for the daemon log)


def default_batch(model: ThroughputModel, app: str, gpus: int) -> int:
    """Global batch when the job gives none: the app's largest measured per-GPU batch on every GPU asked."""
    return int(model.profiles[app].max_local_bsz) * gpus


def batch_of(job: Job, model: ThroughputModel) -> int:
    return job.request.batch_size or default_batch(model, job.request.app, job.request.gpus)


def _shape_of(job: Job) -> tuple[int, ...]:
    return tuple(sorted((g for g in job.shape if g), reverse=True))


def learn(history: WorkHistory, job: Job, model: ThroughputModel) -> None:
    """Add a job that ended `done` to the work history: its last reported samples, else run time x rate."""
    if job.state != DONE or job.started is None or job.ended is None or not job.shape:
        return
    if job.samples:
        history.add(job.request.app, job.samples)
    else:
        rate = model.rate(job.request.app, _shape_of(job), batch_of(job, model))
        history.add(job.request.app, max(0.0, job.ended - job.started) * rate)


def build_state(cluster: ClusterConfig, jobs: list[Job], model: ThroughputModel, now: float,
                reports: Mapping[int, Progress] | None = None, history: WorkHistory | None = None) -> ClusterState:
    """The policy's view of the queued and GPU-holding `jobs`; `history` holds the finished ones."""
    spec = ClusterSpec(len(cluster.nodes), cluster.gpus_per_node)
    state = ClusterState(spec, FreeMap(spec), now=now, by_end=SortedList(), restart_cost=0.0,
                         history=history if history is not None else WorkHistory())
    reports = reports or {}
    for job in jobs:
        if job.state not in (QUEUED, *ACTIVE):
            continue
        view = JobView(job.id, job.name, job.request.app, job.submitted, job.request.upper_gpus, batch_of(job, model))
        if job.state == QUEUED:
            state.queue[job.id] = view
            continue
        started = job.started if job.started is not None else now
        view.placement = tuple((node, len(ids)) for node, ids in sorted(job.gpus.items()))
        view.shape = _shape_of(job)
        view.since = view.first_start = started      # attained and progress count from here
        view.started_before = True
        view.measured_rate = model.rate(job.request.app, view.shape, view.batch_size)
        report = reports.get(job.id)
        if report is not None and report.rate is not None and report.t_last >= started:
            # reported samples at t_last; attained service and progress counted up to then
            view.measured_rate = report.rate
            view.progress, view.since = report.s_last, min(report.t_last, now)
            view.attained = view.held_gpus * (view.since - started)
            view.loss_reports = list(report.losses)
        left = estimated_remaining(state.history, view, now, view.measured_rate)
        view.est_end = max(now, now + left / view.measured_rate)
        state.free.take(view.placement)
        state.running[job.id] = view
        state.by_end.add((view.est_end, job.id))
    return state


def plan(policy: Policy, cluster: ClusterConfig, jobs: list[Job], model: ThroughputModel, now: float,
         reports: Mapping[int, Progress] | None = None, history: WorkHistory | None = None) -> Plan:
    state = build_state(cluster, jobs, model, now, reports, history)
    if not state.queue:
        return Plan((), ())
    by_id = {j.id: j for j in jobs}
    decision = policy.decide(state)
    free = state.free.copy()
    starts: list[PlannedStart] = []
    ignored: list[str] = []
    for action in decision.actions:
        if isinstance(action, Preempt | Resize):
            ignored.append(f"{type(action).__name__.lower()} of job {action.job_id} not carried out "
                           "(the daemon cannot checkpoint a running command)")
            continue
        if not isinstance(action, Start) or action.job_id not in state.queue:
            ignored.append(f"{action!r} does not start a queued job")
            continue
        placement, shape = _layout(action, free, by_id[action.job_id].request.min_gpus, state.spec.gpus_per_node)
        if placement is None:
            ignored.append(f"start of job {action.job_id} does not fit the free GPUs now")
            continue
        try:
            free.take(placement)
        except ValueError as e:
            ignored.append(f"start of job {action.job_id}: {e}")
            continue
        starts.append(PlannedStart(action.job_id, placement, shape))
    return Plan(tuple(starts), tuple(ignored))


def _layout(action: Start, free: FreeMap, min_gpus: int, gpus_per_node: int):
    """(placement, per-entry computed GPUs) for a policy's start, or (None, ()) when it does not fit."""
    placement = tuple(sorted(action.placement, key=lambda p: -p[1]))
    shape = tuple(sorted(action.shape if action.shape is not None else (g for _, g in placement), reverse=True))
    if sum(shape) < min_gpus:
        placement = free.fit(compact_shape(min_gpus, gpus_per_node))
        if placement is None:
            return None, ()
        return placement, tuple(g for _, g in placement)
    if len(shape) > len(placement) or any(s > g for s, (_, g) in zip(shape, placement, strict=False)):
        return None, ()
    for node, gpus in placement:
        if gpus > free.free[node]:
            return None, ()
    return placement, shape + (0,) * (len(placement) - len(shape))
