"""Streaming a replica's whole datalet to a catching-up replica (the Snapshot action).

SNAPBEGIN token seq, then SNAPDATA token k v k v ... (SNAPSHOT_BATCH pairs each), then
SNAPEND token seq, all on the same FIFO link as every later Send (controlets/stream.py
explains why a remote datalet's non-atomic export is still exact).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from mlsyskit.tools.kv.controlets.base import Snapshot

if TYPE_CHECKING:
    from mlsyskit.tools.kv.node import Node

SNAPSHOT_BATCH = 256  # pairs per SNAPDATA message


def stream_snapshot(node: Node, a: Snapshot) -> None:
    link = node.link(a.node)
    link.send(node.frame(b"SNAPBEGIN", (a.token, a.seq)))

    async def stream() -> None:
        batch: list[bytes] = []
        async for key, value in node.datalet.export_pairs():
            batch += (key, value)
            if len(batch) >= 2 * SNAPSHOT_BATCH:
                link.send(node.frame(b"SNAPDATA", (a.token, *batch)))
                batch = []
        if batch:
            link.send(node.frame(b"SNAPDATA", (a.token, *batch)))
        link.send(node.frame(b"SNAPEND", (a.token, a.seq)))

    coro = stream()
    if node.sync_datalet:  # a local datalet's export never awaits: run it to the end right here
        try:
            coro.send(None)
        except StopIteration:
            return
        raise RuntimeError("a synchronous datalet's export awaited")
    task = asyncio.get_running_loop().create_task(coro)
    node.tasks.add(task)
    task.add_done_callback(node.tasks.discard)
