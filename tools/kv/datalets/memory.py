"""`memory`: a hash table in the controlet's process (fast, volatile).

A value is bytes, or a live value (redis/live.py: a list, set, hash, sorted set or APPENDed string
kept as an immutable structure, so a write costs O(delta) and the old version stays valid as an
undo image or a snapshot's view). get(), exports and scans hand out bytes (a live value's record,
built once per version); get_live() (read-modify-write) hands out the live value, first turning a
record stored as bytes (a snapshot's, or one a generic command rewrote) into one, which keeps those
very bytes.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlsyskit.tools.kv.datalets.base import Datalet
from mlsyskit.tools.kv.redis.live import promote
from mlsyskit.tools.kv.redis.values import FIRST


def _bytes(value: Any) -> bytes:
    return value if value.__class__ is bytes else value.stored()


class MemoryDatalet(Datalet):
    name = "memory"
    ordered = True  # by sorting on demand: fine for small scans, O(n log n) per call

    def __init__(self) -> None:
        self.data: dict[bytes, Any] = {}  # bytes or a live value
        # Bound methods as attributes: the node calls these per request, so skip a lookup level.
        self._lookup = self.data.get
        # The GET fast path's read: bytes or a live value as stored (the caller turns a live one into its
        # bytes); a bound dict.get, 4x cheaper per call than get() below.
        self.peek = self.data.get
        self.put = self.data.__setitem__  # type: ignore[method-assign]
        if type(self).swap is not MemoryDatalet.swap or type(self).put is not MemoryDatalet.put or self.is_async:
            self.write_many = None  # a subclass that changes how a write goes: write by write (the interpreter)

    def get(self, key: bytes) -> bytes | None:
        value = self._lookup(key)
        if value is None or value.__class__ is bytes:
            return value
        return value.stored()

    def get_live(self, key: bytes) -> Any:
        value = self._lookup(key)
        if value is not None and value.__class__ is bytes and value[:1] == FIRST:
            live = promote(value)
            if live is not value:
                self.data[key] = live  # the same bytes, another form: not a write (no put, no undo)
            return live
        return value

    def put(self, key: bytes, value: Any) -> None:  # replaced per instance in __init__
        self.data[key] = value

    def swap(self, key: bytes, value: Any) -> Any:
        if self.is_async:  # a subclass answering with futures: the generic form awaits both
            return super().swap(key, value)
        before = self._lookup(key)  # a live value as it is: immutable, so it is the image
        if value is None:
            self.delete(key)
        else:
            self.put(key, value)
        return before

    def write_many(self, keys: list[bytes], values: list[Any]) -> list[Any]:
        """A pipeline batch's puts (no deletes) as one step of C calls, not a swap() per write;
        returns their before-images (a key written twice gets its first image twice, so undoing
        the batch, newest first, restores what was there before it). On an error nothing of it
        stays, and it is raised (the interpreter then writes one by one to find the write)."""
        before = list(map(self._lookup, keys))
        try:
            self.data.update(zip(keys, values, strict=True))
        except BaseException:
            data = self.data
            for key, old in zip(reversed(keys), reversed(before), strict=True):
                try:
                    if old is None:
                        data.pop(key, None)
                    else:
                        data[key] = old
                except Exception:  # noqa: BLE001, S112 - a key that cannot be stored was never written
                    continue
            raise
        return before

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def clear(self) -> None:
        self.data.clear()

    def exists(self, key: bytes) -> bool:
        return key in self.data

    def size(self) -> int:
        return len(self.data)

    async def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        for key, value in list(self.data.items()):
            yield key, _bytes(value)

    def export_now(self) -> AsyncIterator[tuple[bytes, bytes]]:
        items = list(self.data.items())  # references: a live value is never changed in place

        async def pairs() -> AsyncIterator[tuple[bytes, bytes]]:
            for key, value in items:
                yield key, _bytes(value)
        return pairs()

    def scan(self, start: bytes = b"", limit: int = 100) -> list[tuple[bytes, bytes]]:
        keys = sorted(k for k in self.data if k >= start)[:limit]
        return [(k, _bytes(self.data[k])) for k in keys]
