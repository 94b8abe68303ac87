"""What may start, in which order, and why a job waits: the daemon's side of Slurm's everyday rules.

* Admission: a job that can never run on this cluster (more GPUs than it has; more GPUs than fit
  on the `nodes` largest nodes) is refused at submit with Slurm's words, "requested configuration
  is not available: ...", so it never sits in the queue in front of others.
* Layout of a job's least GPU count (`min_gpus`, = `gpus` unless the job is elastic): as few nodes as
  its size allows on nodes of every size (full largest nodes first, else most-free nodes first),
  within its `nodes` bound.
* Pending reasons, as `squeue` shows them: `Dependency` (an afterok job has not finished yet),
  `QOSMaxWall` (its wall time is over the daemon's --max-time), `BadConstraints` (it can no longer
  fit this cluster), `Resources` (the first waiting job that does not fit the free GPUs now) and
  `Priority` (jobs ahead of it go first). Only jobs without a hold reach the policy.
* Fair share between users: the queue the policy sees is ordered by each user's recent GPU use
  (GPU-seconds, halved every `half_life_s`, Slurm's PriorityDecayHalfLife), each queued job
  counting as its GPUs for `DEFAULT_RUNTIME_S` ahead of the same user's later jobs, then by id.
  Policies that keep queue order (fifo, backfill, the marble family) follow it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from mlsyskit.tools.sched.cluster import FreeMap, Placement
from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest
from mlsyskit.tools.sched.state import DEFAULT_RUNTIME_S
from mlsyskit.tools.sched.throughput import compact_shape

RESOURCES, PRIORITY, DEPENDENCY = "Resources", "Priority", "Dependency"
QOS_MAX_WALL, BAD_CONSTRAINTS, NONE = "QOSMaxWall", "BadConstraints", "None"
UNAVAILABLE = "requested configuration is not available"


def unavailable(cluster: ClusterConfig, request: JobRequest) -> str | None:
    """Why `request` can never run on `cluster` (even empty), or None when it can."""
    total = cluster.total_gpus
    for name, value in (("gpus", request.gpus), ("max_gpus", request.upper_gpus)):
        if value > total:
            return f"{UNAVAILABLE}: {name}: {value} is more GPUs than the cluster has ({total})"
    if request.nodes:
        sizes = sorted((n.gpus for n in cluster.nodes), reverse=True)
        room = sum(sizes[:request.nodes])
        need = request.lower_gpus
        if need > room:
            if request.nodes == 1:
                return f"{UNAVAILABLE}: {need} GPUs on one node; largest node has {sizes[0]}"
            return (f"{UNAVAILABLE}: {need} GPUs on at most {request.nodes} nodes; "
                    f"the {min(request.nodes, len(sizes))} largest have {room}")
    return None


def fit_gpus(free: FreeMap, gpus: int, gpus_per_node: int, max_nodes: int = 0) -> Placement | None:
    """`gpus` GPUs on the free map: full nodes of the largest size if free, else on as few nodes of
    any size as possible; None when they do not fit now (or need more than `max_nodes` nodes)."""
    if gpus > free.total:
        return None
    placement = free.fit(compact_shape(gpus, gpus_per_node)) or free.spread(gpus)
    if placement is None or (max_nodes and len(placement) > max_nodes):
        return None
    return placement


def wall_limit(request: JobRequest, max_time_s: float) -> float:
    """The wall time a run may take: the job's own limit, else the daemon's --max-time (0 = none)."""
    return request.time_limit_s or max_time_s


def hold_reason(request: JobRequest, max_time_s: float, dependency_states: Mapping[int, list[str]],
                never_fits: bool) -> str | None:
    """A reason that keeps a queued job from the policy, or None (the policy may start it)."""
    if never_fits:
        return BAD_CONSTRAINTS
    if max_time_s and request.time_limit_s > max_time_s:
        return QOS_MAX_WALL
    if any(any(s != "done" for s in dependency_states.get(d, ["?"])) for d in request.after_ok):
        return DEPENDENCY
    return None


def broken_dependency(request: JobRequest, dependency_states: Mapping[int, list[str]],
                      final: Iterable[str]) -> int | None:
    """The first afterok job that ended other than done (or is gone): the dependency can never be met."""
    final = set(final)
    for dep in request.after_ok:
        states = dependency_states.get(dep) or ["gone"]
        if any(s in final and s != "done" or s == "gone" for s in states):
            return dep
    return None


class FairShare:
    """Each user's GPU-seconds of finished runs, decayed with a half-life."""

    def __init__(self, half_life_s: float = 7 * 86400.0) -> None:
        self.half_life_s = half_life_s
        self._used: dict[str, tuple[float, float]] = {}   # user -> (GPU-seconds, as of time)

    def _decay(self, dt: float) -> float:
        return math.pow(0.5, max(0.0, dt) / self.half_life_s)

    def add(self, user: str, gpu_seconds: float, at: float) -> None:
        value, since = self._used.get(user, (0.0, at))
        if at >= since:
            self._used[user] = (value * self._decay(at - since) + gpu_seconds, at)
        else:
            self._used[user] = (value + gpu_seconds * self._decay(since - at), since)

    def usage(self, now: float, running: Mapping[str, float] | None = None) -> dict[str, float]:
        """GPU-seconds per user as of `now`, plus what their running jobs have held so far."""
        out = {user: value * self._decay(now - since) for user, (value, since) in self._used.items()}
        for user, held in (running or {}).items():
            out[user] = out.get(user, 0.0) + held
        return out


