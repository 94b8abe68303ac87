"""How long a supervised cluster takes to replace a node killed -9 (scripts/bench_kv_faults.py --recovery).

One `bespokv up` cluster (1x3 ms-sc, memory datalet, embedded coordinator, the supervisor, real
processes on loopback) filled with `keys` keys; kill -9 of one node; then, polled every 10 ms on
this process's clock:

  failover_s   the coordinator's map no longer holds the node
  restart_s    the supervisor has recorded a new process for it
  ready_s      that process serves: in the map, caught up (INFO catching_up:0), not deposed, holding
               a lease; then its key count must equal what was written (else the run fails)

All from the kill. The replacement starts empty and copies the shard from a survivor.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from mlsyskit.core import net
from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.ops import processes
from mlsyskit.tools.kv.ops.coordproc import current_map
from mlsyskit.tools.kv.ops.record import load_record
from mlsyskit.tools.kv.shardmap import ShardMap


async def _fill(smap: ShardMap, keys: int, value_size: int) -> None:
    client = SmartClient(smap, timeout=10.0)
    try:
        for start in range(0, keys, 200):
            await asyncio.gather(*(client.put(b"key%08d" % i, b"v" * value_size)
                                   for i in range(start, min(keys, start + 200))))
    finally:
        await client.close()


def _serving(host: str, port: int) -> dict[str, str] | None:
    try:
        info = parse_info(call(host, port, "INFO", timeout=0.5))
    except OSError:
        return None
    lease = info.get("lease_s", "-")
    if info.get("catching_up", "0") != "0" or info.get("deposed") == "1" or lease == "-" or float(lease) <= 0:
        return None
    return info


def replacement_ready(out_dir: Path, victim: str = "s0r0", keys: int = 2000, value_size: int = 1024,
                      seed: int = 0, clock: Clock | None = None, timeout_s: float = 60.0) -> dict[str, Any]:
    clock = clock or RealClock()
    spec = processes.ClusterSpec(replicas=3, base_port=net.free_range(4), data_dir=Path(out_dir))
    processes.up(spec, clock)
    try:
        record = load_record(spec.data_dir)
        smap = ShardMap.from_dict(record["map"])
        asyncio.run(_fill(smap, keys, value_size))
        coord = CoordinatorSpec.from_dict(record["coordinator"])
        old = next(p["pid"] for p in record["processes"] if p["name"] == f"node:{victim}")
        addr = smap.nodes[victim]
        os.kill(old, signal.SIGKILL)
        killed = clock.now()
        seen: dict[str, float] = {}
        deadline = killed + timeout_s
        while "ready_s" not in seen:
            if clock.now() > deadline:
                raise RuntimeFailure(f"{victim} was not replaced within {timeout_s:g} s: {seen}")
            if "failover_s" not in seen:
                try:
                    current = current_map(coord)
                    if current is not None and current.shard_of_node(victim) is None:
                        seen["failover_s"] = clock.now() - killed
                except RuntimeFailure:
                    pass
            elif "restart_s" not in seen:
                pids = {p["name"]: p["pid"] for p in load_record(spec.data_dir)["processes"]}
                if pids.get(f"node:{victim}") not in (None, old):
                    seen["restart_s"] = clock.now() - killed
            elif (info := _serving(addr.host, addr.port)) is not None:
                current = current_map(coord)
                if current is not None and current.shard_of_node(victim) is not None:
                    seen["ready_s"] = clock.now() - killed
                    if int(info.get("keys", -1)) != keys:
                        raise RuntimeFailure(f"the replacement of {victim} holds {info.get('keys')} keys, "
                                             f"{keys} were written")
            clock.sleep(0.01)
    finally:
        processes.down(spec.data_dir, clock)
    return {"victim": victim, "keys": keys, "value_size": value_size,
            **{k: round(v, 3) for k, v in seen.items()}}
