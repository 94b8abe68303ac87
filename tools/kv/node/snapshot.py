"""Streaming a replica's whole datalet to a catching-up replica (the Snapshot action).

SNAPBEGIN token seq, then SNAPDATA token k v k v ... (SNAPSHOT_BATCH pairs each), then
SNAPEND token seq, all on the same FIFO link as every later Send (controlets/stream.py
explains why a non-atomic export is still exact: every stream message sent after SNAPBEGIN is
replayed by the receiver after SNAPEND, and every write overwrites a whole key). So the export
yields to the event loop after each batch, a local datalet's too: a large shard's copy no longer
blocks the source's heartbeats (a 64 MB copy made it miss enough of them to be failed over).
A source that empties its own datalet meanwhile (it began a catch-up) stops without SNAPEND, so a
half-old, half-empty export is never completed; the receiver's deadline makes it ask again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Protocol

from mlsyskit.tools.kv.controlets.base import Snapshot
from mlsyskit.tools.kv.datalets.base import Datalet

SNAPSHOT_BATCH = 256  # pairs per SNAPDATA message


class SnapshotSource(Protocol):
    """What streaming needs of its host (node/interpreter.py's Interpreter is one)."""

    datalet: Datalet
    resets: int  # bumped when the datalet is emptied

    def send_message(self, node: str, kind: bytes, fields: tuple) -> None: ...

    def spawn(self, work: Coroutine) -> None: ...


def stream_snapshot(source: SnapshotSource, a: Snapshot) -> None:
    """SNAPBEGIN now (in order with the Sends around it), then the export as a task the host runs."""
    source.send_message(a.node, b"SNAPBEGIN", (a.token, a.seq))
    resets = source.resets

    async def stream() -> None:
        batch: list[bytes] = []
        async for key, value in source.datalet.export_pairs():
            batch += (key, value)
            if len(batch) >= 2 * SNAPSHOT_BATCH:
                if source.resets != resets:
                    return  # this replica emptied its datalet meanwhile: no SNAPEND, the receiver asks again
                source.send_message(a.node, b"SNAPDATA", (a.token, *batch))
                batch = []
                await asyncio.sleep(0)  # heartbeats and clients between batches
        if source.resets != resets:
            return
        if batch:
            source.send_message(a.node, b"SNAPDATA", (a.token, *batch))
        source.send_message(a.node, b"SNAPEND", (a.token, a.seq))

    source.spawn(stream())
