"""A fault-injecting TCP proxy: one per directed replica link, so a partition can cut it.

Node A reaches node B through the proxy for (A, B). `sever()` resets every connection in
flight and stops listening, so bytes queued in either direction are lost and reconnects are
refused, as across a network partition that outlives TCP's patience; `heal()` listens
again on the same port. The proxy never looks inside the stream.
"""
from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        self.port = 0  # chosen by the OS at the first start, kept across heals
        self.server: asyncio.base_events.Server | None = None
        self.pipes: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.tasks: set[asyncio.Task] = set()
        self.stats = {"connections": 0, "bytes": 0, "severed": 0, "resets": 0}

    @property
    def severed(self) -> bool:
        return self.server is None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def sever(self) -> None:
        if self.server is None:
            return
        self.stats["severed"] += 1
        server, self.server = self.server, None
        server.close()
        for a, b in list(self.pipes):
            self.stats["resets"] += 1
            a.transport.abort()
            b.transport.abort()
        self.pipes.clear()
        await server.wait_closed()

    async def heal(self) -> None:
        if self.server is None:
            await self.start()

    async def close(self) -> None:
        await self.sever()
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.server is None:  # accepted in the instant before a sever
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()  # the target is down: the caller sees a reset, as it would directly
            return
        self.stats["connections"] += 1
        pipe = (writer, up_writer)
        self.pipes.add(pipe)
        forward = self._spawn(self._pump(reader, up_writer))
        backward = self._spawn(self._pump(up_reader, writer))
        await asyncio.wait({forward, backward}, return_when=asyncio.FIRST_COMPLETED)
        self.pipes.discard(pipe)
        writer.transport.abort()
        up_writer.transport.abort()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                self.stats["bytes"] += len(data)
                writer.write(data)
                await writer.drain()
