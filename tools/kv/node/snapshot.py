"""Streaming a replica's whole datalet to a catching-up replica (the Snapshot action).

SNAPBEGIN token seq, then SNAPDATA token k v k v ... (at most CHUNK_BYTES of keys and values
each, controlets/streamparts.py; a larger value as SNAPPART token key piece messages of CHUNK_BYTES
and a SNAPDATA with its last piece), then SNAPEND token seq, all on the same FIFO link as every
later Send (controlets/stream.py: every stream message sent after SNAPBEGIN is replayed by the
receiver after SNAPEND; a local datalet's export is its state at SNAPBEGIN, Datalet.export_now,
so a delta is never applied twice; a remote one has only whole-key writes). So the export
yields to the event loop after each chunk, a local datalet's too: a large shard's copy no longer
blocks the source's heartbeats (a 64 MB copy made it miss enough of them to be failed over).
A source that empties its own datalet meanwhile (it began a catch-up) stops without SNAPEND, so a
half-old, half-empty export is never completed; the receiver's deadline makes it ask again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Protocol

from mlsyskit.tools.kv.controlets.base import Snapshot
from mlsyskit.tools.kv.controlets.streamparts import CHUNK_BYTES
from mlsyskit.tools.kv.datalets.base import Datalet


class SnapshotSource(Protocol):
    """What streaming needs of its host (node/interpreter.py's Interpreter is one)."""

    datalet: Datalet
    resets: int  # bumped when the datalet is emptied

    def send_message(self, node: str, kind: bytes, fields: tuple) -> None: ...

    def spawn(self, work: Coroutine) -> None: ...


def stream_snapshot(source: SnapshotSource, a: Snapshot, chunk_bytes: int = CHUNK_BYTES) -> None:
    """SNAPBEGIN now (in order with the Sends around it), then the export as a task the host runs."""
    source.send_message(a.node, b"SNAPBEGIN", (a.token, a.seq))
    resets = source.resets
    exported = source.datalet.export_now()  # a local datalet's view as of SNAPBEGIN (base.export_now)

    async def stream() -> None:
        batch: list[bytes] = []
        size = 0
        async for key, value in exported:
            if batch and size + len(key) + len(value) > chunk_bytes:
                if source.resets != resets:
                    return  # this replica emptied its datalet meanwhile: no SNAPEND, the receiver asks again
                source.send_message(a.node, b"SNAPDATA", (a.token, *batch))
                batch, size = [], 0
                await asyncio.sleep(0)  # heartbeats and clients between chunks
            if len(value) > chunk_bytes:  # too large for one message: all but its last piece as parts
                view = memoryview(value)
                for at in range(0, len(value) - chunk_bytes, chunk_bytes):
                    if source.resets != resets:
                        return
                    source.send_message(a.node, b"SNAPPART", (a.token, key, bytes(view[at:at + chunk_bytes])))
                    await asyncio.sleep(0)
                value = bytes(view[at + chunk_bytes:])
            batch += (key, value)
            size += len(key) + len(value)
        if source.resets != resets:
            return
        if batch:
            source.send_message(a.node, b"SNAPDATA", (a.token, *batch))
        source.send_message(a.node, b"SNAPEND", (a.token, a.seq))

    source.spawn(stream())
