"""Clusters of nodes: all in this process (tests, benchmarks, --foreground) on loopback ports.

`bespokv up` runs the same nodes as separate processes (see processes.py); both build a
node's datalet with `node_datalet` so the two shapes are configured identically, and both wait
for a node with the launcher's readiness wait (launcher.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.datalets import Datalet, make_datalet
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.ops import launcher
from mlsyskit.tools.kv.peerauth import new_secret
from mlsyskit.tools.kv.redis.resp import Limits
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
    """Every node of a shard map in the current event loop, each on its own socket.

    The nodes share a fresh cluster secret (peer authentication). A new cluster starts with
    every replica ready (they are all empty, or all hold the same files); `restart` brings
    one node back as a new process would: empty or from its files, catching up first.
    """

    def __init__(self, shard_map: ShardMap, datalet_factory: Callable[[str], Datalet],
                 limits: Limits | None = None, options: ControletOptions | None = None,
                 secret: bytes | None = None, requirepass: bytes | None = None) -> None:
        self.map = shard_map
        self.factory = datalet_factory
        self.limits, self.options = limits, options
        self.secret = secret or new_secret()
        self.requirepass = requirepass
        self.nodes = {n: self._make(n) for reps in shard_map.shards for n in reps}

    def _make(self, node_id: str) -> Node:
        return Node(self.map, node_id, self.factory(node_id), self.limits, secret=self.secret,
                    options=self.options, requirepass=self.requirepass)

    async def start(self) -> None:
        for node in self.nodes.values():
            await start_node(node, catch_up=False)

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()

    async def kill(self, node_id: str) -> None:
        """Stop one node abruptly: its sockets close and its in-memory state is gone."""
        await self.nodes[node_id].stop()

    async def restart(self, node_id: str, timeout: float = 10.0) -> Node:
        """Start `node_id` again with a fresh datalet object; returns once it has caught up."""
        node = self.nodes[node_id] = self._make(node_id)
        await start_node(node, catch_up=True)
        await self.wait_ready(node_id, timeout=timeout)
        return node

    async def wait_ready(self, node_id: str, timeout: float = 10.0) -> None:
        """Until the node answers and has caught up: the launcher's readiness wait, over its socket."""
        addr = self.map.nodes[node_id]
        await asyncio.to_thread(launcher.wait_ready, [(node_id, addr.host, addr.port)], timeout=timeout,
                                password=self.requirepass, error=TimeoutError, logs="this process")

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
