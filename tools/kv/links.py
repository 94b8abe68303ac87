"""Outbound links from a node to other nodes: one-way peer messages and forwarded requests.

A link connects lazily and queues frames while connecting, so the state machines can
emit Send actions without caring whether the peer's socket is up yet. A lost connection
is re-established on the next send; messages sent while it was down are lost, and the
receiving controlet counts the gap (catch-up is the coordinator's job on the roadmap).
"""
from __future__ import annotations

import asyncio

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv.pipeline import ConnectionLost, RespConnection


class Link:
    def __init__(self, host: str, port: int, clock: Clock | None = None, attempts: int = 200,
                 retry_delay: float = 0.05) -> None:
        self.host, self.port = host, port
        self.clock = clock or RealClock()
        self.attempts, self.retry_delay = attempts, retry_delay
        self.conn: RespConnection | None = None
        self.pending: list[tuple[bytes, asyncio.Future | None]] = []
        self.connecting: asyncio.Task | None = None
        self.failures = 0

    def _ready(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def send(self, frame: bytes) -> None:
        if self._ready():
            self.conn.send(frame)
        else:
            self.pending.append((frame, None))
            self._ensure_connecting()

    def call_frame(self, frame: bytes) -> asyncio.Future:
        if self._ready():
            return self.conn.call_frame(frame)
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((frame, fut))
        self._ensure_connecting()
        return fut

    def _ensure_connecting(self) -> None:
        if self.connecting is None or self.connecting.done():
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                self.conn = await RespConnection.connect(self.host, self.port)
                break
            except (TimeoutError, OSError) as e:
                last = e
                await self.clock.asleep(self.retry_delay)
        pending, self.pending = self.pending, []
        if not self._ready():
            self.failures += 1
            for _, fut in pending:
                if fut is not None and not fut.done():
                    fut.set_exception(ConnectionLost(f"cannot reach {self.host}:{self.port}: {last}"))
            return
        for frame, fut in pending:
            if fut is None:
                self.conn.send(frame)
            else:
                _chain(self.conn.call_frame(frame), fut)

    async def close(self) -> None:
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        if self.conn is not None:
            await self.conn.close()


def _chain(src: asyncio.Future, dst: asyncio.Future) -> None:
    def done(f: asyncio.Future) -> None:
        if dst.done():
            return
        if f.exception() is not None:
            dst.set_exception(f.exception())
        else:
            dst.set_result(f.result())

    src.add_done_callback(done)
