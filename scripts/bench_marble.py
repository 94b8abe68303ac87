#!/usr/bin/env python
"""marble benchmark: do results generalise, with policies that see no ground truth?

1. JCT by workload family (policies get the model with 0%, 10% and 25% error; fifo and tiresias
   do not read the model, so they run once): pollux (workloads 1-4 on 16x6 and on the Pollux
   artifact's 16x4), load (synthetic at offered load 0.5, 0.8, 1.0, 1.2), size-mix (small-job and
   large-job mixes) and heavy-tail (log-normal GPU-hours, one with a Philly-like size mix).
   Targets per family (issue 13): marble's mean JCT <= 0.85x optimus and <= 1.0x tiresias (ratios
   of means over the family's runs), <= 0.7x fifo on every run, worst slowdown below tiresias'.
   Checked for marble, marble-elastic and marble-las (ours); met when a variant meets them on at
   least 3 of 4 families.
2. Cross-validation of marble-las' pressure threshold (`las_pressure_threshold`): for each
   family, the value from PRESSURE_GRID with the best mean JCT / tiresias on the other three
   families, reported on the held-out one. (The shipped default, 0.5, is what every fold chose.)
   marble's own constants (0.5 / 0.8) were fitted to workloads 1-4 before this bench existed.
3. Scale (--scale): a Philly-like trace (82k jobs by default, size mix 1:70,2:10,4:10,8:8,16:2,
   heavy-tailed GPU-hours) at load 0.8 on 60x8, each policy in a fresh process; target <= 60 s
   of CPU time (the wall time is recorded too; on a shared machine it counts others' work).
5. Daemon step (--scale): `marble serve`'s scheduling step with 5,000 jobs queued on a full
   4x4 cluster (real `sleep` jobs, local executor, SQLite job table), wall and CPU ms per step;
   peer in the same run: the queue read from the table every step (the daemon before it kept it).
4. Decision latency (--scale): each policy on its own saturated replay (20k jobs arriving at load
   10 on 60x8, so every policy, least-attained-service ones included, has >= 10k waiting);
   decisions taken with >= --min-queue jobs waiting are timed (wall and CPU); target p99 <= 20 ms.

    .venv/bin/python scripts/bench_marble.py --out runs/bench_marble.json [--scale]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mlsyskit.core.console import emit_table, log, make_table
from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.ground_truth import ModelWithError
from mlsyskit.tools.sched.metrics import summarize, timing
from mlsyskit.tools.sched.policies import PolicyOptions, create_policy
from mlsyskit.tools.sched.simulator import Simulator
from mlsyskit.tools.sched.throughput import ThroughputModel

RESTART_COST = 30.0
POLICIES = ["fifo", "backfill", "optimus", "tiresias", "marble", "marble-elastic", "marble-las"]
MODEL_FREE = {"fifo", "tiresias"}          # never read the throughput model
VARIANTS = ["marble", "marble-elastic", "marble-las"]
ERRORS = [0.0, 0.1, 0.25]
PRESSURE_GRID = [0.5, 0.65, 0.8, 0.95]
PHILLY_MIX = "1:70,2:10,4:10,8:8,16:2"


def families(jobs: int) -> dict[str, list[tuple[str, str]]]:
    return {
        "pollux": [(f"workload-{i}", c) for c in ("16x6", "16x4") for i in range(1, 5)],
        "load": [(f"synthetic:{jobs}@{load}", "16x6") for load in (0.5, 0.8, 1.0, 1.2)],
        "size-mix": [(f"synthetic:{jobs}@0.9/1:8,2:4,4:2,8:1", "16x6"), (f"synthetic:{jobs}@0.9/1:1,8:2,16:2,32:1", "16x4")],
        "heavy-tail": [(f"synthetic:{jobs}@0.9~heavy", "16x6"), (f"synthetic:{jobs}@0.9/{PHILLY_MIX}~heavy", "16x4")],
    }


def jct_part(args, model: ThroughputModel) -> dict:
    """runs[family][instance][seed][error][policy] = summary; plus the CV grid for marble-las."""
    out: dict = {}
    for family, instances in families(args.synthetic_jobs).items():
        if args.families and family not in args.families:
            continue
        fam = out[family] = {}
        for text, cluster in instances:
            spec, source = ClusterSpec.parse(cluster), WorkloadSource(text)
            inst = fam[f"{text} on {cluster}"] = {}
            for seed in range(args.seeds):
                jobs = source.load(model, seed, spec)
                runs = inst[str(seed)] = {}
                for error in ERRORS:
                    runs[str(error)] = {}
                    for policy in POLICIES:
                        if error and policy in MODEL_FREE:
                            runs[str(error)][policy] = runs["0.0"][policy]
                            continue
                        r = run_one(source, spec, policy, seed, model, PolicyOptions(), RESTART_COST,
                                    jobs=jobs, model_error=error)
                        runs[str(error)][policy] = r.summary
                runs["cv"] = {}
                for value in PRESSURE_GRID:
                    r = run_one(source, spec, "marble-las", seed, model, PolicyOptions(las_pressure_threshold=value),
                                RESTART_COST, jobs=jobs)
                    runs["cv"][str(value)] = r.summary
            log(f"  {family}: {text} on {cluster} done")
    return out


def _runs(fam: dict, error: str):
    for inst in fam.values():
        for seed in inst.values():
            yield seed[error]


def targets(fam: dict, error: str, variant: str) -> dict:
    runs = list(_runs(fam, error))
    mean = {p: sum(r[p]["avg_jct_s"] for r in runs) / len(runs) for p in POLICIES}
    vs_fifo = max(r[variant]["avg_jct_s"] / r["fifo"]["avg_jct_s"] for r in runs)
    slow = {p: max(r[p]["max_slowdown"] for r in runs) for p in (variant, "tiresias")}
    p95 = {p: sum(r[p]["p95_jct_s"] for r in runs) / len(runs) for p in (variant, "optimus", "tiresias")}
    checks = {
        "vs_optimus": {"ratio": mean[variant] / mean["optimus"], "threshold": 0.85},
        "vs_tiresias": {"ratio": mean[variant] / mean["tiresias"], "threshold": 1.0},
        "vs_fifo_every_run": {"ratio": vs_fifo, "threshold": 0.7},
        "worst_slowdown_vs_tiresias": {"ratio": slow[variant] / slow["tiresias"], "threshold": 1.0, "strict": True},
    }
    # Floors: the ratio a policy would reach if no job ever waited and each ran on the GPUs it asked
    # (mean run time alone; the same jobs in every run): a target under its floor cannot be met by
    # any variant that never gives a job more GPUs than it asked.
    ideal = sum(r["fifo"]["avg_ideal_s"] for r in runs) / len(runs)
    checks["vs_optimus"]["floor"] = ideal / mean["optimus"]
    checks["vs_tiresias"]["floor"] = ideal / mean["tiresias"]
    checks["vs_fifo_every_run"]["floor"] = max(r["fifo"]["avg_ideal_s"] / r["fifo"]["avg_jct_s"] for r in runs)
    checks["vs_fifo_every_run"]["floor_per_run"] = [r["fifo"]["avg_ideal_s"] / r["fifo"]["avg_jct_s"] for r in runs]
    for c in checks.values():   # "below" tiresias' worst slowdown is strict; the JCT targets are "<="
        c["met"] = c["ratio"] < c["threshold"] if c.get("strict") else c["ratio"] <= c["threshold"]
    return {"mean_jct_s": mean, "mean_p95_jct_s": p95, "worst_slowdown": slow, "checks": checks,
            "met": all(c["met"] for c in checks.values())}


def cross_validate(jct: dict) -> dict:
    """Leave one family out: pick marble-las' pressure threshold on the others, report on it."""
    def score(fams: list[str], value: str) -> float:   # mean of marble-las / tiresias per run
        ratios = [inst[s]["cv"][value]["avg_jct_s"] / inst[s]["0.0"]["tiresias"]["avg_jct_s"]
                  for f in fams for inst in jct[f].values() for s in inst]
        return sum(ratios) / len(ratios)
    out = {}
    for held in jct:
        others = [f for f in jct if f != held]
        chosen = min(PRESSURE_GRID, key=lambda v: (score(others, str(v)), v))
        out[held] = {"tuned_on": others, "chosen": chosen, "held_out_ratio_vs_tiresias": score([held], str(chosen)),
                     "per_value_held_out": {str(v): score([held], str(v)) for v in PRESSURE_GRID},
                     "default_0.8_held_out": score([held], "0.8")}
    return out


