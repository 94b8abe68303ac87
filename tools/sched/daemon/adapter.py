"""The one bridge between the daemon's job table and the simulator's policies.

It builds the same `ClusterState` the simulator builds (state.py: `JobView`s, never ground truth)
from the jobs the store knows, calls `policy.decide`, and returns the starts to carry out. What the
daemon knows stands in for the simulator's signals: a running job's measured rate and progress are
what the job reported (progress.py: samples over time, and its losses); a job that reports nothing
gets the model's rate on its shape and elapsed time x that rate. The history of finished jobs
(`WorkHistory`) holds each finished job's last reported samples (else run time x rate), so policies
estimate remaining work exactly as they do in the simulator.

`Preempt` and `Resize` become preemptions the scheduler carries out when its executor can
(checkpoint-free: the process group is stopped and the job queued again with its attained service;
a resized job restarts on the size the policy gives it next); until the processes are gone the job
keeps its GPUs, so starts that only fit after them wait for a later step. A start below the job's
`min_gpus` (= `gpus` unless the job is elastic) is raised to it, laid out as admission.fit_gpus does
(full largest nodes, else as few nodes of any size), if that fits now, else the job waits; so is a
start over the job's `nodes` bound.

`Measurements` feeds the policy's online model (policies.learned.LearnedModel) as the simulator
does: one throughput sample (application, shape, global batch, measured samples/s) per run of a
job on a shape, taken from the job's progress report once it gives a rate.

The daemon keeps the queued jobs' views between steps (`queued_view`, passed as `queued`), so a step
with thousands queued reads only the few jobs that hold GPUs from the table.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sortedcontainers import SortedList

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.daemon.admission import fit_gpus
from mlsyskit.tools.sched.daemon.jobstore import ACTIVE, DONE, QUEUED, RUNNING, Job
from mlsyskit.tools.sched.daemon.progress import Progress
from mlsyskit.tools.sched.daemon.specs import ClusterConfig
from mlsyskit.tools.sched.policies.base import Policy
from mlsyskit.tools.sched.policies.learned import LearnedModel, Sample
from mlsyskit.tools.sched.state import (
    ClusterState,
    JobView,
    Preempt,
    Resize,
    Start,
    WorkHistory,
    estimated_remaining,
)
from mlsyskit.tools.sched.throughput import ThroughputModel


@dataclass(frozen=True)
class PlannedStart:
    job_id: int
    placement: Placement           # ((node index, GPUs held), ...)
    shape: tuple[int, ...]         # GPUs computed on, per placement entry in the same order


@dataclass(frozen=True)
class Plan:
    starts: tuple[PlannedStart, ...]
    ignored: tuple[str, ...]       # why actions were not carried out (for the daemon log)
    preempts: tuple[int, ...] = ()  # running jobs the policy preempted or resized


class Measurements:
    """Throughput samples for the policy's learned model (`samples` is its list), one per job run:
    (job id, restarts) is fed once, when its progress report first gives a rate."""

    def __init__(self, samples: list[Sample] | None = None) -> None:
        self.samples: list[Sample] = samples if samples is not None else []
        self._fed: set[tuple[int, int]] = set()

    @classmethod
    def of(cls, policy: Policy) -> Measurements:
        """Bound to the policy's model when it learns online; else a list nobody reads."""
        model = getattr(policy, "model", None)
        return cls(model.samples if isinstance(model, LearnedModel) else None)

    def feed(self, jobs: list[Job], reports: Mapping[int, Progress], model: ThroughputModel) -> int:
        """Append the runs measured since the last call; returns how many."""
        added = 0
        for job in jobs:
            report = reports.get(job.id)
            if job.state != RUNNING or report is None or report.rate is None or not job.shape:
                continue
            if job.started is None or report.t_last < job.started or (job.id, job.restarts) in self._fed:
                continue   # a report from before this run (or already fed)
            self._fed.add((job.id, job.restarts))
            self.samples.append((job.request.model_app, _shape_of(job), batch_of(job, model), report.rate))
            added += 1
        return added


