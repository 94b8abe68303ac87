"""Helpers shared by several policies: runtime estimates, EASY reservations, whole-node layouts.

Estimates use only what a scheduler observes (state.py): a job's reported progress, the history
of finished jobs' sizes and the policy's (fitted, imperfect) throughput model.
"""
from __future__ import annotations

import math

from mlsyskit.tools.sched.cluster import Placement
from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import ClusterState, JobView, estimated_remaining
from mlsyskit.tools.sched.throughput import compact_shape


def remaining_work(model, state: ClusterState, job: JobView) -> float:
    """Estimated samples left (history of finished jobs; see state.estimated_remaining)."""
    fallback = model.rate(job.app, compact_shape(job.gpus, state.spec.gpus_per_node), job.batch_size)
    return estimated_remaining(state.history, job, state.now, fallback)


def runtime(model, state: ClusterState, job: JobView, shape: Shape, work: float | None = None) -> float:
    """Estimated seconds until `job` finishes if started now on `shape` (restart cost included)."""
    left = remaining_work(model, state, job) if work is None else work
    rate = model.rate(job.app, shape, job.batch_size)
    return left / rate + (state.restart_cost if job.started_before else 0.0)


def gpu_shadow(state: ClusterState, free_now: int, need: int) -> tuple[float, int]:
    """EASY reservation on GPU counts: the earliest time `need` GPUs are free as running jobs end
    by the scheduler's estimates (an estimate already passed counts as now; jobs started in this
    same decision are ignored: they hold GPUs longer, so this errs early only for them), and how
    many GPUs are spare at that time."""
    avail = free_now
    if avail >= need:
        return state.now, avail - need
    for end, job_id in state.by_end:
        avail += state.running[job_id].held_gpus
        if avail >= need:
            return max(end, state.now), avail - need
    return math.inf, 0


def exclusive_shape(placement: Placement, gpus: int) -> Shape:
    """The GPUs a job asking for `gpus` computes on within the whole nodes `placement` (the
    largest nodes filled first)."""
    out, left = [], gpus
    for g in sorted((g for _, g in placement), reverse=True):
        if left <= 0:
            break
        out.append(min(g, left))
        left -= out[-1]
    return tuple(out)