def scale_child(policy: str, jobs: int, cluster: str, load: float) -> None:
    """Runs in a fresh process so its wall time and peak RSS are the replay's own."""
    import resource
    model = ThroughputModel()
    spec = ClusterSpec.parse(cluster)
    source = WorkloadSource(f"synthetic:{jobs}@{load}/{PHILLY_MIX}~heavy")
    trace = source.load(model, 0, spec)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = Simulator(spec, create_policy(policy, ModelWithError(model, 0.0)), model, trace,
                       restart_cost=RESTART_COST).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(json.dumps({"policy": policy, "jobs": jobs, "cluster": cluster, "load": load, "wall_s": wall, "cpu_s": cpu,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "summary": summarize(result, spec.total_gpus), "timing": timing(result)}))


def scale_part(args) -> dict:
    runs = {}
    for policy in args.scale_policies:
        log(f"scale replay: {policy}, {args.scale_jobs} jobs on {args.scale_cluster} at load 0.8 ...")
        cmd = [sys.executable, __file__, "--scale-child", policy, "--scale-jobs", str(args.scale_jobs),
               "--scale-cluster", args.scale_cluster]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.scale_timeout)
        except subprocess.TimeoutExpired:
            runs[policy] = {"error": f"over {args.scale_timeout} s", "wall_s": None}
            continue
        runs[policy] = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
            {"error": proc.stderr[-2000:], "wall_s": None}
        log(f"  {policy}: {runs[policy].get('wall_s')} s wall, {runs[policy].get('cpu_s')} s CPU")
    # CPU seconds decide: on a shared machine the wall time also counts other people's work.
    return {"runs": runs, "targets": {p: {"wall_s": r.get("wall_s"), "cpu_s": r.get("cpu_s"), "threshold_s": 60.0,
                                          "met": r.get("cpu_s") is not None and r["cpu_s"] <= 60.0}
                                      for p, r in runs.items()}}


