"""A pipelined RESP client connection: commands go out at once, replies resolve futures in order.

Used by the redis datalet, by nodes forwarding requests and sending peer messages, and by
the smart client. Writes issued in one event-loop turn leave in a single send (a cork
flushed with call_soon), which is what makes pipelining cheap in Python.
"""
from __future__ import annotations

import asyncio
from collections import deque

import hiredis


class ConnectionLost(ConnectionError):
    """The peer closed the connection with requests still waiting."""


class RespConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.reader = hiredis.Reader()
        self.waiters: deque[asyncio.Future] = deque()
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flush_pending = False
        self.closed = False
        self.on_lost = None  # called once if the peer (not close()) ends the connection
        self.replies = 0  # replies received so far: a caller's watchdog tells a stalled peer by it

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float = 5.0) -> RespConnection:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(loop.create_connection(cls, host, port), timeout)
        return proto

    # -- asyncio.Protocol --------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        gets = self.reader.gets
        waiters = self.waiters
        while (reply := gets()) is not False:
            self.replies += 1
            if not waiters:
                continue  # a reply nobody waits for (after a cancelled call): drop it
            fut = waiters.popleft()
            if fut.done():
                continue
            if isinstance(reply, hiredis.ReplyError):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        was_open, self.closed = not self.closed, True
        if was_open and self.on_lost is not None:
            self.on_lost()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(ConnectionLost(f"connection lost: {exc or 'closed by peer'}"))

    # -- sending -----------------------------------------------------------
    def call(self, *parts: bytes | str | int) -> asyncio.Future:
        return self.call_frame(hiredis.pack_command(parts))

    def call_frame(self, frame: bytes) -> asyncio.Future:
        fut = self.loop.create_future()
        if self.closed:
            fut.set_exception(ConnectionLost("connection is closed"))
            return fut
        self.waiters.append(fut)
        self.send(frame)
        return fut

    def send(self, frame: bytes) -> None:
        """Queue bytes without expecting a reply (one-way peer messages)."""
        self.out.append(frame)
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        if self.out and self.transport is not None and not self.closed:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            self.transport.write(data)

    async def close(self) -> None:
        self.flush()
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
