"""Helpers shared by several policies: runtime estimates and EASY reservations."""
from __future__ import annotations

import math

from mlsyskit.tools.sched.profiles import Shape
from mlsyskit.tools.sched.state import ClusterState, JobRecord
from mlsyskit.tools.sched.throughput import ThroughputModel, compact_shape


def runtime(model: ThroughputModel, job: JobRecord, shape: Shape, now: float, restart_cost: float) -> float:
    """Seconds until `job` would finish if started now on `shape` (oracle remaining work, as
    simulators of LSF/EASY use user runtime estimates)."""
    rate = model.rate(job.spec.app, shape, job.spec.batch_size)
    return job.remaining(now) / rate + (restart_cost if job.started_before else 0.0)


def gpu_shadow(state: ClusterState, free_now: int, need: int) -> tuple[float, int]:
    """EASY reservation on GPU counts: the earliest time `need` GPUs are free as running jobs end
    (jobs started in this same decision are ignored: they hold GPUs longer, so this errs early only
    for them), and how many GPUs are spare at that time."""
    avail = free_now
    if avail >= need:
        return state.now, avail - need
    for end, job_id in state.by_end:
        avail += state.running[job_id].held_gpus
        if avail >= need:
            return end, avail - need
    return math.inf, 0


def node_shadow(state: ClusterState, free_nodes: int, need_nodes: int) -> tuple[float, int]:
    """The same on whole nodes, for exclusive (LSF-style) allocation."""
    avail = free_nodes
    if avail >= need_nodes:
        return state.now, avail - need_nodes
    for end, job_id in state.by_end:
        avail += len(state.running[job_id].placement)
        if avail >= need_nodes:
            return end, avail - need_nodes
    return math.inf, 0


def nodes_for(gpus: int, gpus_per_node: int) -> int:
    return -(-gpus // gpus_per_node)


def exclusive_shape(gpus: int, gpus_per_node: int) -> Shape:
    return compact_shape(gpus, gpus_per_node)
