#!/usr/bin/env python
"""marble benchmark: does the default policy beat Tiresias and Optimus on workloads it was not tuned on?

Every policy gets what a running cluster reports (policies.learned: a fitted prior with the
default model error, corrected by measured throughput); the simulator alone holds the truth.

1. Tuning (--tune): marble's constants (efficiency/grow thresholds, LAS queues, restart interval,
   starvation limit, ...) are chosen on the four shipped Pollux workloads ONLY (workload-1..4 at
   their own arrival times and with arrivals compressed to load 8, 16x6 and 16x4, seed 0): the grid point with the best geometric mean of marble / tiresias mean JCT whose worst
   slowdown stays within 2x tiresias' (the target's bound), if it beats the shipped defaults by more
   than TUNE_MARGIN (0.5%, one seed's noise; else they stay). The shipped PolicyOptions defaults are that choice; the
   JSON lists the grid and the workloads used ("tuning_workloads").
2. Held-out (always): Pollux-format workloads this script generates (`heldout_rows`, documented
   below) with other seeds, arrival processes and application mixes than the shipped ones, on
   16x4 and 16x6, --seeds seeds (>= 3 for the acceptance). Targets per (workload, cluster) on the
   means over seeds: marble <= 0.80x tiresias and <= 0.75x optimus in average JCT, worst slowdown
   <= 2x tiresias'; met on a cluster when at least 3 of the 4 workloads meet all three. The floor
   ("alone at best size": every job alone on the whole cluster at its fastest GPU count, no
   queueing, batch fixed) says how far any policy that keeps each job's batch could go. The
   oracle-order bound (marblebench.bound, benchmark-only) is marble ranking jobs by their TRUE
   remaining work: how far better size estimates alone could take marble. The per-application
   breakdown (marblebench.breakdown, first seed) says where each policy's mean JCT comes from.
3. Realistic sizes (always): windows of --window consecutive jobs of the real Philly trace
   (mostly 1-GPU jobs; not tuning data), arrivals scaled to load 0.8, on 16x4 and 16x6: target
   marble <= 1.02x tiresias on every one.
4. Scale (--scale): the real 82,247-job Philly trace at load 0.8 on 60x8, each policy in a fresh
   process: wall and CPU seconds and the machine's load average; target <= 60 s.
5. Decision latency (--scale): each policy on its own saturated replay (Philly-like jobs arriving
   at load 10 on 60x8); decisions taken with >= --min-queue jobs waiting are timed; p99 <= 20 ms.
6. Daemon step (--scale): `marble serve`'s scheduling step with --daemon-queued jobs queued.

    .venv/bin/python scripts/bench_marble.py --out runs/bench_marble.json --seeds 3 [--tune] [--scale]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlsyskit.core.console import emit_table, log, make_table
from mlsyskit.tools.sched.cluster import ClusterSpec
from mlsyskit.tools.sched.experiment import WorkloadSource, run_one
from mlsyskit.tools.sched.policies import DEFAULT_POLICY, PolicyOptions
from mlsyskit.tools.sched.policies.sizing import layouts
from mlsyskit.tools.sched.throughput import ThroughputModel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/marblebench
from marblebench import RESTART_COST  # noqa: E402
from marblebench.bound import oracle_order_jct  # noqa: E402
from marblebench.breakdown import breakdown, rows_for_table  # noqa: E402
from marblebench.heldout import APP_REQUESTS, HELDOUT, heldout_rows, philly_windows, write_csv  # noqa: E402
from marblebench.speed import daemon_part, latency_part, scale_child, scale_part  # noqa: E402

POLICIES = ["fifo", "backfill", "optimus", "tiresias", "marble-las", "pollux", "marble-admit", "marble"]
CLUSTERS = ["16x4", "16x6"]
# The four shipped workloads, at their own arrival times and with arrivals compressed to load 8
# (the held-out workloads run at loads 4-24; the shipped ones at 1.3-4.9): the only tuning data.
TUNING_LOAD = 8
TUNING = [f"workload-{i}" for i in range(1, 5)] + [f"workload-{i}@{TUNING_LOAD}" for i in range(1, 5)]
TUNE_MARGIN = 0.005   # a grid point replaces the shipped defaults only if its geomean is > 0.5% lower
TUNE_GRID = [{}, {"marble_thresholds": ()}, {"marble_thresholds": (3600.0,)}, {"marble_thresholds": (1800.0, 18000.0)},
             {"marble_thresholds": (7200.0, 72000.0)}, {"rank_by_estimate": False}, {"admit_threshold": 0.5},
             {"admit_threshold": 0.2}, {"grow_threshold": 0.5}, {"marble_grow_gain": 1.0}, {"marble_grow_gain": 8.0},
             {"elastic_max_scale": 2.0}, {"resize_interval": 3600.0, "grow_period": 900.0}, {"starvation_s": 43200.0},
             {"adapt_batch": False, "admit_threshold": 0.35}, {"goodput_sizing": False, "admit_threshold": 0.35},
             {"admit_threshold": 0.9}]
def floor_alone(jobs, model: ThroughputModel, spec: ClusterSpec) -> float:
    """Mean JCT if every job ran alone on the whole cluster at its fastest GPU count (no queueing)."""
    best = {}
    total = 0.0
    for j in jobs:
        key = (j.app, j.batch_size)
        if key not in best:
            best[key] = max(layouts(model, j.app, j.batch_size, spec.total_gpus, spec.gpus_per_node)[1][1:])
        total += j.work / best[key]
    return total / len(jobs)


def run_set(source: WorkloadSource, spec: ClusterSpec, seeds: range, model: ThroughputModel, policies: list[str],
            options: PolicyOptions | None = None) -> dict:
    """Per policy: per-seed summaries and the means over seeds; plus the floor."""
    out: dict = {"policies": {p: {"seeds": {}} for p in policies}, "floor_alone_s": []}
    for seed in seeds:
        jobs = source.load(model, seed, spec)
        out["floor_alone_s"].append(floor_alone(jobs, model, spec))
        for p in policies:
            r = run_one(source, spec, p, seed, model, options or PolicyOptions(), RESTART_COST, jobs=jobs)
            out["policies"][p]["seeds"][str(seed)] = {k: r.summary[k] for k in (
                "avg_jct_s", "median_jct_s", "p99_jct_s", "max_slowdown", "makespan_s", "alloc_util", "preemptions",
                "resizes")}
    for entry in out["policies"].values():
        per = list(entry["seeds"].values())
        entry["avg_jct_s"] = statistics.fmean(s["avg_jct_s"] for s in per)
        entry["worst_slowdown"] = max(s["max_slowdown"] for s in per)
    out["floor_alone_s"] = statistics.fmean(out["floor_alone_s"])
    return out


def checks(res: dict, vs_tiresias: float, vs_optimus: float | None) -> dict:
    p = res["policies"]
    out = {"vs_tiresias": {"ratio": p["marble"]["avg_jct_s"] / p["tiresias"]["avg_jct_s"], "threshold": vs_tiresias,
                           "floor": res["floor_alone_s"] / p["tiresias"]["avg_jct_s"]}}
    if vs_optimus is not None:
        out["vs_optimus"] = {"ratio": p["marble"]["avg_jct_s"] / p["optimus"]["avg_jct_s"], "threshold": vs_optimus,
                             "floor": res["floor_alone_s"] / p["optimus"]["avg_jct_s"]}
        out["worst_slowdown_vs_tiresias"] = {"ratio": p["marble"]["worst_slowdown"] / p["tiresias"]["worst_slowdown"],
                                             "threshold": 2.0}
    for c in out.values():
        c["met"] = c["ratio"] <= c["threshold"]
    return out


def tune_part(args, model: ThroughputModel) -> dict:
    """Grid over marble's constants on the shipped workloads only (seed 0, both clusters)."""
    ref = {}
    grid = []
    for point in TUNE_GRID:
        opts = PolicyOptions(**point)
        ratios, slow = [], []
        for cluster in CLUSTERS:
            spec = ClusterSpec.parse(cluster)
            for name in TUNING:
                source = WorkloadSource(name)
                jobs = source.load(model, 0, spec)
                if (cluster, name) not in ref:
                    ref[(cluster, name)] = run_one(source, spec, "tiresias", 0, model, opts, RESTART_COST, jobs=jobs).summary
                s = run_one(source, spec, "marble", 0, model, opts, RESTART_COST, jobs=jobs).summary
                ratios.append(s["avg_jct_s"] / ref[(cluster, name)]["avg_jct_s"])
                slow.append(s["max_slowdown"] / ref[(cluster, name)]["max_slowdown"])
        gm = math.exp(statistics.fmean(map(math.log, ratios)))
        grid.append({"options": point, "geomean_vs_tiresias": gm, "worst_slowdown_vs_tiresias": max(slow),
                     "ratios": ratios})
        log(f"  tune {point}: {gm:.3f} x tiresias, worst slowdown {max(slow):.2f} x")
    ok = [g for g in grid if g["worst_slowdown_vs_tiresias"] <= 2.0] or grid   # the target bound
    chosen = min(ok, key=lambda g: g["geomean_vs_tiresias"])
    if grid[0] in ok and chosen["geomean_vs_tiresias"] > grid[0]["geomean_vs_tiresias"] * (1 - TUNE_MARGIN):
        chosen = grid[0]   # within one seed's noise of the shipped defaults: keep them
    return {"tuning_workloads": TUNING, "clusters": CLUSTERS, "seed": 0, "grid": grid, "chosen": chosen["options"],
            "margin": TUNE_MARGIN, "shipped_defaults_are_the_choice": chosen["options"] == {}}