def fair_order(jobs: Iterable[tuple[int, str, int]], usage: Mapping[str, float]) -> list[int]:
    """Job ids (given as (id, user, gpus) in submission order) in fair-share order."""
    ahead: dict[str, float] = {}
    keyed = []
    for job_id, user, gpus in jobs:
        used = usage.get(user, 0.0) + ahead.get(user, 0.0)
        ahead[user] = ahead.get(user, 0.0) + gpus * DEFAULT_RUNTIME_S
        keyed.append((used, job_id))
    keyed.sort()
    return [job_id for _, job_id in keyed]


def fair_queue(eligible: dict[int, tuple[Any, Any]], holding: Iterable[Any], now: float,
               fair: FairShare) -> dict[int, tuple[Any, Any]]:
    """The eligible jobs ({id: (Job, view)}, submission order) in fair-share order; `holding` are the
    jobs that hold GPUs now (their use so far counts). Submission order while one user waits."""
    if len({job.user for job, _ in eligible.values()}) <= 1:
        return eligible
    running: dict[str, float] = {}
    for job in holding:
        ran = job.held * max(0.0, now - job.started) if job.started is not None else 0.0
        running[job.user] = running.get(job.user, 0.0) + job.attained + ran
    order = fair_order(((i, job.user, job.request.lower_gpus) for i, (job, _) in eligible.items()),
                       fair.usage(now, running))
    return {i: eligible[i] for i in order}


def waiting_reasons(waiting: Iterable[tuple[int, JobRequest]], cluster: ClusterConfig,
                    held: Mapping[int, set[int]]) -> dict[int, str]:
    """For the jobs left waiting, in queue order: Resources for the first that does not fit the free
    GPUs (`held`: node -> device ids in use), Priority for every other (jobs ahead go first)."""
    spec = cluster.spec()
    free = FreeMap(spec)
    free.take(tuple((node, len(ids)) for node, ids in held.items() if ids))
    reasons: dict[int, str] = {}
    blocked = False
    for job_id, request in waiting:
        fits = not blocked and fit_gpus(free, request.lower_gpus, spec.gpus_per_node, request.nodes) is not None
        reasons[job_id] = PRIORITY if blocked or fits else RESOURCES
        blocked = blocked or not fits
    return reasons
