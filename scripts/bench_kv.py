#!/usr/bin/env python
"""bespokv benchmark against Redis 7 (Debian's redis-server), same client tool and settings.

Part 1 (redis-benchmark, 50 connections, 32-byte values, 100k-key space, SET+GET, pipeline
1 and 16): one bespokv node (1 shard x 1 replica, memory datalet) versus one redis-server.
Part 2 (the YCSB generator of `bespokv bench`, 100k keys, zipf 0.99, 32-byte values, the
same generator process and settings for both): 3 replicas, ms-sc versus a Redis primary
with 2 replicas and `WAIT 2 0` after every write, reads at the primary; ms-ec versus Redis asynchronous
replication (reads spread over primary and replicas, as ms-ec's smart client does); and
aa-sc, aa-ec beside them for the paper's ratios.

Each server's CPU time (psutil, user+system of the server processes) is divided by the
operations it served, so the CPU cost per operation is reported beside QPS: the load
generator shares this machine's cores, so QPS alone understates a fast server.

Targets (issue 6), each a measured ratio recorded with `met` in the JSON:
- part 1, pipeline 16: bespokv QPS >= 0.7x Redis and server CPU per op <= 2x Redis;
- part 2: ms-sc >= 0.6x Redis+WAIT on YCSB-A and >= 0.9x on YCSB-B; ms-ec >= 0.8x Redis async;
- reported, not targets: aa-sc/ms-sc and aa-ec/ms-ec beside the paper's 1/3.2 and 1.47.

    .venv/bin/python scripts/bench_kv.py --out runs/bench_kv.json
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import uvloop

from mlsyskit.core.clock import RealClock
from mlsyskit.core.console import emit_table, log, make_table
from mlsyskit.tools.kv.client import ycsb
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.ops import processes
from mlsyskit.tools.kv.ops.processes import ClusterSpec
from mlsyskit.tools.kv.shardmap import ShardMap

CLOCK = RealClock()
PAPER = {"aa-sc/ms-sc": 1 / 3.2, "aa-ec/ms-ec": 1.47}


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


class Pinning:
    """Servers on one set of cores, the load generator (this process, redis-benchmark) on another,
    the same for Redis and bespokv: the generator's own CPU use then cannot starve whichever server
    it happens to share a core with. Children inherit the mask of the process that starts them."""

    def __init__(self, enabled: bool) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.enabled = enabled and len(cpus) >= 2
        self.generator = set(cpus[:1]) if self.enabled else set(cpus)
        self.servers = set(cpus[1:]) if self.enabled else set(cpus)
        if self.enabled:
            os.sched_setaffinity(0, self.generator)

    @contextlib.contextmanager
    def servers_start(self):
        """Processes started inside run on the server cores."""
        os.sched_setaffinity(0, self.servers)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.generator)

    def describe(self) -> dict:
        return {"enabled": self.enabled, "generator_cpus": sorted(self.generator), "server_cpus": sorted(self.servers)}


def free_base(width: int, start: int) -> int:
    base = start
    while not all(processes.port_free("127.0.0.1", base + i) for i in range(width)):
        base += width + 7
    return base


class RedisGroup:
    """A redis-server primary with `replicas` replicas on loopback (persistence off, as bespokv's memory)."""

    def __init__(self, base: int, replicas: int, workdir: Path) -> None:
        self.ports = [base + i for i in range(1 + replicas)]
        self.procs: list[subprocess.Popen] = []
        self.workdir = workdir

    def __enter__(self) -> RedisGroup:
        try:
            return self._start()
        except BaseException:  # __exit__ does not run when __enter__ raises: stop what was started
            self.__exit__()
            raise

    def _start(self) -> RedisGroup:
        for i, port in enumerate(self.ports):
            d = self.workdir / f"redis-{port}"
            d.mkdir(parents=True, exist_ok=True)
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(d)]
            if i:
                argv += ["--replicaof", "127.0.0.1", str(self.ports[0])]
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               start_new_session=True))
        deadline = CLOCK.now() + 30
        while True:
            try:
                info = parse_info(call("127.0.0.1", self.ports[0], "INFO", "replication"))
                online = sum("state=online" in v for k, v in info.items() if k.startswith("slave"))
                if online == len(self.ports) - 1:
                    break
            except OSError:
                pass
            if CLOCK.now() > deadline:
                raise RuntimeError("redis replicas did not come online within 30 s")
            CLOCK.sleep(0.05)
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class BespokvCluster:
    def __init__(self, controlet: str, replicas: int, base: int, workdir: Path) -> None:
        self.spec = ClusterSpec(shards=1, replicas=replicas, controlet=controlet, datalet="memory", base_port=base,
                                data_dir=workdir / f"bespokv-{controlet}-{replicas}")

    def __enter__(self) -> BespokvCluster:
        self.record = processes.up(self.spec)
        self.map = ShardMap.from_dict(self.record["map"])
        return self

    @property
    def node_pids(self) -> list[int]:
        return [p["pid"] for p in self.record["processes"] if p["name"].startswith("node:")]

    @property
    def node_port(self) -> int:
        return self.map.nodes[self.map.shards[0][0]].port

    def __exit__(self, *exc) -> None:
        processes.down(self.spec.data_dir)


