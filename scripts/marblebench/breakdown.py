"""bench_marble's per-application breakdown: where one policy's mean JCT comes from, next to another's.

For one replay per policy (the simulator's event log gives when each job ran), per application:
jobs, share of the summed JCT, mean JCT, mean time queued (before the first start and after
preemptions) and running (restart pauses included), restarts per job (preemptions and resizes),
GPU-hours held, and GPU-hours held per single-GPU-hour of work done (1.0 = perfectly linear
scaling and no restart; above it, GPUs paid for on the flat part of the curve or idle in restarts).
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.policies import PolicyOptions
from mlsyskit.tools.sched.throughput import ThroughputModel


def running_seconds(events_path: Path) -> dict[str, float]:
    """Seconds each job held GPUs, from start/resize/preempt/finish events (job name -> seconds)."""
    since: dict[str, float] = {}
    total: dict[str, float] = defaultdict(float)
    with events_path.open(encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            kind, name, t = e.get("kind"), e.get("job"), e.get("t")
            if kind == "start":
                since[name] = t
            elif kind in ("preempt", "finish") and name in since:
                total[name] += t - since.pop(name)
    return dict(total)


def breakdown(source: WorkloadSource, spec: ClusterSpec, seed: int, model: ThroughputModel, policies: list[str],
              restart_cost: float, folder: Path) -> dict:
    """{policy: {"mean_jct_h": ..., "apps": {app: {...}}}} for one replay of each policy."""
    jobs = source.load(model, seed, spec)
    one_gpu_h = {j.job_id: j.work / model.rate(j.app, (1,), j.batch_size) / 3600.0 for j in jobs}
    out: dict = {}
    for policy in policies:
        events = folder / f"events-{policy}-{spec}-{seed}.jsonl"
        events.unlink(missing_ok=True)
        run = run_one(source, spec, policy, seed, model, PolicyOptions(), restart_cost, events_path=events, jobs=jobs)
        ran = running_seconds(events)
        result = run.result
        rows: dict[str, list] = defaultdict(list)
        for rec in result.jobs:
            s = rec.spec
            jct = result.finish[s.job_id] - s.arrival
            rows[s.app].append((jct, jct - ran.get(s.name, 0.0), rec.restarts, rec.attained / 3600.0,
                                one_gpu_h[s.job_id]))
        total_jct = sum(r[0] for per in rows.values() for r in per)
        apps = {}
        for app, per in sorted(rows.items()):
            held, work = sum(r[3] for r in per), sum(r[4] for r in per)
            apps[app] = {"jobs": len(per), "jct_share": sum(r[0] for r in per) / total_jct,
                         "mean_jct_h": statistics.fmean(r[0] for r in per) / 3600.0,
                         "mean_queued_h": statistics.fmean(r[1] for r in per) / 3600.0,
                         "mean_running_h": statistics.fmean(r[0] - r[1] for r in per) / 3600.0,
                         "restarts_per_job": statistics.fmean(r[2] for r in per),
                         "gpu_hours_held": held, "held_per_work": held / work if work > 0 else None}
        out[policy] = {"mean_jct_h": total_jct / len(result.jobs) / 3600.0, "apps": apps}
    return out


def rows_for_table(name: str, cluster: str, per_policy: dict) -> list[list[str]]:
    """One row per (application, policy), the largest share of the summed JCT first."""
    first = next(iter(per_policy.values()))["apps"]
    order = sorted(first, key=lambda a: -first[a]["jct_share"])
    out = []
    for app in order:
        for policy, doc in per_policy.items():
            a = doc["apps"][app]
            out.append([name.removeprefix("heldout-"), cluster, app, policy, f"{a['jct_share']:.2f}",
                        f"{a['mean_jct_h']:.2f}", f"{a['mean_queued_h']:.2f}", f"{a['restarts_per_job']:.1f}",
                        f"{a['held_per_work']:.2f}"])
    return out
