"""What a replacement's join costs the chain: copy-then-join against join-then-copy (issue 15).

One 1x3 ms-sc cluster of real node processes under the embedded coordinator per measurement:
fill the shard, keep `clients` writers writing, kill -9 the tail, wait for its failover, start it
again (in the old order with BESPOKV_JOIN_FIRST=1 in its environment) and wait until it serves.

  write stall     the longest span without an acknowledged write from the restart until the node
                  serves plus `after_s` (a write is acknowledged only once the whole chain, the new
                  tail included, has it)
  after join      bytes the node copied after it joined (copy-then-join: the log tail; join-first:
                  the whole snapshot), from its own INFO counters
  join catch-up   the node's own seconds from its join to serving (INFO join_catch_up_s; join-first:
                  its snapshot's SNAPBEGIN..SNAPEND, the part of the wait it measured itself)
"""
from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv.check.procs import ProcCluster
from mlsyskit.tools.kv.client.call import acall, parse_info
from mlsyskit.tools.kv.client.mapfollow import FollowingClient
from mlsyskit.tools.kv.client.smart import KVError

JOIN_FIRST_ENV = "BESPOKV_JOIN_FIRST"


async def _serving(cluster: ProcCluster, node: str, clock: Clock, timeout: float = 120.0) -> dict[str, str]:
    addr, deadline = cluster.home[node], clock.now() + timeout
    while clock.now() < deadline:
        if not cluster.alive(node):
            raise RuntimeError(f"{node} exited; see {cluster.data_dir}/logs/node-{node}.log")
        try:
            info = parse_info(await acall(addr.host, addr.port, b"INFO", timeout=1.0))
            if info.get("catching_up") == "0" and info.get("role") == "tail":
                return info
        except (OSError, TimeoutError):
            pass
        await clock.asleep(0.01)
    raise RuntimeError(f"{node} did not serve within {timeout:g}s")


def _spawn(cluster: ProcCluster, node: str, join_first: bool) -> None:
    before = os.environ.get(JOIN_FIRST_ENV)
    os.environ[JOIN_FIRST_ENV] = "1" if join_first else "0"
    try:
        cluster._spawn(node)  # the child inherits the order to follow
    finally:
        if before is None:
            os.environ.pop(JOIN_FIRST_ENV, None)
        else:
            os.environ[JOIN_FIRST_ENV] = before


async def join_stall(out_dir: Path, join_first: bool, mbytes: int = 32, value_size: int = 4096,
                     clients: int = 4, heartbeat: float = 0.5, misses: int = 3, after_s: float = 1.0,
                     seed: int = 0, clock: Clock | None = None) -> dict[str, Any]:
    clock = clock or RealClock()
    cluster = ProcCluster("ms-sc", "memory", 1, 3, out_dir, partitionable=False, clock=clock,
                          coordinator="embedded", heartbeat=heartbeat, misses=misses)
    await cluster.start()
    successes: list[float] = []
    stop = asyncio.Event()
    try:
        smap = cluster.map
        filler = FollowingClient(smap, cluster.current_map)
        keys, value = mbytes * 1_000_000 // value_size, b"v" * value_size
        for start in range(0, keys, 200):
            await asyncio.gather(*(filler.put(b"key%08d" % i, value) for i in range(start, min(keys, start + 200))))
        await filler.close()

        async def writer(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            client = FollowingClient(smap, cluster.current_map, seed=rng.randrange(2**32), timeout=1.0)
            try:
                while not stop.is_set():
                    try:
                        await asyncio.wait_for(client.put(b"w%d" % rng.randrange(100), b"x"), 3.0)
                        successes.append(clock.now())
                    except (KVError, OSError, TimeoutError):
                        await clock.asleep(0.005)
            finally:
                await client.close()
        tasks = [asyncio.get_running_loop().create_task(writer(c)) for c in range(clients)]
        victim = smap.shards[0][-1]
        epoch = (await cluster.current_map()).epoch
        await cluster.kill(victim)
        while (await cluster.current_map()).epoch == epoch:
            await clock.asleep(0.01)
        await clock.asleep(1.0)  # writes flow again on the two survivors
        restarted = clock.now()
        _spawn(cluster, victim, join_first)
        info = await _serving(cluster, victim, clock)
        serving = clock.now()
        await clock.asleep(after_s)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        await cluster.stop()
    points = [t for t in successes if t >= restarted]
    before = [t for t in successes if t < restarted]
    points = ([before[-1]] if before else [restarted]) + points
    gaps = [b - a for a, b in zip(points, points[1:], strict=False)]
    after_join = int(info["copied_bytes"]) - int(info.get("learner_bytes", 0))
    return {"order": "join-first" if join_first else "copy-then-join", "mbytes": mbytes,
            "write_stall_s": round(max(gaps, default=0.0), 4),
            "copied_after_join_bytes": after_join, "snapshot_bytes": int(info["sync_bytes"]),
            "tail_bytes": int(info["tail_bytes"]), "tails": int(info["tails"]),
            "snapshots": int(info["snapshots"]),
            "join_catch_up_s": float(info["join_catch_up_s"]) if not join_first else float(info["last_sync_s"]),
            "learner_copy_s": float(info["learner_copy_s"]),
            "restart_to_serving_s": round(serving - restarted, 3)}
