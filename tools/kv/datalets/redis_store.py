"""`redis`: an external Redis server (Debian's redis-server), spoken to over RESP.

One pipelined connection: commands are written as they are issued and replies come back
in the same order, so the node keeps its apply order without waiting a round trip per op.

The server is a separate process that can die or stop on its own. Reconnecting is not safe (a
restarted server may have lost its last writes: appendfsync everysec), so the datalet reports the
server lost (`on_lost`) when the connection closes, or when requests wait `stall_s` with no reply
(a SIGSTOPped server), and fails every later operation; the node process then exits and is failed
over like any crashed node (ops/nodeproc.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from mlsyskit.core.retry import Backoff, retry_async
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.datalets.base import Datalet


class RedisDatalet(Datalet):
    name = "redis"
    is_async = True

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, db: int = 0, stall_s: float = 3.0,
                 connect_s: float = 5.0) -> None:
        self.host, self.port, self.db = host, port, db
        self.stall_s = stall_s  # requests waiting this long with no reply: the server is lost (above the
        # 2 s Redis may block writes on a busy disk with appendfsync everysec)
        self.connect_s = connect_s  # how long open() retries a refused connection (a server starting)
        self.conn: RespConnection | None = None
        self.lost: str | None = None
        self._watchdog: asyncio.Task | None = None

    async def open(self) -> None:
        try:  # a redis-server starting with the node refuses connections for a while
            self.conn = await retry_async(lambda: RespConnection.connect(self.host, self.port),
                                          retriable=lambda e: isinstance(e, ConnectionRefusedError),
                                          deadline_s=self.connect_s, backoff=Backoff(0.05, 0.2))
        except ConnectionRefusedError:
            raise ConnectionRefusedError(
                f"redis-server at {self.host}:{self.port} refused connections for {self.connect_s:g} s") from None
        if self.db:
            await self.conn.call(b"SELECT", self.db)
        self.conn.on_lost = lambda: self._lose(f"redis-server at {self.host}:{self.port} closed the connection")
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Lose the server when requests wait a whole stall_s without any reply."""
        conn, step = self.conn, self.stall_s / 4
        seen, since = conn.replies, None
        while self.lost is None and not conn.closed:
            await asyncio.sleep(step)
            now = asyncio.get_running_loop().time()
            if conn.replies != seen or not conn.waiters:
                seen, since = conn.replies, None
            elif since is None:
                since = now - step  # waiting since at most one step ago
            elif now - since >= self.stall_s:
                self._lose(f"redis-server at {self.host}:{self.port} sent no reply for {self.stall_s:g} s "
                           f"with {len(conn.waiters)} requests waiting (stopped or hung)")
                conn.transport.abort()  # fails every waiting request; later calls fail at once

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            if self.on_lost is not None:
                self.on_lost(why)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    def get(self, key: bytes):
        return self.conn.call(b"GET", key)

    def put(self, key: bytes, value: bytes):
        return self.conn.call(b"SET", key, value)

    def delete(self, key: bytes):
        return self.conn.call(b"DEL", key)  # resolves to 1 or 0 (truthy when it existed)

    def swap(self, key: bytes, value: bytes | None):
        """SET key value GET / GETDEL key: the write and the before-image in one command (Redis >= 6.2)."""
        return self.conn.call(b"GETDEL", key) if value is None else self.conn.call(b"SET", key, value, b"GET")

    def exists(self, key: bytes):
        return self.conn.call(b"EXISTS", key)

    def clear(self):
        return self.conn.call(b"FLUSHDB", b"ASYNC")  # freed in the background: a large db answers at once

    async def flush(self) -> None:
        await self.conn.call(b"FLUSHDB", b"ASYNC")

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