def heldout_part(args, model: ThroughputModel, folder: Path) -> dict:
    out: dict = {}
    for name in args.heldout:
        for cluster in CLUSTERS:
            spec = ClusterSpec.parse(cluster)
            # one file per seed: the generator's seed and the replay's seed move together
            res = None
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                path = write_csv(folder / f"{name}-seed{seed}.csv", heldout_rows(name, seed))
                one = run_set(WorkloadSource(str(path)), spec, range(seed, seed + 1), model, args.policies)
                if res is None:
                    res = {"policies": {p: {"seeds": {}} for p in args.policies}, "floor_alone_s": [],
                           "oracle_order_bound": {"seeds": {}}}
                for p in args.policies:
                    res["policies"][p]["seeds"][str(seed)] = one["policies"][p]["seeds"][str(seed)]
                res["floor_alone_s"].append(one["floor_alone_s"])
                jobs = WorkloadSource(str(path)).load(model, seed, spec)
                res["oracle_order_bound"]["seeds"][str(seed)] = oracle_order_jct(jobs, spec, seed, model,
                                                                                 RESTART_COST)["avg_jct_s"]
            for entry in res["policies"].values():
                per = list(entry["seeds"].values())
                entry["avg_jct_s"] = statistics.fmean(s["avg_jct_s"] for s in per)
                entry["worst_slowdown"] = max(s["max_slowdown"] for s in per)
            res["floor_alone_s"] = statistics.fmean(res["floor_alone_s"])
            bound = res["oracle_order_bound"]
            bound["avg_jct_s"] = statistics.fmean(bound["seeds"].values())
            bound["vs_optimus"] = bound["avg_jct_s"] / res["policies"]["optimus"]["avg_jct_s"]
            bound["vs_tiresias"] = bound["avg_jct_s"] / res["policies"]["tiresias"]["avg_jct_s"]
            res["checks"] = checks(res, 0.80, 0.75)
            res["met"] = all(c["met"] for c in res["checks"].values())
            out.setdefault(name, {})[cluster] = res
            log(f"  held-out {name} on {cluster}: marble {res['checks']['vs_tiresias']['ratio']:.2f}x tiresias, "
                f"{res['checks']['vs_optimus']['ratio']:.2f}x optimus")
    return out


