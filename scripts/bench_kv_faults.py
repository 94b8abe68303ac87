#!/usr/bin/env python3
"""Safety under faults: seeded `bespokv check` runs per mode with kill -9, pause, partition
and restart, summarised as a table and JSON (every run's verdict is in the JSON).

    .venv/bin/python scripts/bench_kv_faults.py --runs 20 --modes ms-sc,aa-sc --out runs/kv_faults

Targets (issue 14): 0 linearizability violations and 0 lost acknowledged writes over >= 20
runs per strong mode; eventual modes converge within 5 s of quiescence and lose nothing
acknowledged (an eventual register may keep an older of two writes its replicas had not
exchanged yet: `LWW inversions`, reported, not a loss); a write that cannot complete is answered with an error within the node's
write timeout (2 s) instead of hanging: `max write wait` counts answered writes, `client
timeouts` the writes that got no answer within the client's 2.5 s (a paused node answers
nothing, so some are expected under SIGSTOP). Seeds are `--seed0 .. --seed0 + runs - 1`;
a failed run is replayed by `bespokv check --mode M --seed S` with the same settings.

    .venv/bin/python scripts/bench_kv_faults.py --recovery --repeats 3 --out runs/kv_recovery

Recovery (issue 15; check/recovery.py): 1x3 clusters under the embedded coordinator with the
default heartbeat (0.5 s; failed after max(3 missed, 8 intervals) = 4 s, issue 22), each figure per repeat:
failure detection (<= 5 s), write unavailability when the ms-sc head dies (<= 5 s), read unavailability when the
ms-sc tail dies (<= 5 s, the detection bound), catch-up rate of a replacement replica (>= 50 MB/s on loopback);
the table shows the median and the worst repeat, the JSON every repeat. A second table: kill -9 of
the head of a `bespokv up` cluster to its supervisor's empty replacement serving (no target).

    .venv/bin/python scripts/bench_kv_faults.py --join --repeats 3 --out runs/kv_join

Replacement join (issue 15; check/joinstall.py): a killed ms-sc tail restarted under a write load,
copy-then-join (a learner copies first, joins, takes the log tail) against the old order
(`--join-first` alone: join, then copy the whole snapshot): the longest span without an
acknowledged write from the restart until it serves + 1 s, and the bytes it copied after its join
(target: the log tail only, no snapshot after the join); the stall ratio is against join-first
in the same run.

    .venv/bin/python scripts/bench_kv_faults.py --switch --repeats 1 --out runs/kv_switch

Live switch (check/switchcheck.py): the 12 transitions among ms-sc, ms-ec, aa-sc, aa-ec under load, each
checked (linearizable after a switch to a strong mode, nothing lost, only retriable errors), with
the time until throughput is back to >= 90% of the new mode's steady state (target <= 5 s).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from mlsyskit.core.console import emit_table, fmt, log, make_table
from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.kv.check.nemesis import parse_faults
from mlsyskit.tools.kv.check.runner import MODES, CheckSpec, run_check

SERVER_WRITE_TIMEOUT_S = 2.0  # the nodes' default write timeout (-TRYAGAIN after it)


def summarise(mode: str, runs: list[dict]) -> dict:
    conv = [r["convergence_s"] for r in runs if r["converged"]]
    strong = mode.endswith("-sc")
    return {
        "mode": mode, "runs": len(runs), "valid": sum(r["valid"] for r in runs),
        "errors": sum(r["error"] is not None for r in runs),
        "linearizability_violations": sum(r["linearizable"] is False for r in runs) if strong else None,
        "unknown": sum(r["linearizable"] is None for r in runs) if strong else None,
        "lost_acked_writes": sum(r["lost_acked_writes"] for r in runs),
        "lww_inversions": None if strong else sum(r["lww_inversions"] for r in runs),
        "phantoms": sum(r["phantoms"] for r in runs),
        "converged": sum(bool(r["converged"]) for r in runs),
        "convergence_p50_s": percentile(conv, 50) if conv else None,
        "convergence_max_s": max(conv) if conv else None,
        "max_write_wait_s": max(r["max_write_wait_s"] for r in runs),
        "client_timeouts": sum(r["write_timeouts"] for r in runs),
        "longest_write_outage_s": max(r["longest_write_outage_s"] for r in runs),
        "ops_ok": sum(r["outcomes"].get("ok", 0) for r in runs),
        "ops_fail": sum(r["outcomes"].get("fail", 0) for r in runs),
        "ops_info": sum(r["outcomes"].get("info", 0) for r in runs),
        "faults": sum(1 for r in runs for f in r["faults"] if f["phase"] == "start"),
        "maps": sum(r.get("reconfigurations", 0) for r in runs),
        "async_failover_losses": sum(r.get("async_failover_losses", 0) for r in runs),
        "failed_seeds": [r["spec"]["seed"] for r in runs if not r["valid"]],
    }


def targets(summary: dict) -> dict:
    met = {"no lost acknowledged write": summary["lost_acked_writes"] == 0 and summary["phantoms"] == 0,
           "every run finished": summary["errors"] == 0,
           "writes answered within the write timeout": summary["max_write_wait_s"] <= SERVER_WRITE_TIMEOUT_S + 0.25}
    if summary["linearizability_violations"] is not None:
        met["linearizable"] = summary["linearizability_violations"] == 0 and summary["unknown"] == 0
    else:
        met["converged within 5 s"] = summary["converged"] == summary["runs"]
    return met


RECOVERY_TARGETS = {"detection_s": ("<=", 5.0), "write_outage_s": ("<=", 5.0), "read_outage_s": ("<=", 5.0),
                    "catch_up_mb_per_s": (">=", 50.0)}


def recovery(args: argparse.Namespace) -> int:
    from kvbench.recovery import catch_up, outage
    from kvbench.replacement import replacement_ready

    replacements: list[dict] = []

    figures: dict[str, list[float]] = {k: [] for k in RECOVERY_TARGETS}
    repeats = []
    for i in range(args.repeats):
        base = args.out / "recovery" / f"r{i}"
        write = asyncio.run(outage("ms-sc", "head", "put", base / "write", seed=i))
        read = asyncio.run(outage("ms-sc", "tail", "get", base / "read", seed=i))
        copy = asyncio.run(catch_up("ms-sc", base / "copy", mbytes=args.catch_up_mb))
        replaced = replacement_ready(base / "replace", seed=i)  # `bespokv up` + its supervisor
        replacements.append(replaced)
        repeats.append({"write": write, "read": read, "catch_up": copy, "replacement": replaced})
        figures["detection_s"] += [write["detection_s"], read["detection_s"]]
        figures["write_outage_s"].append(write["outage_s"])
        figures["read_outage_s"].append(read["outage_s"])
        figures["catch_up_mb_per_s"].append(copy["mb_per_s"])
        log(f"repeat {i}: detection {write['detection_s']}/{read['detection_s']} s, write outage "
            f"{write['outage_s']} s, read outage {read['outage_s']} s, catch-up {copy['mb_per_s']} MB/s "
            f"({copy['copied_mb']} MB in {copy['copy_s']} s)")
    rows, summary = [], {}
    for name, (op, target) in RECOVERY_TARGETS.items():
        values = figures[name]
        worst = max(values) if op == "<=" else min(values)
        met = worst <= target if op == "<=" else worst >= target
        summary[name] = {"median": percentile(values, 50), "worst": worst, "target": f"{op} {target}", "met": met}
        rows.append([name, fmt(percentile(values, 50)), fmt(worst), f"{op} {target:g}", "yes" if met else "NO"])
    emit_table(make_table(f"bespokv recovery (ms-sc 1x3, heartbeat 0.5 s x 3; {args.repeats} repeats)",
                          ["figure", "median", "worst", "target", "met"], rows))
    replacement = replacement_table(replacements)
    path = args.out / "bench_kv_recovery.json"
    path.write_text(json.dumps({"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                "summary": summary, "replacement": replacement, "repeats": repeats},
                               indent=2, allow_nan=False))
    log(f"wrote {path}")
    return 0 if all(s["met"] for s in summary.values()) else 1


def replacement_table(runs: list[dict]) -> dict:
    """kill -9 of the ms-sc head to the supervisor's empty replacement serving (tools/kv/replacement.py):
    no target in the issue; reported, and a replacement missing keys fails the run itself."""
    out, rows = {}, []
    for name in ("failover_s", "restart_s", "ready_s"):
        values = [r[name] for r in runs]
        out[name] = {"median": percentile(values, 50), "worst": max(values)}
        rows.append([name, fmt(out[name]["median"]), fmt(out[name]["worst"])])
    emit_table(make_table(f"replacement by the supervisor (kill -9 of the head, 1x3 ms-sc, {runs[0]['keys']} "
                          f"keys of {runs[0]['value_size']} B; seconds from the kill)",
                          ["figure", "median", "worst"], rows))
    return out


# an Eulerian circuit of the complete directed graph on the four modes: each of the 12 transitions once
SWITCH_PATH = ["ms-sc", "ms-ec", "aa-sc", "ms-sc", "aa-sc", "ms-ec", "ms-sc", "aa-ec", "ms-ec", "aa-ec", "aa-sc",
               "aa-ec", "ms-sc"]


def switches(args: argparse.Namespace) -> int:
    from mlsyskit.tools.kv.check.switchcheck import run_switches

    runs = [asyncio.run(run_switches(SWITCH_PATH, args.out / "switch" / f"r{i}", seed=i, segment_s=3.0))
            for i in range(args.repeats)]
    rows = []
    for i, r in enumerate(runs):
        for sw in r["switches"]:
            sw.pop("began"), sw.pop("acked")
            rows.append([i, f"{sw['before']} -> {sw['after']}", fmt(sw["settled_s"]), fmt(sw["recovery_s"]),
                         "yes" if sw["recovery_s"] <= 5.0 else "NO"])
        log(f"run {i}: valid {r['valid']}, linearizable after strong switches {r['linearizable_after_switch']}, "
            f"lost {r['lost_acked_writes']}, errors {r['errors']} ({r['non_retriable_errors']} not retriable)")
    emit_table(make_table("bespokv live switch under load (1x3, 4 clients)",
                          ["run", "switch", "settled s", "throughput >= 90% after s", "<= 5 s"], rows))
    path = args.out / "bench_kv_switch.json"
    path.write_text(json.dumps({"path": SWITCH_PATH, "runs": runs}, indent=2, allow_nan=False))
    log(f"wrote {path}")
    ok = all(r["valid"] and all(sw["recovery_s"] <= 5.0 for sw in r["switches"]) for r in runs)
    return 0 if ok else 1


def join_orders(args: argparse.Namespace) -> int:
    """Copy-then-join against join-then-copy (check/joinstall.py): the ms-sc write stall while a
    replacement joins and the bytes it copies after its join (target: the log tail only)."""
    from kvbench.joinstall import join_stall

    orders = [True] if args.join_first else [False, True]
    runs = [asyncio.run(join_stall(args.out / "join" / f"r{i}-{'first' if jf else 'copy'}", join_first=jf,
                                   mbytes=args.join_mb, seed=i))
            for i in range(args.repeats) for jf in orders]
    for r in runs:
        log(f"{r['order']}: write stall {r['write_stall_s']} s, {r['copied_after_join_bytes']} bytes copied "
            f"after the join, join catch-up {r['join_catch_up_s']} s, learner copy {r['learner_copy_s']} s")
    rows, summary = [], {}
    for order in ("copy-then-join", "join-first"):
        mine = [r for r in runs if r["order"] == order]
        if not mine:
            continue
        tail_only = all(r["snapshots"] == 1 and r["copied_after_join_bytes"] == r["tail_bytes"] for r in mine)
        summary[order] = {"write_stall_s_median": percentile([r["write_stall_s"] for r in mine], 50),
                          "write_stall_s_worst": max(r["write_stall_s"] for r in mine),
                          "copied_after_join_bytes_worst": max(r["copied_after_join_bytes"] for r in mine),
                          "join_catch_up_s_median": percentile([r["join_catch_up_s"] for r in mine], 50),
                          "tail_only": tail_only}
        s = summary[order]
        rows.append([order, fmt(s["write_stall_s_median"]), fmt(s["write_stall_s_worst"]),
                     fmt(s["join_catch_up_s_median"]), s["copied_after_join_bytes_worst"],
                     "-" if order == "join-first" else ("yes" if tail_only else "NO")])
    if len(summary) == 2:
        summary["stall_ratio"] = round(summary["copy-then-join"]["write_stall_s_median"]
                                       / max(summary["join-first"]["write_stall_s_median"], 1e-9), 3)
    emit_table(make_table(f"bespokv replacement join (ms-sc 1x3, {args.join_mb} MB, heartbeat 0.5 s; "
                          f"{args.repeats} repeats)", ["order", "write stall s (median)", "worst",
                                                       "join catch-up s", "bytes after join (worst)",
                                                       "tail only"], rows))
    path = args.out / "bench_kv_join.json"
    path.write_text(json.dumps({"settings": {"join_mb": args.join_mb, "repeats": args.repeats},
                                "summary": summary, "runs": runs}, indent=2, allow_nan=False))
    log(f"wrote {path}")
    return 0 if summary.get("copy-then-join", {"tail_only": True})["tail_only"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="seeded runs per mode (20)")
    ap.add_argument("--modes", default="ms-sc,aa-sc,ms-ec,aa-ec", help="comma-separated modes")
    ap.add_argument("--nemesis", default="kill,pause,partition,restart")
    ap.add_argument("--ops", type=int, default=300, help="at least this many operations per run (300)")
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--keys", type=int, default=5)
    ap.add_argument("--datalet", default="memory")
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/kv_faults"), help="folder: bench_kv_faults.json, "
                                                                            "runs/MODE-seedS/ (histories)")
    ap.add_argument("--coordinator", default="none", help="none (default), embedded, zookeeper://... or "
                                                         "zookeeper-local (a ZooKeeper started for the bench, "
                                                         "one root per run): the checked clusters fail over")
    ap.add_argument("--heartbeat", type=float, default=0.5, help="with --coordinator: heartbeat interval, s")
    ap.add_argument("--recovery", action="store_true", help="measure failover and catch-up instead")
    ap.add_argument("--switch", action="store_true", help="live switches under load instead (all 12 "
                                                          "transitions, checked)")
    ap.add_argument("--repeats", type=int, default=3, help="with --recovery/--switch: repeats (3)")
    ap.add_argument("--catch-up-mb", type=int, default=32, help="with --recovery: MB in the shard (32)")
    ap.add_argument("--join", action="store_true", help="compare copy-then-join with the old join-then-copy: "
                                                        "write stall while a replacement joins, bytes it copies after")
    ap.add_argument("--join-first", action="store_true", help="with --join: only the old order (join, then copy)")
    ap.add_argument("--join-mb", type=int, default=32, help="with --join: MB in the shard (32)")
    args = ap.parse_args()
    if args.join or args.join_first:
        args.out.mkdir(parents=True, exist_ok=True)
        return join_orders(args)
    if args.recovery or args.switch:
        args.out.mkdir(parents=True, exist_ok=True)
        return recovery(args) if args.recovery else switches(args)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes) or args.runs < 1:
        ap.error(f"--modes takes {', '.join(MODES)}; --runs must be >= 1")
    nemesis = parse_faults(args.nemesis)
    args.out.mkdir(parents=True, exist_ok=True)
    per_mode: dict[str, list[dict]] = {}
    with contextlib.ExitStack() as stack:
        zk = None
        if args.coordinator == "zookeeper-local":  # Debian's zookeeper, standalone, for this bench only
            from mlsyskit.tools.kv.coord.zk_local import LocalZooKeeper
            zk = stack.enter_context(LocalZooKeeper(args.out / "zookeeper"))
        for mode in modes:
            for i in range(args.runs):
                seed = args.seed0 + i
                coordinator = f"zookeeper://{zk.hosts}/bench-{mode}-{seed}" if zk else args.coordinator
                spec = CheckSpec(mode=mode, nemesis=nemesis, ops=args.ops, clients=args.clients, keys=args.keys,
                                 seed=seed, datalet=args.datalet, coordinator=coordinator,
                                 heartbeat=args.heartbeat)
                per_mode.setdefault(mode, []).append(_checked(spec, args.out / "runs" / f"{mode}-seed{seed}"))
    summaries = [summarise(m, runs) for m, runs in per_mode.items()]
    rows = []
    for s in summaries:
        t = targets(s)
        rows.append([s["mode"], f"{s['valid']}/{s['runs']}", s["faults"],
                     "-" if s["linearizability_violations"] is None else s["linearizability_violations"],
                     s["lost_acked_writes"], "-" if s["lww_inversions"] is None else s["lww_inversions"],
                     f"{s['converged']}/{s['runs']}", fmt(s["convergence_max_s"]),
                     fmt(s["max_write_wait_s"]), s["client_timeouts"], fmt(s["longest_write_outage_s"]),
                     f"{s['ops_ok']}/{s['ops_fail']}/{s['ops_info']}", "yes" if all(t.values()) else "NO"])
    emit_table(make_table(f"bespokv under faults ({args.nemesis}; {args.runs} seeded runs per mode)",
                          ["mode", "valid runs", "faults", "lin. violations", "lost acked", "LWW inversions",
                           "converged",
                           "converge max s", "max write wait s", "client timeouts", "longest outage s",
                           "ok/fail/info", "targets met"], rows))
    report = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "server_write_timeout_s": SERVER_WRITE_TIMEOUT_S,
              "summary": [{**s, "targets": targets(s)} for s in summaries], "runs": per_mode}
    path = args.out / "bench_kv_faults.json"
    path.write_text(json.dumps(report, indent=2, allow_nan=False))
    log(f"wrote {path}")
    return 0 if all(all(targets(s).values()) for s in summaries) else 1


def _checked(spec: CheckSpec, out: Path) -> dict:
    result = asyncio.run(run_check(spec, out)).as_dict()
    result.pop("digests", None)
    log(f"{spec.mode} seed {spec.seed}: {'valid' if result['valid'] else 'INVALID'} "
        f"({result['outcomes']}, {result['duration_s']:.1f} s)")
    return result


if __name__ == "__main__":
    sys.exit(main())
