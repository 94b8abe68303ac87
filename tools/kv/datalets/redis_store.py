"""`redis`: an external Redis server (Debian's redis-server), spoken to over RESP.

One pipelined connection: commands are written as they are issued and replies come back
in the same order, so the node keeps its apply order without waiting a round trip per op.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from mlsyskit.tools.kv.datalets.base import Datalet
from mlsyskit.tools.kv.pipeline import RespConnection


class RedisDatalet(Datalet):
    name = "redis"
    is_async = True

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, db: int = 0) -> None:
        self.host, self.port, self.db = host, port, db
        self.conn: RespConnection | None = None

    async def open(self) -> None:
        self.conn = await RespConnection.connect(self.host, self.port)
        if self.db:
            await self.conn.call(b"SELECT", self.db)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    def get(self, key: bytes):
        return self.conn.call(b"GET", key)

    def put(self, key: bytes, value: bytes):
        return self.conn.call(b"SET", key, value)

    def delete(self, key: bytes):
        return self.conn.call(b"DEL", key)  # resolves to 1 or 0 (truthy when it existed)

    def exists(self, key: bytes):
        return self.conn.call(b"EXISTS", key)

    def clear(self):
        return self.conn.call(b"FLUSHDB")

    async def flush(self) -> None:
        await self.conn.call(b"FLUSHDB")

    async def export_pairs(self) -> AsyncIterator[tuple[bytes, bytes]]:
        cursor = b"0"
        while True:
            cursor, keys = await self.conn.call(b"SCAN", cursor, b"COUNT", 1000)
            if keys:
                values = await self.conn.call(b"MGET", *keys)
                for k, v in zip(keys, values, strict=True):
                    if v is not None:  # deleted between SCAN and MGET
                        yield k, v
            if cursor == b"0":
                return
