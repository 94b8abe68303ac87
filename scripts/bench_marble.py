#!/usr/bin/env python
"""marble benchmark: JCT of six policies on the Pollux workloads and a synthetic one (5 seeds),
a 80k-job / 1,000-node scale replay, and decision latency with >= 10k jobs queued.

Targets (issue 5), each checked on measured numbers and recorded in the JSON with `met`:
- marble's average JCT >= 30% below fifo and >= 15% below optimus on at least 4 of 5 seeds,
  per workload (tiresias and backfill reported beside them);
- the 80k-job synthetic trace on 1000x6 GPUs replays under marble in < 600 s and < 2 GiB RSS;
- p99 marble decision latency < 50 ms on states with >= 10k queued jobs.

    .venv/bin/python scripts/bench_marble.py --out runs/bench_marble.json
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from rich import box

from mlsyskit.core.console import emit_table, log, make_table, progress
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.metrics import percentile, summarize, timing
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.scaling_model import held_out_error
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel
from mlsyskit.tools.sched.workloads import SyntheticSpec, synthetic

POLICY_ORDER = ["fifo", "backfill", "optimus", "tiresias", "marble", "marble-elastic"]
RESTART_COST = 30.0


def jct_part(args, model: ThroughputModel) -> dict:
    workloads = [(f"workload-{i}", ClusterSpec(16, 6)) for i in range(1, 5)]
    workloads.append((f"synthetic:{args.synthetic_jobs}@{args.synthetic_load}", ClusterSpec(64, 6)))
    seeds = list(range(args.seeds))
    out: dict = {}
    with progress() as bar:
        task = bar.add_task("JCT runs", total=len(workloads) * len(seeds) * len(POLICY_ORDER))
        for name, spec in workloads:
            source = WorkloadSource(name)
            per_seed = {}
            for seed in seeds:
                jobs = source.load(model, seed, spec)
                per_seed[seed] = {}
                for policy in POLICY_ORDER:
                    run = run_one(source, spec, policy, seed, model, PolicyOptions(), RESTART_COST, jobs=jobs)
                    per_seed[seed][policy] = run.summary
                    bar.advance(task)
            out[name] = {"cluster": str(spec), "seeds": per_seed, "targets": jct_targets(per_seed, len(seeds))}
    return out


def jct_targets(per_seed: dict, n_seeds: int) -> dict:
    need = max(1, n_seeds - 1)  # "at least 4 of 5"
    vs_fifo = [1 - s["marble"]["avg_jct_s"] / s["fifo"]["avg_jct_s"] for s in per_seed.values()]
    vs_optimus = [1 - s["marble"]["avg_jct_s"] / s["optimus"]["avg_jct_s"] for s in per_seed.values()]
    return {
        "marble_vs_fifo": {"reduction_per_seed": vs_fifo, "threshold": 0.30, "seeds_needed": need,
                           "seeds_met": sum(r >= 0.30 for r in vs_fifo), "met": sum(r >= 0.30 for r in vs_fifo) >= need},
        "marble_vs_optimus": {"reduction_per_seed": vs_optimus, "threshold": 0.15, "seeds_needed": need,
                              "seeds_met": sum(r >= 0.15 for r in vs_optimus),
                              "met": sum(r >= 0.15 for r in vs_optimus) >= need},
    }


def scale_child(policy: str, jobs: int, nodes: int, load: float) -> None:
    """Runs in a fresh process so its peak RSS is the replay's own."""
    model = ThroughputModel()
    spec = ClusterSpec(nodes, 6)
    t0 = time.perf_counter()
    trace = synthetic(SyntheticSpec(jobs, load), model, 0, spec.total_gpus, 6)
    result = Simulator(spec, create_policy(policy, model), model, trace, restart_cost=RESTART_COST).run()
    wall = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"policy": policy, "jobs": jobs, "cluster": str(spec), "load": load, "wall_s": wall,
                      "peak_rss_mib": rss_mib, "summary": summarize(result, spec.total_gpus),
                      "timing": timing(result)}))


