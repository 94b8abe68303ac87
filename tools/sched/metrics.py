"""Summary metrics of one simulated run (deterministic for a given workload, policy and seed)."""
from __future__ import annotations

import math
import statistics

from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.sched.simulator import SimResult

__all__ = ["aggregate", "downsample", "jcts", "percentile", "summarize", "timing"]


def jcts(result: SimResult) -> list[float]:
    return [result.finish[r.spec.job_id] - r.spec.arrival for r in result.jobs]


def summarize(result: SimResult, total_gpus: int) -> dict[str, float | int | str]:
    """JCT, queueing delay, makespan, utilisation and slowdown (JCT / run time alone on the GPUs
    asked for, compact layout; the worst job's is `max_slowdown`). Allocation utilisation = GPU-seconds held /
    (GPUs x makespan); effective utilisation = work done in single-GPU seconds / (GPUs x makespan),
    i.e. held GPUs weighted by how efficiently each job used them."""
    jct = jcts(result)
    slowdown = [(result.finish[r.spec.job_id] - r.spec.arrival) / result.ideal[r.spec.job_id] for r in result.jobs] \
        if result.ideal else [math.nan]
    delays = [r.first_start - r.spec.arrival for r in result.jobs]
    span = result.makespan_end - result.makespan_start
    capacity = total_gpus * span
    return {
        "policy": result.policy, "cluster": result.cluster, "jobs": len(jct),
        "avg_jct_s": statistics.fmean(jct),
        # the mean JCT with no queueing, each job alone on the GPUs it asked for: no policy that
        # never gives a job more than it asked gets far below it (it can only pick a faster layout)
        "avg_ideal_s": statistics.fmean(result.ideal.values()) if result.ideal else math.nan,
        "median_jct_s": statistics.median(jct), "p95_jct_s": percentile(jct, 95),
        "p99_jct_s": percentile(jct, 99), "max_slowdown": max(slowdown),
        "makespan_s": span, "avg_queue_delay_s": statistics.fmean(delays), "p99_queue_delay_s": percentile(delays, 99),
        "alloc_util": result.gpu_seconds_held / capacity if capacity else 0.0,
        "effective_util": result.effective_gpu_seconds / capacity if capacity else 0.0,
        "starts": result.counters["starts"], "preemptions": result.counters["preemptions"],
        "resizes": result.counters["resizes"], "decisions": result.counters["decisions"],
    }


def timing(result: SimResult) -> dict[str, float]:
    """Wall-clock figures (differ between runs; kept out of the deterministic summary)."""
    lat = result.decision_ms
    return {"wall_s": result.wall_s, "events": result.events, "decisions": len(lat),
            "decision_ms_mean": statistics.fmean(lat) if lat else 0.0,
            "decision_ms_p99": percentile(lat, 99), "decision_ms_max": max(lat) if lat else 0.0}


def aggregate(runs: list[dict]) -> dict[str, float]:
    """Mean over seeds of the numeric fields."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: statistics.fmean(r[k] for r in runs) for k in keys}


def downsample(timeline: list[tuple[float, int, float]], points: int = 2000) -> list[tuple[float, int, float]]:
    if len(timeline) <= points:
        return list(timeline)
    step = len(timeline) / points
    return [timeline[int(i * step)] for i in range(points)] + [timeline[-1]]
