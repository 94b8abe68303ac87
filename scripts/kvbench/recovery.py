"""Recovery figures of a cluster that fails over (scripts/bench_kv_faults.py --recovery).

One 1x3 cluster of real node processes under an embedded coordinator per measurement:

  detection     kill -9 a replica; seconds until the coordinator has committed the map without it
  write outage  clients write without pause through FollowingClients; kill -9 the chain head (the
                master); the longest span without a successful write from the kill on
  read outage   the same with reads, killing the ms-sc tail (the node serving reads)
  catch-up      fill the shard, kill -9 a replica, let it be failed over, start it again: it rejoins
                and copies the state; MB/s = bytes it received / seconds from SNAPBEGIN to SNAPEND,
                as the joining node measured them itself

Each figure is measured on the cluster's own clock; the load generator runs in this process.
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv.check.procs import ProcCluster
from mlsyskit.tools.kv.client.call import acall, parse_info
from mlsyskit.tools.kv.client.mapfollow import FollowingClient
from mlsyskit.tools.kv.client.smart import KVError


async def _cluster(mode: str, out_dir: Path, clock: Clock, heartbeat: float, misses: int) -> ProcCluster:
    cluster = ProcCluster(mode, "memory", 1, 3, out_dir, partitionable=False, clock=clock,
                          coordinator="embedded", heartbeat=heartbeat, misses=misses)
    await cluster.start()
    return cluster


async def _wait_epoch_above(cluster: ProcCluster, epoch: int, clock: Clock, timeout: float = 30.0) -> float:
    deadline = clock.now() + timeout
    while clock.now() < deadline:
        current = await cluster.current_map()
        if current.epoch > epoch:
            return clock.now()
        await clock.asleep(0.01)
    raise RuntimeError(f"no new map within {timeout:g}s")


async def outage(mode: str, victim: str, op: str, out_dir: Path, clock: Clock | None = None,
                 heartbeat: float = 0.5, misses: int = 3, clients: int = 4, after_s: float = 6.0,
                 seed: int = 0) -> dict[str, Any]:
    """Kill `victim` ("head" | "tail") under a load of `op` ("put" | "get"); detection and outage, s."""
    clock = clock or RealClock()
    cluster = await _cluster(mode, out_dir, clock, heartbeat, misses)
    successes: list[float] = []
    stop = asyncio.Event()
    try:
        smap = cluster.map
        for i in range(100):  # reads need something to read
            await acall(smap.nodes[smap.shards[0][0]].host, smap.nodes[smap.shards[0][0]].port, b"SET",
                       b"k%d" % i, b"v")

        async def worker(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            client = FollowingClient(smap, cluster.current_map, seed=rng.randrange(2**32), timeout=1.0)
            try:
                while not stop.is_set():
                    key = b"k%d" % rng.randrange(100)
                    try:
                        if op == "put":
                            await asyncio.wait_for(client.put(key, b"x"), 1.0)
                        else:
                            await asyncio.wait_for(client.get(key), 1.0)
                        successes.append(clock.now())
                    except (KVError, OSError, TimeoutError):
                        await clock.asleep(0.005)
            finally:
                await client.close()
        tasks = [asyncio.get_running_loop().create_task(worker(c)) for c in range(clients)]
        await clock.asleep(1.0)  # steady state first
        node = smap.shards[0][0] if victim == "head" else smap.shards[0][-1]
        epoch = (await cluster.current_map()).epoch
        killed = clock.now()
        await cluster.kill(node)
        committed = await _wait_epoch_above(cluster, epoch, clock)
        await clock.asleep(after_s)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await cluster.stop()
    after = [t for t in successes if t >= killed]
    before = [t for t in successes if t < killed]
    points = ([before[-1]] if before else [killed]) + after
    gaps = [b - a for a, b in zip(points, points[1:], strict=False)]
    return {"mode": mode, "victim": victim, "op": op, "killed_node": node,
            "detection_s": round(committed - killed, 4),
            "outage_s": round(max(gaps, default=after_s), 4),
            "recovered": bool(after) and after[-1] > committed,
            "ops_before": len(before), "ops_after": len(after)}


async def catch_up(mode: str, out_dir: Path, mbytes: int = 32, value_size: int = 4096, clock: Clock | None = None,
                   heartbeat: float = 0.5, misses: int = 3) -> dict[str, Any]:
    """Rejoin of a failed-over replica after the shard was filled with `mbytes` MB: its copy rate."""
    clock = clock or RealClock()
    cluster = await _cluster(mode, out_dir, clock, heartbeat, misses)
    try:
        smap = cluster.map
        head = smap.nodes[smap.shards[0][0]]
        keys = mbytes * 1_000_000 // value_size
        value = b"v" * value_size
        client = FollowingClient(smap, cluster.current_map)
        for start in range(0, keys, 200):  # pipelined batches: the fill is not what is measured
            await asyncio.gather(*(client.put(b"key%08d" % i, value) for i in range(start, min(keys, start + 200))))
        await client.close()
        victim = smap.shards[0][-1]
        epoch = (await cluster.current_map()).epoch
        await cluster.kill(victim)
        await _wait_epoch_above(cluster, epoch, clock)
        started = clock.now()
        await cluster.start_node(victim)  # rejoins (new map), copies, reports caught up
        ready = clock.now()
        addr = cluster.home[victim]
        info = parse_info(await acall(addr.host, addr.port, b"INFO", timeout=2.0))
    finally:
        await cluster.stop()
    copied, seconds = int(info["sync_bytes"]), float(info["last_sync_s"])
    return {"mode": mode, "keys": keys, "value_size": value_size, "copied_keys": int(info["sync_keys"]),
            "copied_mb": round(copied / 1e6, 3), "copy_s": seconds,
            "mb_per_s": round(copied / 1e6 / seconds, 2) if seconds > 0 else None,
            "restart_to_ready_s": round(ready - started, 3), "head": f"{head.host}:{head.port}"}