def redis_benchmark(port: int, pipeline: int, requests: int, pids: list[int]) -> dict:
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-P", str(pipeline), "-d", "32",
            "-r", "100000", "-n", str(requests), "-t", "set,get", "--csv"]
    before = cpu_seconds(pids)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    cpu = cpu_seconds(pids) - before
    rows = {r["test"]: r for r in csv.DictReader(io.StringIO(out))}
    qps = {t: float(rows[t]["rps"]) for t in ("SET", "GET")}
    return {"set_qps": qps["SET"], "get_qps": qps["GET"], "qps": statistics.mean(qps.values()),
            "p50_ms": statistics.mean(float(rows[t]["p50_latency_ms"]) for t in ("SET", "GET")),
            "p99_ms": statistics.mean(float(rows[t]["p99_latency_ms"]) for t in ("SET", "GET")),
            "cpu_us_per_op": cpu * 1e6 / (2 * requests)}


def part1(args, workdir: Path) -> dict:
    results: dict = {}
    base = free_base(8, args.base_port)
    with contextlib.ExitStack() as stack:
        with args.pinning.servers_start():
            redis = stack.enter_context(RedisGroup(base, 0, workdir))
            ours = stack.enter_context(BespokvCluster("ms-sc", 1, base + 2, workdir))
        for pipeline in (1, 16):
            n = args.requests * (4 if pipeline == 16 else 1)
            runs = {"redis": [], "bespokv": []}
            for _ in range(args.repeats):  # alternate, so both see the same background load
                runs["redis"].append(redis_benchmark(redis.ports[0], pipeline, n, redis.pids))
                runs["bespokv"].append(redis_benchmark(ours.node_port, pipeline, n, ours.node_pids))
            med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
            med["runs"] = runs  # every run, in order (paired: run i of both saw the same moment's load)
            med["qps_ratio"] = spread([a["qps"] / b["qps"] for a, b in zip(runs["bespokv"], runs["redis"], strict=True)])
            med["cpu_ratio"] = spread([safe_ratio(a["cpu_us_per_op"], b["cpu_us_per_op"])
                                       for a, b in zip(runs["bespokv"], runs["redis"], strict=True)])
            med["requests_per_test"] = n
            results[f"pipeline_{pipeline}"] = med
            log(f"pipeline {pipeline}: bespokv/redis QPS {med['qps_ratio']['median']:.2f}x, "
                f"CPU/op {med['cpu_ratio']['median']:.2f}x")
    p16 = results["pipeline_16"]
    results["targets"] = {
        "qps_p16_ratio>=0.7": target(p16["qps_ratio"], 0.7, higher=True),
        "cpu_per_op_p16_ratio<=2": target(p16["cpu_ratio"], 2.0, higher=False),
    }
    return results


