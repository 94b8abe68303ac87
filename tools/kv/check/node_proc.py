"""`python -m mlsyskit.tools.kv.check.node_proc DATA_DIR NODE_ID`: a node whose replica links
go through the checker's fault proxies.

The record the checker writes (`cluster.json`) adds `routes`: for each node, the address it
dials to reach each other replica of its shard (a FaultProxy). The node is started by the
ordinary `processes.serve_node`, so it is configured exactly as `bespokv node` configures it
(secret, catch-up, options); the only difference is the Node class, whose links dial the
routed address. Stopgap until Node takes the routes itself (requested from the node's owner):
then the checker runs `bespokv node` for partitions too and this module goes.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

from mlsyskit.tools.kv import processes
from mlsyskit.tools.kv.links import Link
from mlsyskit.tools.kv.node import Node


class RoutedNode(Node):
    routes: ClassVar[dict[str, tuple[str, int]]] = {}  # set once per process, before the node starts

    def link(self, node_id: str) -> Link:
        fresh = node_id not in self.links
        link = super().link(node_id)
        if fresh and node_id in self.routes:  # links connect lazily: re-aim before the first send
            link.host, link.port = self.routes[node_id]
        return link


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m mlsyskit.tools.kv.check.node_proc DATA_DIR NODE_ID")
    data_dir, node_id = Path(argv[0]), argv[1]
    record = processes.load_record(data_dir)
    RoutedNode.routes = {dst: (h, int(p)) for dst, (h, p) in record.get("routes", {}).get(node_id, {}).items()}
    processes.Node = RoutedNode  # serve_node builds the node with this class
    processes.serve_node(data_dir, node_id)


if __name__ == "__main__":
    main(sys.argv[1:])