def breakdown_part(args, model: ThroughputModel, folder: Path) -> dict:
    """Per application, where marble's, optimus' and tiresias' mean JCT comes from (first seed)."""
    out: dict = {}
    seed = args.first_seed
    for name in args.heldout:
        path = write_csv(folder / f"{name}-seed{seed}.csv", heldout_rows(name, seed))
        for cluster in CLUSTERS:
            out.setdefault(name, {})[cluster] = breakdown(WorkloadSource(str(path)), ClusterSpec.parse(cluster), seed,
                                                          model, ["marble", "optimus", "tiresias"], RESTART_COST, folder)
    return out


def realistic_part(args, model: ThroughputModel, folder: Path) -> dict:
    out: dict = {}
    for path in philly_windows(folder, args.windows, args.window):
        for cluster in CLUSTERS:
            res = run_set(WorkloadSource(f"{path}@0.8"), ClusterSpec.parse(cluster), range(1), model,
                          ["tiresias", "marble"])
            res["checks"] = checks(res, 1.02, None)
            res["met"] = res["checks"]["vs_tiresias"]["met"]
            out.setdefault(path.stem, {})[cluster] = res
            log(f"  realistic {path.stem} on {cluster}: marble {res['checks']['vs_tiresias']['ratio']:.3f}x tiresias")
    return out


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def show(doc: dict) -> None:
    rows = []
    for name, per_cluster in doc["heldout"].items():
        for cluster, res in per_cluster.items():
            p, c = res["policies"], res["checks"]
            rows.append([name, cluster, *[_h(p[q]["avg_jct_s"]) for q in doc["policies"]],
                         *[f"{c[k]['ratio']:.2f}{'' if c[k]['met'] else ' x'}"
                           for k in ("vs_tiresias", "vs_optimus", "worst_slowdown_vs_tiresias")],
                         f"{c['vs_tiresias']['floor']:.2f}", f"{res['oracle_order_bound']['vs_optimus']:.2f}"])
    emit_table(make_table(f"held-out Pollux-format workloads, mean JCT (h) over {doc['seeds']} seeds; targets "
                          "('x' = missed): marble <= 0.80 tiresias, <= 0.75 optimus, worst slowdown <= 2x tiresias'",
                          ["workload", "cluster", *doc["policies"], "/tiresias", "/optimus", "slowdown/tir",
                           "floor/tir", "oracle-order/opt"], rows))
    if "breakdown" in doc:
        emit_table(make_table(f"where the mean JCT comes from (held-out, seed {doc['first_seed']}): per application; "
                              "held/work = GPU-hours held per single-GPU-hour of work",
                              ["held-out", "cluster", "app", "policy", "JCT share", "JCT h", "queued h", "restarts",
                               "held/work"],
                              [row for name, per in doc["breakdown"].items() for cluster, pol in per.items()
                               for row in rows_for_table(name, cluster, pol)]))
    emit_table(make_table("held-out targets met (of 4 workloads; needs 3): all three, and each alone",
                          ["cluster", "all three", "target met", "/tiresias", "/optimus", "slowdown"],
                          [[c, v["workloads_met"], v["met"], *v["per_target"].values()]
                           for c, v in doc["heldout_summary"].items()]))
    emit_table(make_table("realistic sizes: Philly windows at load 0.8, mean JCT (h); target marble <= 1.02 tiresias",
                          ["window", "cluster", "tiresias", "marble", "ratio"],
                          [[w, c, _h(r["policies"]["tiresias"]["avg_jct_s"]), _h(r["policies"]["marble"]["avg_jct_s"]),
                            f"{r['checks']['vs_tiresias']['ratio']:.3f}{'' if r['met'] else ' x'}"]
                           for w, per in doc["realistic"].items() for c, r in per.items()]))
    if "tuning" in doc:
        emit_table(make_table(f"tuning on {', '.join(doc['tuning']['tuning_workloads'])} only (seed 0)",
                              ["options", "geomean /tiresias", "worst slowdown /tiresias"],
                              [[json.dumps(g["options"]), f"{g['geomean_vs_tiresias']:.3f}",
                                f"{g['worst_slowdown_vs_tiresias']:.2f}"] for g in doc["tuning"]["grid"]]))
    if "scale" in doc:
        emit_table(make_table("the real Philly trace (82,247 jobs) at load 0.8 on 60x8; target <= 60 s",
                              ["policy", "wall s", "CPU s", "load avg", "decision p99 ms"],
                              [[p, r.get("wall_s"), r.get("cpu_s"), r.get("machine_load_average"),
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
    ap.add_argument("--seeds", type=positive, default=3)
    ap.add_argument("--first-seed", type=int, default=1,
                    help="held-out seeds start here (seed 0 of the generator was looked at while marble was built)")
    ap.add_argument("--policies", type=lambda t: t.split(","), default=POLICIES)
    ap.add_argument("--heldout", type=lambda t: t.split(","), default=list(HELDOUT),
                    help=f"comma-separated subset of {','.join(HELDOUT)}")
    ap.add_argument("--windows", type=positive, default=3, help="Philly windows for the realistic-size part")
    ap.add_argument("--window", type=positive, default=2000, help="jobs per Philly window")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-application breakdown")
    ap.add_argument("--tune", action="store_true", help="also the tuning grid on the shipped workloads")
    ap.add_argument("--tune-only", action="store_true", help="only the tuning grid")
    ap.add_argument("--scale", action="store_true", help="also the Philly replays, the latency probe and the daemon step")
    ap.add_argument("--skip-jct", action="store_true", help="only the --scale parts")
    ap.add_argument("--scale-cluster", default="60x8")
    ap.add_argument("--scale-jobs", type=positive, default=None, help="a window of the Philly trace (default: all)")
    ap.add_argument("--scale-timeout", type=positive, default=900)
    ap.add_argument("--latency-jobs", type=positive, default=20_000)
    ap.add_argument("--latency-load", type=float, default=10.0)
    ap.add_argument("--min-queue", type=positive, default=10_000)
    ap.add_argument("--latency-samples", type=positive, default=200)
    ap.add_argument("--daemon-queued", type=positive, default=5000)
    ap.add_argument("--daemon-steps", type=positive, default=50)
    ap.add_argument("--scale-policies", type=lambda t: t.split(","), default=["fifo", "tiresias", "marble-las", "marble"])
    ap.add_argument("--scale-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_child:
        scale_child(args.scale_child, args.scale_cluster, 0.8, args.scale_jobs)
        return
    if "marble" not in args.policies or "tiresias" not in args.policies or "optimus" not in args.policies:
        ap.error("--policies must include marble, tiresias and optimus (the targets compare them)")
    if set(args.heldout) - set(HELDOUT):
        ap.error(f"--heldout: unknown workload(s) {', '.join(sorted(set(args.heldout) - set(HELDOUT)))}")
    model = ThroughputModel()
    t0 = time.perf_counter()
    doc: dict = {"restart_cost_s": RESTART_COST, "seeds": args.seeds, "first_seed": args.first_seed,
                 "policies": args.policies,
                 "default_policy": DEFAULT_POLICY, "tuning_workloads": TUNING,
                 "heldout_generator": {k: {"jobs": v[0], "arrivals": v[1], "app_weights": v[2], "request_sizes": v[3]}
                                       for k, v in HELDOUT.items()},
                 "app_requests": APP_REQUESTS,
                 "machine_load_average_start": os.getloadavg()[0], "cpus": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        args.out.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")

    if args.tune or args.tune_only:
        doc["tuning"] = tune_part(args, model)
        save()
        if args.tune_only:
            return
    if not args.skip_jct:
        with tempfile.TemporaryDirectory() as tmp:
            doc["heldout"] = heldout_part(args, model, Path(tmp))
            save()
            if not args.no_breakdown:
                doc["breakdown"] = breakdown_part(args, model, Path(tmp))
                save()
            doc["realistic"] = realistic_part(args, model, Path(tmp))
        need = min(3, len(doc["heldout"]))
        doc["heldout_summary"] = {}
        for cluster in CLUSTERS:
            met = sum(per[cluster]["met"] for per in doc["heldout"].values())
            doc["heldout_summary"][cluster] = {"workloads_met": met, "of": len(doc["heldout"]), "met": met >= need,
                                               "per_target": {k: sum(per[cluster]["checks"][k]["met"]
                                                                     for per in doc["heldout"].values())
                                                              for k in ("vs_tiresias", "vs_optimus",
                                                                        "worst_slowdown_vs_tiresias")}}
        doc["realistic_met"] = all(r["met"] for per in doc["realistic"].values() for r in per.values())
        save()
    if args.scale or args.skip_jct:
        doc["scale"] = scale_part(args)
        save()
        doc["latency"] = latency_part(args, model)
        save()
        doc["daemon_step"] = daemon_part(args, model)
    doc["machine_load_average_end"] = os.getloadavg()[0]
    doc["bench_wall_s"] = time.perf_counter() - t0
    save()
    if not args.skip_jct:
        show(doc)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
