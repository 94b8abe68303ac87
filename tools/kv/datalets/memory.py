"""`memory`: a hash table in the controlet's process (fast, volatile)."""
from __future__ import annotations

from collections.abc import AsyncIterator

from mlsyskit.tools.kv.datalets.base import Datalet


class MemoryDatalet(Datalet):
    name = "memory"
    ordered = True  # by sorting on demand: fine for small scans, O(n log n) per call

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        # Bound methods as attributes: the node calls these per request, so skip a lookup level.
        self.get = self.data.get  # type: ignore[method-assign]
        self.put = self.data.__setitem__  # type: ignore[method-assign]

    def get(self, key: bytes) -> bytes | None:  # replaced per instance in __init__
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def clear(self) -> None:
        self.data.clear()

    def exists(self, key: bytes) -> bool:
        return key in self.data

    def size(self) -> int:
        return len(self.data)

    async def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        for item in list(self.data.items()):
            yield item

    def export_now(self) -> AsyncIterator[tuple[bytes, bytes]]:
        items = list(self.data.items())

        async def pairs() -> AsyncIterator[tuple[bytes, bytes]]:
            for item in items:
                yield item
        return pairs()

    def scan(self, start: bytes = b"", limit: int = 100) -> list[tuple[bytes, bytes]]:
        keys = sorted(k for k in self.data if k >= start)[:limit]
        return [(k, self.data[k]) for k in keys]
