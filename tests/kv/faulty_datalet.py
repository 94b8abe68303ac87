"""A datalet that fails writes on command, for the failed-write tests (issue 22, item 2).

It wraps any datalet (memory, lmdb, redis) and answers a write with the error Redis gives at
maxmemory while `fail` says so: `fail(key)` -> bool, checked on every put, delete and swap (the
write paths of the interpreter). Reads, scans and exports go to the wrapped datalet unchanged.
A remote (async) datalet's failure is a future that has failed, in issue order like a real reply.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from mlsyskit.tools.kv.datalets.base import Datalet

OOM = "OOM command not allowed when used memory > 'maxmemory'."


class InjectedFault(RuntimeError):
    pass


class FaultyDatalet(Datalet):
    name = "faulty"

    def __init__(self, inner: Datalet, fail: Callable[[bytes], bool] = lambda key: False) -> None:
        self.inner = inner
        self.is_async = inner.is_async
        self.ordered = inner.ordered
        self.fail = fail
        self.failures = 0

    @property
    def data(self) -> Any:  # the simulator reads a memory datalet's dict
        return self.inner.data

    def _refuse(self, key: bytes) -> Any:
        if not self.fail(key):
            return None
        self.failures += 1
        if not self.is_async:
            raise InjectedFault(OOM)
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(InjectedFault(OOM))
        return fut

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    def get(self, key: bytes) -> Any:
        return self.inner.get(key)

    def get_live(self, key: bytes) -> Any:
        return self.inner.get_live(key)

    def exists(self, key: bytes) -> Any:
        return self.inner.exists(key)

    def put(self, key: bytes, value: bytes) -> Any:
        refused = self._refuse(key)
        return refused if refused is not None else self.inner.put(key, value)

    def delete(self, key: bytes) -> Any:
        refused = self._refuse(key)
        return refused if refused is not None else self.inner.delete(key)

    def swap(self, key: bytes, value: bytes | None) -> Any:
        refused = self._refuse(key)
        return refused if refused is not None else self.inner.swap(key, value)

    def clear(self) -> Any:
        return self.inner.clear()

    def size(self) -> int:
        return self.inner.size()

    def scan(self, start: bytes = b"", limit: int = 100) -> list[tuple[bytes, bytes]]:
        return self.inner.scan(start, limit)

    def export_now(self) -> AsyncIterator[tuple[bytes, bytes]]:
        return self.inner.export_now()

    async def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        async for pair in self.inner.export_pairs():
            yield pair