class LatencyProbe(Simulator):
    """Times decisions taken with >= min_queue jobs waiting (wall and this thread's CPU time: on a
    shared machine the wall time also counts others' work); stops after `samples` of them."""

    def __init__(self, *a, min_queue: int, samples: int, **kw):
        super().__init__(*a, **kw)
        self.min_queue, self.samples, self.timed, self.cpu_timed = min_queue, samples, [], []
        self.queued_max = 0
        decide = self.policy.decide

        def timed_decide(state):
            cpu0 = time.thread_time()
            try:
                return decide(state)
            finally:
                self._cpu_ms = (time.thread_time() - cpu0) * 1e3
        self.policy.decide = timed_decide

    def _decide(self):
        queued = len(self.state.queue)
        self.queued_max = max(self.queued_max, queued)
        before = len(self.decision_ms)
        super()._decide()
        if queued >= self.min_queue and len(self.timed) < self.samples:
            self.timed.append(self.decision_ms[before])
            self.cpu_timed.append(self._cpu_ms)


def latency_part(args, model: ThroughputModel) -> dict:
    """Each policy on its own saturated replay: jobs arrive at `latency_load` x the cluster's
    capacity, so the queue passes `min_queue` under every order (least-attained-service too, which
    drains short jobs first and at load 3 kept fewer than 6,000 waiting)."""
    spec = ClusterSpec.parse(args.scale_cluster)
    source = WorkloadSource(f"synthetic:{args.latency_jobs}@{args.latency_load}/{PHILLY_MIX}~heavy")
    trace = source.load(model, 1, spec)
    per_policy = {}
    for policy in args.scale_policies:
        sim = LatencyProbe(spec, create_policy(policy, ModelWithError(model, 0.0)), model, trace,
                           restart_cost=RESTART_COST, min_queue=args.min_queue, samples=args.latency_samples)
        sim.loop.schedule_at(sim.jobs[0].arrival, sim._arrive)
        while len(sim.timed) < sim.samples and sim.loop.run(max_events=2000):
            pass
        v, cpu = sim.timed, sim.cpu_timed
        enough = len(v) >= args.latency_samples
        per_policy[policy] = {"decisions": len(v), "queued_max": sim.queued_max,
                              "p50_ms": percentile(v, 50) if v else None, "p99_ms": percentile(v, 99) if v else None,
                              "max_ms": max(v) if v else None,
                              "cpu_p50_ms": percentile(cpu, 50) if cpu else None,
                              "cpu_p99_ms": percentile(cpu, 99) if cpu else None,
                              "cpu_max_ms": max(cpu) if cpu else None,
                              "met": enough and percentile(v, 99) <= 20.0,
                              "met_cpu": enough and percentile(cpu, 99) <= 20.0}
        log(f"latency: {policy} p99 {per_policy[policy]['p99_ms']} ms wall, {per_policy[policy]['cpu_p99_ms']} ms CPU "
            f"over {len(v)} decisions (queue up to {sim.queued_max})")
    # wall-clock figures on a shared machine also count others' work: the 1-min load average says how much
    return {"cluster": str(spec), "min_queue": args.min_queue, "load": args.latency_load, "jobs": args.latency_jobs,
            "machine_load_average": os.getloadavg()[0], "cpus": os.cpu_count(), "policies": per_policy}


