"""Start a node's RESP listener: the one place that joins the node runtime and the front end."""
from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

from mlsyskit.tools.kv.frontend import expiry
from mlsyskit.tools.kv.frontend.connection import ClientConnection
from mlsyskit.tools.kv.node.runtime import Node

# The hot path allocates a few container objects per request (its Request, tuples, lists), so the
# collector's default first-generation threshold (700) ran a collection every ~40 pipelined requests
# and, through the older generations, rescanned every long-lived object of the process: 15-20% of a
# chain node's CPU per write (measured, issue 22). A node keeps few reference cycles; a higher
# threshold collects them as surely, less often.
GC_THRESHOLD = (20_000, 20, 20)


async def start_node(node: Node, host: str | None = None, port: int | None = None,
                     catch_up: bool = True, unix_ms: Callable[[], int] = expiry.wall_ms) -> None:
    """Open the node (catching up from a live replica unless `catch_up` is False) and listen.

    catch_up=False is for a brand-new cluster whose replicas all start empty together.
    `unix_ms` is the wall clock that key deadlines are compared with (expiry.py).
    """
    gc.set_threshold(*GC_THRESHOLD)
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