def default_batch(model: ThroughputModel, app: str, gpus: int) -> int:
    """Global batch when the job gives none: the app's largest measured per-GPU batch on every GPU asked."""
    return int(model.profiles[app].max_local_bsz) * gpus


def batch_of(job: Job, model: ThroughputModel) -> int:
    return job.request.batch_size or default_batch(model, job.request.model_app, job.request.gpus)


def _shape_of(job: Job) -> tuple[int, ...]:
    return tuple(sorted((g for g in job.shape if g), reverse=True))


def learn(history: WorkHistory, job: Job, model: ThroughputModel) -> None:
    """Add a job that ended `done` to the work history: its last reported samples, else run time x rate."""
    if job.state != DONE or job.started is None or job.ended is None or not job.shape:
        return
    if job.samples:
        history.add(job.request.model_app, job.samples)
    else:
        rate = model.rate(job.request.model_app, _shape_of(job), batch_of(job, model))
        history.add(job.request.model_app, max(0.0, job.ended - job.started) * rate)


def queued_view(job: Job, model: ThroughputModel) -> JobView:
    """A queued job as the policy sees it: the request, and the service it attained before a preemption."""
    view = JobView(job.id, job.name, job.request.model_app, job.submitted, job.request.upper_gpus, batch_of(job, model))
    view.attained, view.restarts, view.started_before = job.attained, job.restarts, job.restarts > 0
    return view


def build_state(cluster: ClusterConfig, jobs: list[Job], model: ThroughputModel, now: float,
                reports: Mapping[int, Progress] | None = None, history: WorkHistory | None = None,
                queued: Mapping[int, JobView] | None = None) -> ClusterState:
    """The policy's view of the queued and GPU-holding `jobs`; `history` holds the finished ones.
    With `queued` (job id -> view, in submission order) those are the queue and queued `jobs` are ignored."""
    spec = cluster.spec()
    state = ClusterState(spec, FreeMap(spec), now=now, by_end=SortedList(), restart_cost=0.0,
                         history=history if history is not None else WorkHistory())
    reports = reports or {}
    if queued is not None:
        state.queue = dict(queued)
    for job in jobs:
        if job.state not in (QUEUED, *ACTIVE) or (job.state == QUEUED and queued is not None):
            continue
        view = queued_view(job, model)
        if job.state == QUEUED:
            state.queue[job.id] = view
            continue
        started = job.started if job.started is not None else now
        view.placement = tuple((node, len(ids)) for node, ids in sorted(job.gpus.items()))
        view.shape = _shape_of(job)
        view.since = view.first_start = started      # attained and progress count from here
        view.started_before = True
        view.attained = job.attained
        view.measured_rate = model.rate(job.request.model_app, view.shape, view.batch_size)
        report = reports.get(job.id)
        if report is not None and report.rate is not None and report.t_last >= started:
            # reported samples at t_last; attained service and progress counted up to then
            view.measured_rate = report.rate
            view.progress, view.since = report.s_last, min(report.t_last, now)
            view.attained = job.attained + view.held_gpus * (view.since - started)
            view.loss_reports = list(report.losses)
        left = estimated_remaining(state.history, view, now, view.measured_rate)
        view.est_end = max(now, now + left / view.measured_rate)
        state.free.take(view.placement)
        state.running[job.id] = view
        state.by_end.add((view.est_end, job.id))
    return state