def scale_part(args) -> dict:
    runs = {}
    for policy in args.scale_policies.split(","):
        log(f"scale replay: {policy}, {args.scale_jobs} jobs on {args.scale_nodes}x6 ...")
        proc = subprocess.run([sys.executable, __file__, "--scale-child", policy, "--scale-jobs", str(args.scale_jobs),
                               "--scale-nodes", str(args.scale_nodes)], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            runs[policy] = {"error": proc.stderr[-2000:]}
            continue
        runs[policy] = json.loads(proc.stdout.strip().splitlines()[-1])
    m = runs.get("marble", {})
    return {"runs": runs, "targets": {
        "replay_wall_s": {"measured": m.get("wall_s"), "threshold": 600.0,
                          "met": m.get("wall_s") is not None and m["wall_s"] < 600.0},
        "replay_peak_rss_mib": {"measured": m.get("peak_rss_mib"), "threshold": 2048.0,
                                "met": m.get("peak_rss_mib") is not None and m["peak_rss_mib"] < 2048.0}}}


class QueueProbe(Simulator):
    """Replays under marble; on every decision with >= `min_queue` waiting jobs it also times each
    policy's decide() on that same state (policies are pure, so probing changes nothing)."""

    def __init__(self, *a, probes, min_queue, samples, **kw):
        super().__init__(*a, **kw)
        self.probes, self.min_queue, self.samples = probes, min_queue, samples
        self.latency = {name: [] for name in probes}
        self.queue_sizes: list[int] = []

    def _decide(self):
        if len(self.state.queue) >= self.min_queue and len(self.queue_sizes) < self.samples:
            self.state.now = self.loop.now()
            self.queue_sizes.append(len(self.state.queue))
            for name, policy in self.probes.items():
                t0 = time.perf_counter()
                policy.decide(self.state)
                self.latency[name].append((time.perf_counter() - t0) * 1e3)
        super()._decide()

    def done(self) -> bool:
        return len(self.queue_sizes) >= self.samples


def latency_part(args, model: ThroughputModel) -> dict:
    spec = ClusterSpec(args.scale_nodes, 6)
    trace = synthetic(SyntheticSpec(args.scale_jobs, args.overload), model, 1, spec.total_gpus, 6)
    probes = {name: create_policy(name, model) for name in POLICY_ORDER}
    sim = QueueProbe(spec, create_policy("marble", model), model, trace, restart_cost=RESTART_COST,
                     probes=probes, min_queue=args.min_queue, samples=args.latency_samples)
    sim.loop.schedule_at(sim.jobs[0].arrival, sim._arrive)
    log(f"decision latency: overloaded replay (load {args.overload}) until {args.latency_samples} decisions "
        f"see >= {args.min_queue} queued jobs ...")
    while not sim.done() and sim.loop.run(max_events=5000):
        pass
    per_policy = {name: {"decisions": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99),
                         "max_ms": max(v) if v else None} for name, v in sim.latency.items()}
    p99 = per_policy["marble"]["p99_ms"]
    return {"cluster": str(spec), "load": args.overload,
            "queue_size": {"min": min(sim.queue_sizes, default=0), "max": max(sim.queue_sizes, default=0)},
            "policies": per_policy,
            "targets": {"marble_p99_ms": {"measured": p99, "threshold": 50.0,
                                          "met": bool(sim.queue_sizes) and p99 < 50.0}}}


def show(doc: dict) -> None:
    rows = []
    for name, w in doc["jct"].items():
        seeds = w["seeds"]
        mean = {p: sum(s[p]["avg_jct_s"] for s in seeds.values()) / len(seeds) / 3600 for p in POLICY_ORDER}
        t = w["targets"]
        label = name.replace("workload-", "w").replace("synthetic:", "syn ")
        rows.append([f"{label} {w['cluster']}", *[f"{mean[p]:.2f}" for p in POLICY_ORDER],
                     f"{t['marble_vs_fifo']['seeds_met']}/{len(seeds)}", f"{t['marble_vs_optimus']['seeds_met']}/{len(seeds)}"])
    table = make_table("average JCT, hours (mean of seeds); seeds on which marble meets each target",
                       ["workload", "fifo", "backfill", "optimus", "tiresias", "marble", "m-elastic", "<fifo-30%",
                        "<opt-15%"], rows)
    table.columns[0].no_wrap = True
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    emit_table(table)
    if "scale" in doc:
        emit_table(make_table("80k-job scale replay", ["policy", "wall s", "peak RSS MiB", "avg JCT h", "decision p99 ms"],
                              [[p, r.get("wall_s"), r.get("peak_rss_mib"),
                                r["summary"]["avg_jct_s"] / 3600 if "summary" in r else None,
                                r["timing"]["decision_ms_p99"] if "timing" in r else None]
                               for p, r in doc["scale"]["runs"].items()]))
    if "latency" in doc:
        lat = doc["latency"]
        emit_table(make_table(f"decision latency, {lat['queue_size']['min']}-{lat['queue_size']['max']} jobs queued",
                              ["policy", "decisions", "p50 ms", "p99 ms", "max ms"],
                              [[p, v["decisions"], v["p50_ms"], v["p99_ms"], v["max_ms"]] for p, v in lat["policies"].items()]))
    emit_table(make_table("targets", ["target", "met"], [[k, v] for k, v in doc["targets"].items()]))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def load_factor(text: str) -> float:
    value = float(text)
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"an offered load must be in (0, 10], got {text}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_marble.json"))
    ap.add_argument("--seeds", type=positive, default=5)
    ap.add_argument("--synthetic-jobs", type=positive, default=2000)
    ap.add_argument("--synthetic-load", type=load_factor, default=0.9)
    ap.add_argument("--scale-jobs", type=positive, default=80_000)
    ap.add_argument("--scale-nodes", type=positive, default=1000)
    ap.add_argument("--scale-policies", default="marble,fifo,backfill")
    ap.add_argument("--overload", type=load_factor, default=3.0, help="offered load of the latency trace")
    ap.add_argument("--min-queue", type=positive, default=10_000)
    ap.add_argument("--latency-samples", type=positive, default=200)
    ap.add_argument("--skip-scale", action="store_true", help="only the JCT comparison")
    ap.add_argument("--scale-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_child:
        scale_child(args.scale_child, args.scale_jobs, args.scale_nodes, 0.9)
        return
    model = ThroughputModel()
    t0 = time.perf_counter()
    doc: dict = {"restart_cost_s": RESTART_COST, "model_held_out": [held_out_error(p) for p in model.profiles.values()]}
    doc["jct"] = jct_part(args, model)
    targets = {}
    for name, w in doc["jct"].items():
        for key, t in w["targets"].items():
            targets[f"{name}: {key}"] = t["met"]
    if not args.skip_scale:
        doc["scale"] = scale_part(args)
        doc["latency"] = latency_part(args, model)
        targets.update({f"scale: {k}": v["met"] for k, v in doc["scale"]["targets"].items()})
        targets.update({f"latency: {k}": v["met"] for k, v in doc["latency"]["targets"].items()})
    doc["targets"] = targets
    doc["all_targets_met"] = all(targets.values())
    doc["bench_wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    show(doc)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
