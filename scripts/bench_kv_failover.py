#!/usr/bin/env python3
"""Client-visible errors across a kill -9 of a shard's write point (issue 22 item 4).

    .venv/bin/python scripts/bench_kv_failover.py --modes ms-sc,ms-ec,aa-sc,aa-ec --repeats 2 --out runs/kv_failover

Per mode and repeat: a fresh `bespokv up` cluster (--shards x 3 replicas, embedded coordinator,
default heartbeat and failure timeout, the supervisor on), then tools/kv/check/ridecheck.py:
redis-benchmark (-P 16, SETs) through the proxy, redis-py through the proxy, redis-py's RedisCluster
to the nodes and the smart client write at once while shard 0's write point is killed with SIGKILL.
Counted per client: errors it saw, acknowledged writes missing afterwards, the longest single
operation (how long it was held); for redis-benchmark whether it was still running (it exits on
the first error reply). Target: 0 errors and 0 lost everywhere. os.getloadavg() is in the JSON.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.check import ridecheck
from mlsyskit.tools.kv.ops.processes import ClusterSpec, down, up

CLIENTS = ("proxy", "cluster", "smart")


def one_run(mode: str, shards: int, out: Path) -> dict:
    d = out / "cluster"
    record = up(ClusterSpec(shards=shards, replicas=3, controlet=mode, base_port=free_range(1 + 2 * 3 * shards),
                            data_dir=d))
    try:
        return {"mode": mode, "shards": shards, **ridecheck.run(record)}
    finally:
        down(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="ms-sc,ms-ec,aa-sc,aa-ec")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON and the clusters' logs")
    args = ap.parse_args()
    if shutil.which("redis-benchmark") is None:
        print("error: redis-benchmark not found (apt-get install redis-tools)", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="kv_failover_"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for repeat in range(args.repeats):
        for mode in args.modes.split(","):
            try:
                row = one_run(mode, args.shards, out / f"{mode}-{repeat}")
            except RuntimeError as e:  # the cluster did not fail over or the loads stalled: a failed run
                row = {"mode": mode, "shards": args.shards, "failed": str(e)}
            row["passed"] = "failed" not in row and ridecheck.passed(row)
            rows.append(row)
            if "failed" in row:
                print(f"{mode:6} #{repeat}  FAILED: {row['failed']}", file=sys.stderr)
                continue
            clients = "  ".join(f"{c} {row[c]['errors']} err/{row[c]['lost']} lost/{row[c]['acked']} acked "
                                f"(held <= {row[c]['longest_op_s']:.1f} s)" for c in CLIENTS)
            print(f"{mode:6} #{repeat}  new map {row['new_map_s']:.2f} s  redis-benchmark "
                  f"{'ran through' if row['bench_ran_to_end'] and not row['bench_errors'] else 'STOPPED'}  "
                  f"{clients}  load {row['loadavg'][0]:.1f}", file=sys.stderr)
    summary = {c: {"errors": sum(r.get(c, {}).get("errors", 0) for r in rows),
                   "lost": sum(r.get(c, {}).get("lost", 0) for r in rows)} for c in CLIENTS}
    summary["redis_benchmark_stopped"] = sum(not r.get("bench_ran_to_end", False) or bool(r.get("bench_errors"))
                                             for r in rows)
    result = {"runs": rows, "summary": summary, "targets_met": all(r["passed"] for r in rows)}
    (out / "kv_failover.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
