"""Clusters of nodes: all in this process (tests, benchmarks, --foreground) on loopback ports.

`bespokv up` runs the same nodes as separate processes (see processes.py); both build a
node's datalet with `node_datalet` so the two shapes are configured identically.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlsyskit.tools.kv.datalets import Datalet, make_datalet
from mlsyskit.tools.kv.node import Node
from mlsyskit.tools.kv.resp import Limits
from mlsyskit.tools.kv.shardmap import ShardMap


def node_datalet(name: str, node_id: str, data_dir: Path | None = None,
                 redis: dict[str, Any] | None = None) -> Datalet:
    """The datalet for one node: lmdb under data_dir/node_id; redis at the given host/port/db."""
    if name == "lmdb":
        if data_dir is None:
            raise ValueError("the lmdb datalet needs a data directory")
        return make_datalet("lmdb", path=Path(data_dir) / node_id / "lmdb")
    if name == "redis":
        return make_datalet("redis", **(redis or {}))
    return make_datalet(name)


class LocalCluster:
    """Every node of a shard map in the current event loop, each on its own socket."""

    def __init__(self, shard_map: ShardMap, datalet_factory: Callable[[str], Datalet],
                 limits: Limits | None = None) -> None:
        self.map = shard_map
        self.nodes = {n: Node(shard_map, n, datalet_factory(n), limits)
                      for reps in shard_map.shards for n in reps}

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
