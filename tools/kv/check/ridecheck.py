"""Clients across a kill -9 of a shard's write point (issue 22 item 4): how many errors each kind of
client saw, and whether every write it was told succeeded is there afterwards.

On a running cluster (`bespokv up`, ops/processes.py) four loads run at once:

    redis-benchmark  the C load generator through the proxy, SETs pipelined (-P 16); it exits on
                     the first error reply, so "ran to the end" means no error reached it
    proxy            redis-py's plain client through the proxy, one SET of a new key at a time
    cluster          redis-py's RedisCluster straight to the nodes (CLUSTER SLOTS, -MOVED), unchanged
    smart            bespokv's own FollowingClient (client/mapfollow.py)

Once every load has written, the write point of shard 0 (the chain head, the master, the first
replica of an active-active shard) is killed with SIGKILL; the loads go on until the coordinator's
new map has been served for `after_s`; then every acknowledged key of the three key-recording
loads is read back through the proxy. Errors are counted per load, with the first one kept; the
longest single operation shows how long a client was held; a lost key comes with when it had been
acknowledged, in seconds after the kill (negative: before it).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from mlsyskit.tools.kv.client.call import acall, call
from mlsyskit.tools.kv.client.mapfollow import FollowingClient
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.shardmap import ShardMap


@dataclass
class Load:
    name: str
    acked: list[tuple[str, str, float]] = field(default_factory=list)  # key, value, when acknowledged
    errors: list[str] = field(default_factory=list)
    longest_s: float = 0.0

    def attempt(self, i: int, write: Callable[[str, str], Any]) -> None:
        key, value = f"ride:{self.name}:{i}", f"v{i}"
        start = time.monotonic()
        try:
            write(key, value)
        except Exception as e:  # noqa: BLE001 - every client-visible error is what is counted
            self.errors.append(f"{type(e).__name__}: {e}")
        else:
            self.acked.append((key, value, time.monotonic()))
        self.longest_s = max(self.longest_s, time.monotonic() - start)


def _shard_map(host: str, port: int) -> ShardMap:
    return ShardMap.from_json(call(host, port, "BKV.SHARDMAP", timeout=2.0))


def _sync_writer(load: Load, write: Callable[[str, str], Any], stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        load.attempt(i, write)
        i += 1


def _smart_writer(load: Load, host: str, port: int, stop: threading.Event) -> None:
    async def body() -> None:
        async def fetch() -> ShardMap:
            return ShardMap.from_json(await acall(host, port, b"BKV.SHARDMAP", timeout=2.0))

        client = FollowingClient(await fetch(), fetch)
        i = 0
        try:
            while not stop.is_set():
                key, value = f"ride:{load.name}:{i}", f"v{i}"
                start = time.monotonic()
                try:
                    await client.put(key.encode(), value.encode())
                except Exception as e:  # noqa: BLE001 - counted
                    load.errors.append(f"{type(e).__name__}: {e}")
                else:
                    load.acked.append((key, value, time.monotonic()))
                load.longest_s = max(load.longest_s, time.monotonic() - start)
                i += 1
        finally:
            await client.close()

    asyncio.run(body())


def _benchmark(host: str, port: int, clients: int) -> subprocess.Popen:
    return subprocess.Popen(["redis-benchmark", "-h", host, "-p", str(port), "-t", "set", "-P", "16", "-c",
                             str(clients), "-n", str(10**9), "-r", "100000", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:g} s")
        time.sleep(0.02)


def _missing(client: redis.Redis, acked: list[tuple[str, str, float]], settle_s: float) -> list:
    """The acknowledged writes not readable with their value, asked again for up to `settle_s` (an
    eventual controlet's surviving replicas may still be exchanging what each accepted)."""
    deadline = time.monotonic() + settle_s
    while True:
        got = client.mget([k for k, _, _ in acked]) if acked else []
        acked = [a for a, v in zip(acked, got, strict=True) if v is None or v.decode() != a[1]]
        if not acked or time.monotonic() > deadline:
            return acked
        time.sleep(0.2)


def run(record: dict[str, Any], after_s: float = 2.0, bench_clients: int = 10,
        timeout: float = 40.0, settle_s: float = 5.0) -> dict[str, Any]:
    """Kill shard 0's write point of the recorded cluster under the four loads; the verdict as a dict."""
    host, port = record["proxy"]["host"], record["proxy"]["port"]
    smap = _shard_map(host, port)
    victim = list(controlet_class(smap.controlet).write_targets(smap.shards[0]))[0]
    pid = next(p["pid"] for p in record["processes"] if p["name"] == f"node:{victim}")
    seed = smap.nodes[smap.shards[0][-1]]
    loads = {name: Load(name) for name in ("proxy", "cluster", "smart")}
    stop = threading.Event()
    plain = redis.Redis(host, port)
    rc = RedisCluster(startup_nodes=[ClusterNode(seed.host, seed.port)])
    threads = [threading.Thread(target=_sync_writer, args=(loads["proxy"], plain.set, stop)),
               threading.Thread(target=_sync_writer, args=(loads["cluster"], rc.set, stop)),
               threading.Thread(target=_smart_writer, args=(loads["smart"], host, port, stop))]
    bench = _benchmark(host, port, bench_clients)
    for t in threads:
        t.start()
    out: dict[str, Any] = {"controlet": smap.controlet, "killed": victim, "epoch_before": smap.epoch}
    killed_at = float("inf")
    try:
        _wait(lambda: all(len(x.acked) >= 20 for x in loads.values()), timeout, "no load wrote 20 keys")
        before = {n: len(x.acked) for n, x in loads.items()}
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: _shard_map(host, port).epoch > smap.epoch, timeout, "no new map")
        out["new_map_s"] = round(time.monotonic() - killed_at, 3)
        settled = time.monotonic()
        _wait(lambda: time.monotonic() - settled >= after_s and all(
            len(x.acked) >= before[n] + 20 for n, x in loads.items()), timeout, "the loads did not go on")
        out["bench_ran_to_end"] = bench.poll() is None  # still running: no error reply stopped it
    finally:
        stop.set()
        for t in threads:
            t.join(timeout)
        if bench.poll() is None:
            bench.send_signal(signal.SIGINT)
        try:
            text = bench.communicate(timeout=10)[0] or ""
        except subprocess.TimeoutExpired:
            bench.kill()
            text = bench.communicate()[0] or ""
        rc.close()
    lines = text.replace("\r", "\n").splitlines()
    out["bench_errors"] = [line for line in lines if "rror" in line][:3]
    out["bench_last"] = next((line.strip() for line in reversed(lines) if "rps=" in line or "per second" in line), "")
    for name, load in loads.items():
        lost = _missing(plain, load.acked, settle_s)
        lost = [(k, round(t - killed_at, 3)) for k, _, t in lost]
        out[name] = {"acked": len(load.acked), "errors": len(load.errors), "first_error": load.errors[:1],
                     "lost": len(lost), "lost_acked_s_after_kill": lost[:5], "longest_op_s": round(load.longest_s, 3)}
    plain.close()
    out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def passed(result: dict[str, Any]) -> bool:
    """Zero client-visible errors and nothing lost, for every load."""
    return (result.get("bench_ran_to_end", False) and not result["bench_errors"]
            and all(result[n]["errors"] == 0 and result[n]["lost"] == 0 for n in ("proxy", "cluster", "smart")))
