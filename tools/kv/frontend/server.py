"""Start a node's RESP listener: the one place that joins the node runtime and the front end."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from mlsyskit.tools.kv.frontend import expiry
from mlsyskit.tools.kv.frontend.connection import ClientConnection
from mlsyskit.tools.kv.node.runtime import Node


async def start_node(node: Node, host: str | None = None, port: int | None = None,
                     catch_up: bool = True, unix_ms: Callable[[], int] = expiry.wall_ms) -> None:
    """Open the node (catching up from a live replica unless `catch_up` is False) and listen.

    catch_up=False is for a brand-new cluster whose replicas all start empty together.
    `unix_ms` is the wall clock that key deadlines are compared with (expiry.py).
    """
    await node.open()
    if host is None or port is None:
        addr = node.map.nodes[node.node_id]
        host, port = addr.host, addr.port
    loop = asyncio.get_running_loop()
    sweep = expiry.start(node, unix_ms)
    node.server = await loop.create_server(lambda: ClientConnection(node, sweep), host, port,
                                           reuse_address=True, backlog=1024)
    if catch_up:
        node.catch_up()