def spread(values: list[float]) -> dict:
    """The median of paired per-round ratios (the measured figure) with its min and max and every value."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def target(ratio: dict, threshold: float, higher: bool) -> dict:
    m = ratio["median"]
    return {"measured": m, "min": ratio["min"], "max": ratio["max"], "rounds": ratio["rounds"],
            "threshold": threshold, "met": m >= threshold if higher else m <= threshold}


def ycsb_run(name: str, make_target, pids: list[int], args, load: bool) -> dict:
    w = ycsb.Workload(name=name, keys=args.keys, ops=args.ops, zipf=0.99, value_size=32, clients=args.clients,
                      seed=7, load=load, window=args.window)
    before, client_before = cpu_seconds(pids), cpu_seconds([os.getpid()])
    r = uvloop.run(ycsb.run_workload(w, make_target))
    ops = w.ops + (w.keys if load else 0)
    r["server_cpu_us_per_op"] = (cpu_seconds(pids) - before) * 1e6 / ops
    r["client_cpu_us_per_op"] = (cpu_seconds([os.getpid()]) - client_before) * 1e6 / ops
    return r


def part2(args, workdir: Path) -> dict:
    """All systems up at once; each is loaded once, then the workloads run in alternating rounds
    (every system once per round) so background load on the shared machine hits all of them alike."""
    workloads = ["ycsb-a", "ycsb-b"]
    systems = ["redis-wait2", "ms-sc", "redis-async", "ms-ec", "aa-sc", "aa-ec"]
    runs: dict = {s: {w: [] for w in workloads} for s in systems}
    base = free_base(16, args.base_port + 40)
    with contextlib.ExitStack() as stack:
        with args.pinning.servers_start():
            redis = stack.enter_context(RedisGroup(base, 2, workdir))
        targets: dict = {}
        endpoints = [("127.0.0.1", p) for p in redis.ports]
        # Strong peer: WAIT 2 0 after every write, reads at the primary (as ms-sc reads at its tail).
        # Eventual peer: asynchronous replication, reads spread over all three (as ms-ec's).
        targets["redis-wait2"] = (ycsb.redis_target_factory(endpoints, 2, spread_reads=False), redis.pids)
        targets["redis-async"] = (ycsb.redis_target_factory(endpoints, 0, spread_reads=True), redis.pids)
        next_base = base + 20
        for controlet in ("ms-sc", "ms-ec", "aa-sc", "aa-ec"):
            next_base = free_base(8, next_base)
            with args.pinning.servers_start():
                cluster = stack.enter_context(BespokvCluster(controlet, 3, next_base, workdir))
            next_base += 8

            async def make(seed: int, smap=cluster.map):
                return await ycsb.bespokv_target(smap, seed)
            targets[controlet] = (make, cluster.node_pids)
        loaded: set = set()
        for round_ in range(args.rounds):
            for system in systems:
                make, pids = targets[system]
                group = "redis" if system.startswith("redis") else system  # the two Redis modes share data
                for w in workloads:
                    runs[system][w].append(ycsb_run(w, make, pids, args, load=group not in loaded))
                    loaded.add(group)
            log(f"part 2: round {round_ + 1}/{args.rounds} done")
    results: dict = {s: {w: median_run(runs[s][w]) for w in workloads} for s in systems}

    def ratio(a: str, b: str, w: str, metric: str = "ops_per_s") -> dict:
        """Paired per-round ratios (round i of both ran back to back)."""
        return spread([safe_ratio(x[metric], y[metric]) for x, y in zip(runs[a][w], runs[b][w], strict=True)])

    results["targets"] = {
        "ms-sc/redis-wait2 ycsb-a>=0.6": target(ratio("ms-sc", "redis-wait2", "ycsb-a"), 0.6, higher=True),
        "ms-sc/redis-wait2 ycsb-b>=0.9": target(ratio("ms-sc", "redis-wait2", "ycsb-b"), 0.9, higher=True),
        "ms-ec/redis-async ycsb-a>=0.8": target(ratio("ms-ec", "redis-async", "ycsb-a"), 0.8, higher=True),
        "ms-ec/redis-async ycsb-b>=0.8": target(ratio("ms-ec", "redis-async", "ycsb-b"), 0.8, higher=True),
    }
    results["paper_ratios"] = {
        f"{pair} {w}": ratio(*pair.split("/"), w) | {"paper": PAPER[pair]} for pair in PAPER for w in workloads}
    results["rounds"] = {s: {w: runs[s][w] for w in workloads} for s in systems}  # every run, in order
    # Server CPU per op depends less on how busy the shared machine was: the capacity signal.
    results["cpu_per_op_ratios"] = {
        f"{a}/{b} {w}": ratio(a, b, w, "server_cpu_us_per_op")
        for a, b in (("ms-sc", "redis-wait2"), ("ms-ec", "redis-async"), ("aa-sc", "ms-sc"), ("aa-ec", "ms-ec"))
        for w in workloads}
    return results


def safe_ratio(a: float, b: float) -> float:
    """a / b; inf when b measured 0 (CPU time below psutil's tick on a tiny run)."""
    return a / b if b > 0 else float("inf")


def median_run(rs: list[dict]) -> dict:
    """The run with the median throughput (its latencies and CPU belong to the same run)."""
    return sorted(rs, key=lambda r: r["ops_per_s"])[len(rs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_kv.json"),
                    help="the JSON report (a file, or an existing folder for bench_kv.json in it)")
    ap.add_argument("--requests", type=int, default=100_000, help="redis-benchmark requests per test at pipeline 1 "
                                                                  "(x4 at pipeline 16)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating repetitions per part-1 setting (median)")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=30_000, help="YCSB operations per workload run")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of part 2 (median run reported)")
    ap.add_argument("--base-port", type=int, default=23_000)
    ap.add_argument("--window", type=int, default=1, help="YCSB operations each client keeps outstanding")
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers and generator to separate cores")
    ap.add_argument("--skip-part2", action="store_true")
    args = ap.parse_args()
    if args.out.is_dir():  # a folder: the report gets its fixed name inside (checked before the long run)
        args.out = args.out / "bench_kv.json"
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y redis-server redis-tools")
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as tmp:
        workdir = Path(tmp)
        settings = vars(args) | {"out": str(args.out)}
        args.pinning = Pinning(not args.no_pin)
        report: dict = {"settings": settings | {"pinning": args.pinning.describe()},
                        "machine": {"cpus": psutil.cpu_count(), "loadavg_start": os.getloadavg(), "redis": subprocess.run(
                            ["redis-server", "--version"], capture_output=True, text=True).stdout.strip()}}
        report["part1"] = part1(args, workdir)
        if not args.skip_part2:
            report["part2"] = part2(args, workdir)
    report["machine"]["loadavg_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True))
    show(report)
    log(f"wrote {args.out}")


def show(report: dict) -> None:
    p1 = report["part1"]
    rows = []
    for key in ("pipeline_1", "pipeline_16"):
        for who in ("redis", "bespokv"):
            r = p1[key][who]
            rows.append([f"{key.replace('_', ' ')} {who}", r["qps"], r["p50_ms"], r["p99_ms"], r["cpu_us_per_op"]])
    emit_table(make_table("part 1: 1 shard x 1 replica, memory (redis-benchmark -c 50 -d 32 -r 100000, SET+GET)",
                          ["setting", "QPS", "p50 ms", "p99 ms", "server CPU us/op"], rows))
    if "part2" in report:
        p2 = report["part2"]
        rows = [[f"{who} {w}", p2[who][w]["ops_per_s"], p2[who][w]["p50_ms"], p2[who][w]["p99_ms"],
                 p2[who][w]["p999_ms"], p2[who][w]["server_cpu_us_per_op"], p2[who][w]["client_cpu_us_per_op"]]
                for who in ("redis-wait2", "ms-sc", "redis-async", "ms-ec", "aa-sc", "aa-ec")
                for w in ("ycsb-a", "ycsb-b")]
        emit_table(make_table("part 2: 3 replicas, YCSB (100k keys, zipf 0.99, 32 B values)",
                              ["system workload", "ops/s", "p50 ms", "p99 ms", "p999 ms", "server CPU us/op",
                               "generator CPU us/op"], rows))
        emit_table(make_table("paper ratios (reported; median of paired rounds)", ["ratio", "median", "min", "max",
                                                                                   "paper"],
                              [[k, v["median"], v["min"], v["max"], v["paper"]] for k, v in p2["paper_ratios"].items()]))
        emit_table(make_table("server CPU per op, ours / peer (lower is better)", ["pair", "median", "min", "max"],
                              [[k, v["median"], v["min"], v["max"]] for k, v in p2["cpu_per_op_ratios"].items()]))
    targets = {**p1["targets"], **report.get("part2", {}).get("targets", {})}
    emit_table(make_table("targets (median of paired per-round ratios)", ["target", "median", "min", "max",
                                                                          "threshold", "met"],
                          [[k, v["measured"], v["min"], v["max"], v["threshold"], "yes" if v["met"] else "NO"]
                           for k, v in targets.items()]))


if __name__ == "__main__":
    main()