def daemon_part(args, model: ThroughputModel) -> dict:
    """The daemon's scheduling step (poll the jobs that hold GPUs, then decide) with
    --daemon-queued jobs queued on a full 4x4 cluster of logical GPUs: real `sleep` jobs through the
    local executor, the job table in SQLite as `marble serve` keeps it."""
    import random
    import tempfile

    from mlsyskit.core.clock import RealClock
    from mlsyskit.tools.sched.daemon.jobstore import ACTIVE, QUEUED, JobStore
    from mlsyskit.tools.sched.daemon.scheduler import Scheduler
    from mlsyskit.tools.sched.daemon.specs import ClusterConfig, JobRequest, NodeConfig
    from mlsyskit.tools.sched.executors.local import LocalExecutor

    out = {}
    for policy in args.scale_policies:
        for peer in ("kept", "rescan"):   # rescan: the queue read from the table every step, as before
            rng = random.Random(0)
            with tempfile.TemporaryDirectory() as tmp:
                cluster = ClusterConfig(tuple(NodeConfig(f"n{i}", 4, logical=True) for i in range(4)))
                sched = Scheduler(cluster, JobStore(Path(tmp) / "jobs.db"), LocalExecutor(),
                                  create_policy(policy, ModelWithError(model, 0.0)), model, RealClock(), Path(tmp))
                with sched.store.db.transaction():   # one commit for the backlog
                    for _ in range(args.daemon_queued):
                        sched.submit(JobRequest(cmd="exec sleep 600", app=rng.choice(model.apps),
                                                gpus=rng.choice([1, 2, 4, 8])))
                sched.step()   # fills the cluster
                wall, cpu = [], []
                for _ in range(args.daemon_steps):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    if peer == "rescan":
                        sched.reload_queue()
                    sched.step()
                    wall.append((time.perf_counter() - t0) * 1e3)
                    cpu.append((time.thread_time() - c0) * 1e3)
                held = sum(j.held for j in sched.store.jobs(ACTIVE))
                with sched.store.db.transaction():
                    for job in sched.store.jobs((QUEUED,)):
                        sched.cancel(job.id)
                for job in sched.store.jobs(ACTIVE):
                    sched.cancel(job.id)
                deadline = time.monotonic() + 60
                while sched.store.jobs(ACTIVE) and time.monotonic() < deadline:
                    sched.step()
                    time.sleep(0.05)
                sched.store.close()
            r = out.setdefault(policy, {})[peer] = {
                "queued": args.daemon_queued, "gpus_held": held, "steps": len(wall),
                "p50_ms": percentile(wall, 50), "p99_ms": percentile(wall, 99),
                "cpu_p50_ms": percentile(cpu, 50), "cpu_p99_ms": percentile(cpu, 99)}
            log(f"daemon step ({peer} queue): {policy} p50 {r['p50_ms']:.1f} ms wall, {r['cpu_p50_ms']:.1f} ms CPU "
                f"with {args.daemon_queued} queued")
        out[policy]["cpu_p50_rescan_over_kept"] = out[policy]["rescan"]["cpu_p50_ms"] / out[policy]["kept"]["cpu_p50_ms"]
    return out


