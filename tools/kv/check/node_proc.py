"""`python -m mlsyskit.tools.kv.check.node_proc DATA_DIR NODE_ID`: a node whose replica links
go through the checker's fault proxies.

The record the checker writes (`cluster.json`) adds `routes`: for each node, the address it
dials to reach each other replica of its shard (a FaultProxy). Everything else is the
ordinary node runtime; only `Node.link`'s choice of address differs. The checker uses this
entry point only when the nemesis partitions links; kill, pause and restart runs use the
real `bespokv node` processes. (A `routes` hook in Node itself would retire this module.)
"""
from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from mlsyskit.tools.kv.cluster import node_datalet
from mlsyskit.tools.kv.links import Link
from mlsyskit.tools.kv.node import Node
from mlsyskit.tools.kv.processes import load_record
from mlsyskit.tools.kv.shardmap import ShardMap


class RoutedNode(Node):
    def __init__(self, *args, routes: dict[str, tuple[str, int]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.routes = routes

    def link(self, node_id: str) -> Link:
        if node_id not in self.links and node_id in self.routes:
            host, port = self.routes[node_id]
            self.links[node_id] = Link(host, port)
        return super().link(node_id)


async def serve(data_dir: Path, node_id: str) -> None:
    record = load_record(data_dir)
    smap = ShardMap.from_dict(record["map"])
    routes = {dst: (h, int(p)) for dst, (h, p) in record.get("routes", {}).get(node_id, {}).items()}
    datalet = node_datalet(record["datalet"], node_id, Path(record["data_dir"]))
    node = RoutedNode(smap, node_id, datalet, routes=routes)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await node.stop()


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m mlsyskit.tools.kv.check.node_proc DATA_DIR NODE_ID")
    asyncio.run(serve(Path(argv[0]), argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
