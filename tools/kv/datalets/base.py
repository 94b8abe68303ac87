"""The datalet API: the data plane is any single-server KV store that can get, put and delete.

A datalet is deliberately dumb: no replication, no ordering, no versions. Controlets add
those. Beyond get/put/del it offers export/import (a stream of pairs, used to bring a
replica back up to date) and, where the store is ordered, a range scan.

Local datalets (memory, lmdb) answer synchronously; a remote one (redis) returns futures
that complete in issue order. The node runtime handles both without blocking.
"""
from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from typing import Any, ClassVar


class ScanUnsupported(RuntimeError):
    """This datalet keeps no key order."""


class Datalet(ABC):
    name: ClassVar[str]
    is_async: ClassVar[bool] = False  # True: get/put/delete/exists return asyncio futures
    ordered: ClassVar[bool] = False  # True: scan() is supported

    # Set by the node process: called once, with the reason, when the store behind a remote datalet
    # is gone (connection lost, or no reply while requests wait). The node then fail-stops: a node
    # that heartbeats but cannot store is never failed over, and it would stall its shard for ever.
    on_lost: Any = None

    async def open(self) -> None:  # noqa: B027 - most datalets need no setup
        """Connect or create storage; called once before any operation."""

    async def close(self) -> None:  # noqa: B027
        """Flush and release resources."""

    @abstractmethod
    def get(self, key: bytes) -> Any: ...

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> Any:
        """Store `value`: bytes, or a live value from a read-modify-write (redis/livelist.py), which
        a datalet that keeps only bytes stores as bytes(value)."""

    def get_live(self, key: bytes) -> Any:
        """A local datalet's value for a read-modify-write (Controlet.read_local): a live value
        where this datalet keeps one (the memory datalet's lists: a push then costs O(pushed)),
        else the bytes get() gives."""
        return self.get(key)

    @abstractmethod
    def delete(self, key: bytes) -> Any:
        """Remove `key`; the result says whether it existed."""

    @abstractmethod
    def exists(self, key: bytes) -> Any: ...

    def swap(self, key: bytes, value: bytes | None) -> Any:
        """Write `value` (None: delete) and return what the key held before (None: absent): the
        before-image a strong controlet keeps to undo a write that failed on another replica.
        Remote datalets override it with one atomic command returning a future; the memory
        datalet returns a live value itself (an immutable version: the image costs O(1))."""
        before = self.get(key)
        done = self.delete(key) if value is None else self.put(key, value)
        if not self.is_async:
            return before

        async def both() -> Any:  # a remote datalet without one command for it: both replies, in order
            image = await before
            await done
            return image
        return asyncio.ensure_future(both())

    @abstractmethod
    def clear(self) -> Any:
        """Remove every key (a replica about to receive a snapshot). Remote datalets return a future."""

    @abstractmethod
    def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every (key, value) pair, in batches under the hood (for recovery and moves)."""

    def export_now(self) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every pair as it is at this call, read as the caller iterates. A local datalet takes its
        view now (a catch-up replays the stream messages sent after it, and a message carrying a
        command -- a delta -- must not be in the snapshot too); a remote one exports from when it
        runs (no deltas reach it: it has no read-modify-write)."""
        return self.export_pairs()

    async def import_pairs(self, pairs: Iterable[tuple[bytes, bytes]]) -> int:
        """Write every pair; returns how many. Remote datalets pipeline the writes."""
        count = 0
        last = None
        for key, value in pairs:
            last = self.put(key, value)
            count += 1
        if self.is_async and last is not None:
            await last
        return count

    def scan(self, start: bytes = b"", limit: int = 100) -> list[tuple[bytes, bytes]]:
        """Up to `limit` pairs with key >= start, in key order."""
        raise ScanUnsupported(f"the {self.name} datalet keeps no key order")

    async def count(self) -> int:
        n = 0
        async for _ in self.export_pairs():
            n += 1
        return n