def show(doc: dict) -> None:
    rows = []
    for family, per_error in doc["targets"].items():
        for error, per_variant in per_error.items():
            for variant, t in per_variant.items():
                c = t["checks"]
                rows.append([family, error, variant, f"{t['mean_jct_s'][variant] / 3600:.2f}",
                             f"{t['mean_jct_s']['optimus'] / 3600:.2f}", f"{t['mean_jct_s']['tiresias'] / 3600:.2f}",
                             *[f"{c[k]['ratio']:.2f}{'' if c[k]['met'] else ' x'}" for k in
                               ("vs_optimus", "vs_tiresias", "vs_fifo_every_run", "worst_slowdown_vs_tiresias")]])
    emit_table(make_table("mean JCT (h) and target ratios per family ('x' = missed): <=0.85 optimus, <=1 tiresias, "
                          "<=0.7 fifo on every run, worst slowdown below tiresias'",
                          ["family", "model error", "variant", "JCT", "optimus", "tiresias", "/optimus", "/tiresias",
                           "/fifo max", "slowdown/tir"], rows))
    floors = []
    for family, per_error in doc["targets"].items():
        c = per_error["0.0"]["marble-las"]["checks"]
        floors.append([family, *[f"{c[k]['floor']:.2f}" for k in ("vs_optimus", "vs_tiresias", "vs_fifo_every_run")]])
    emit_table(make_table("floors: the ratio with no queueing at all (each job alone on the GPUs it asked); "
                          "a target below its floor is out of reach without giving jobs more than they asked",
                          ["family", "/optimus floor", "/tiresias floor", "/fifo floor (worst run)"], floors))
    emit_table(make_table("cross-validated pressure threshold of marble-las (chosen on the other families)",
                          ["held-out family", "chosen", "held-out JCT / tiresias", "with default 0.8"],
                          [[f, v["chosen"], f"{v['held_out_ratio_vs_tiresias']:.3f}", f"{v['default_0.8_held_out']:.3f}"]
                           for f, v in doc["cross_validation"].items()]))
    emit_table(make_table("families met (of 4), per variant and model error", ["variant", *map(str, ERRORS)],
                          [[v, *[doc["families_met"][str(e)][v] for e in ERRORS]] for v in VARIANTS]))
    if "scale" in doc:
        emit_table(make_table("Philly-like scale replay", ["policy", "wall s", "CPU s", "peak RSS MiB", "decision p99 ms"],
                              [[p, r.get("wall_s"), r.get("cpu_s"), r.get("peak_rss_mib"),
                                r["timing"]["decision_ms_p99"] if "timing" in r else r.get("error")]
                               for p, r in doc["scale"]["runs"].items()]))
        emit_table(make_table(f"decision latency with >= {doc['latency']['min_queue']} queued",
                              ["policy", "decisions", "p50 ms", "p99 ms", "max ms", "CPU p99 ms"],
                              [[p, v["decisions"], v["p50_ms"], v["p99_ms"], v["max_ms"], v["cpu_p99_ms"]]
                               for p, v in doc["latency"]["policies"].items()]))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_marble.json"))
    ap.add_argument("--seeds", type=positive, default=2)
    ap.add_argument("--synthetic-jobs", type=positive, default=250)
    ap.add_argument("--scale", action="store_true", help="also the 82k-job replays and the latency probe")
    ap.add_argument("--scale-jobs", type=positive, default=82_000)
    ap.add_argument("--scale-cluster", default="60x8")
    ap.add_argument("--scale-timeout", type=positive, default=600)
    ap.add_argument("--latency-jobs", type=positive, default=20_000)
    ap.add_argument("--latency-load", type=float, default=10.0)
    ap.add_argument("--min-queue", type=positive, default=10_000)
    ap.add_argument("--latency-samples", type=positive, default=200)
    ap.add_argument("--daemon-queued", type=positive, default=5000)
    ap.add_argument("--daemon-steps", type=positive, default=50)
    ap.add_argument("--families", type=lambda t: t.split(","), default=None,
                    help="comma-separated subset of pollux,load,size-mix,heavy-tail (default: all four)")
    ap.add_argument("--scale-policies", type=lambda t: t.split(","), default=POLICIES,
                    help="comma-separated policies for the scale replays and the latency probe (default: all)")
    ap.add_argument("--skip-jct", action="store_true", help="only the scale replays, the latency probe and the daemon step")
    ap.add_argument("--only-daemon", action="store_true", help="only the daemon step (with --scale-policies)")
    ap.add_argument("--scale-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_child:
        scale_child(args.scale_child, args.scale_jobs, args.scale_cluster, 0.8)
        return
    model = ThroughputModel()
    t0 = time.perf_counter()
    if args.only_daemon:
        print(json.dumps(daemon_part(args, model), indent=1, sort_keys=True))
        return
    doc: dict = {"restart_cost_s": RESTART_COST, "seeds": args.seeds, "synthetic_jobs": args.synthetic_jobs,
                 "families": {f: [f"{w} on {c}" for w, c in inst] for f, inst in families(args.synthetic_jobs).items()}}
    if args.skip_jct:   # the scale figures alone, written as soon as each part is done
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc["scale"] = scale_part(args)
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        doc["latency"] = latency_part(args, model)
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        doc["daemon_step"] = daemon_part(args, model)
        doc["bench_wall_s"] = time.perf_counter() - t0
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        log(f"wrote {args.out}")
        return
    jct = doc["runs"] = jct_part(args, model)
    doc["targets"] = {f: {str(e): {v: targets(jct[f], str(e), v) for v in VARIANTS} for e in ERRORS} for f in jct}
    doc["families_met"] = {str(e): {v: sum(doc["targets"][f][str(e)][v]["met"] for f in jct) for v in VARIANTS}
                           for e in ERRORS}
    doc["checks_met"] = {str(e): {v: {k: sum(doc["targets"][f][str(e)][v]["checks"][k]["met"] for f in jct)
                                        for k in ("vs_optimus", "vs_tiresias", "vs_fifo_every_run",
                                                  "worst_slowdown_vs_tiresias")} for v in VARIANTS} for e in ERRORS}
    need = min(3, len(jct))   # "at least 3 of 4 families" (all of them when fewer are run)
    doc["family_target_met"] = {str(e): {v: n >= need for v, n in doc["families_met"][str(e)].items()} for e in ERRORS}
    doc["cross_validation"] = cross_validate(jct)
    if args.scale:
        doc["scale"] = scale_part(args)
        doc["latency"] = latency_part(args, model)
        doc["daemon_step"] = daemon_part(args, model)
    doc["bench_wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    show(doc)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