def plan(policy: Policy, cluster: ClusterConfig, jobs: list[Job], model: ThroughputModel, now: float,
         reports: Mapping[int, Progress] | None = None, history: WorkHistory | None = None,
         queued: Mapping[int, tuple[Job, JobView]] | None = None, preemptible: bool = False,
         measured: Measurements | None = None) -> Plan:
    """The policy's decision on `jobs` (with `queued`: the GPU-holding jobs, the queue given apart).
    Preemptions are returned only where `preemptible` (the executor can stop and restart a job).
    `measured`: the running jobs' reported rates are fed to it first (the policy's online model)."""
    if measured is not None:
        measured.feed(jobs, reports or {}, model)
    views = None if queued is None else {job_id: view for job_id, (_, view) in queued.items()}
    state = build_state(cluster, jobs, model, now, reports, history, views)
    if not state.queue:
        return Plan((), ())
    by_id = {j.id: j for j in jobs}
    if queued is not None:
        by_id.update((job_id, job) for job_id, (job, _) in queued.items())
    decision = policy.decide(state)
    free = state.free.copy()
    starts: list[PlannedStart] = []
    ignored: list[str] = []
    preempts: list[int] = []
    # starts are carried out in queue order: a job raised to its exact count takes its GPUs before a
    # later job the policy planned into them (the policy sizes elastically and knows no min_gpus)
    rank = {job_id: i for i, job_id in enumerate(state.queue)}
    ordered = sorted(decision.actions, key=lambda a: (isinstance(a, Start), rank.get(a.job_id, -1)))
    for action in ordered:
        if isinstance(action, Preempt | Resize):
            job = by_id.get(action.job_id)
            if isinstance(action, Resize) and job is not None and job.request.lower_gpus == job.request.upper_gpus:
                continue   # an exact GPU count is never resized (restarted elsewhere on as many GPUs for nothing)
            if preemptible and job is not None and job.state == RUNNING:
                preempts.append(action.job_id)
            elif not preemptible:
                ignored.append(f"{type(action).__name__.lower()} of job {action.job_id} not carried out "
                               "(this executor cannot stop and restart a job)")
            continue
        if not isinstance(action, Start) or action.job_id not in state.queue:
            ignored.append(f"{action!r} does not start a queued job")
            continue
        request = by_id[action.job_id].request
        placement, shape = _layout(action, free, request.lower_gpus, request.upper_gpus, state.spec.gpus_per_node,
                                   request.nodes)
        if placement is None:
            ignored.append(f"start of job {action.job_id} does not fit the free GPUs now")
            continue
        try:
            free.take(placement)
        except ValueError as e:
            ignored.append(f"start of job {action.job_id}: {e}")
            continue
        starts.append(PlannedStart(action.job_id, placement, shape))
    return Plan(tuple(starts), tuple(ignored), tuple(preempts))


def _layout(action: Start, free: FreeMap, min_gpus: int, max_gpus: int, gpus_per_node: int, max_nodes: int = 0):
    """(placement, per-entry computed GPUs) for a policy's start, or (None, ()) when it does not fit.
    A start outside [min_gpus, max_gpus] computed GPUs or over `max_nodes` nodes is laid out again."""
    placement = tuple(sorted(action.placement, key=lambda p: -p[1]))
    shape = tuple(sorted(action.shape if action.shape is not None else (g for _, g in placement), reverse=True))
    if not min_gpus <= sum(shape) <= max_gpus or (max_nodes and len(placement) > max_nodes):
        want = min(max(min_gpus, sum(shape)), max_gpus)
        placement = fit_gpus(free, want, gpus_per_node, max_nodes) or fit_gpus(free, min_gpus, gpus_per_node, max_nodes)
        if placement is None:
            return None, ()
        return placement, tuple(g for _, g in placement)
    if len(shape) > len(placement) or any(s > g for s, (_, g) in zip(shape, placement, strict=False)):
        return None, ()
    if any(gpus > free.free[node] for node, gpus in placement):   # planned GPUs taken by an earlier start
        placement = fit_gpus(free, sum(shape), gpus_per_node, max_nodes) or fit_gpus(free, min_gpus, gpus_per_node,
                                                                                  max_nodes)
        return (None, ()) if placement is None else (placement, tuple(g for _, g in placement))
    return placement, shape + (0,) * (len(placement) - len(shape))
