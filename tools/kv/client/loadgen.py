"""The load generator's engine: closed-loop clients driven by reply callbacks, no coroutine per op.

Each client owns one connection per endpoint and keeps up to `window` operations
outstanding (YCSB's asynchronous drivers do the same with a bounded window); an operation
is a list of frames on one connection whose last reply completes it, and the step that
follows it (the write of a read-modify-write, or the client's next operation) is issued
from the reply callback. Frames issued while replies are being handled leave in one write
per connection after the read, so the generator costs a few microseconds of CPU per
operation instead of a coroutine, a future and a wake-up each: on a small machine it shares
the cores with the servers it measures, and whatever it spends compresses every ratio.
"""
from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable

import hiredis
import numpy as np

from mlsyskit.core.clock import Clock
from mlsyskit.tools.kv.client.call import authenticated_socket

READ, UPDATE, RMW = 0, 1, 2


class Router:
    """Where one client sends an operation: (endpoint index, frame, replies the frame produces)."""

    endpoints: list[tuple[str, int]]
    password: bytes | None = None  # sent with AUTH on each connection before any operation

    def read(self, key: bytes) -> tuple[int, bytes, int]: ...
    def write(self, key: bytes, value: bytes) -> tuple[int, bytes, int]: ...


class OpConnection(asyncio.Protocol):
    """One client's connection to one endpoint; `pending` holds (replies still due, on_done) per frame."""

    def __init__(self) -> None:
        self.run: Run | None = None  # the phase being driven; set by drive()
        self.reader = hiredis.Reader()
        self.pending: deque[list] = deque()
        self.out: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def issue(self, frame: bytes, replies: int, on_done: Callable[[bool], None]) -> None:
        self.pending.append([replies, on_done, False])
        if not self.out:
            self.run.dirty.append(self)
        self.out.append(frame)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        gets, pending = self.reader.gets, self.pending
        while (reply := gets()) is not False:
            entry = pending[0]
            if isinstance(reply, hiredis.ReplyError):
                entry[2] = True
            entry[0] -= 1
            if entry[0] == 0:
                pending.popleft()
                entry[1](entry[2])
        self.run.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pending and self.run is not None:
            self.run.fail(ConnectionError(f"connection lost with {len(self.pending)} operations due: {exc}"))


class Run:
    """One phase (load or measured run): ops [0, n) handed out in order to clients with free window slots."""

    def __init__(self, kinds: np.ndarray, keys: np.ndarray, value: bytes, key_name: Callable[[int], bytes],
                 clock: Clock, on_progress: Callable[[int], None] | None) -> None:
        self.kinds, self.keys = kinds.tolist(), keys.tolist()  # plain ints: cheaper to index than numpy
        self.n = len(self.kinds)
        self.value, self.key_name, self.now = value, key_name, clock.now
        self.latencies = np.zeros(self.n, dtype=np.float64)
        self.cursor = self.completed = self.errors = 0
        self.dirty: list[OpConnection] = []
        self.on_progress = on_progress
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def flush(self) -> None:
        dirty, self.dirty = self.dirty, []
        for conn in dirty:
            out = conn.out
            conn.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def next_op(self, router: Router, conns: list[OpConnection]) -> None:
        """Start the next operation on this client (nothing once the plan is exhausted)."""
        i = self.cursor
        if i >= self.n:
            return
        self.cursor = i + 1
        key = self.key_name(self.keys[i])
        kind = self.kinds[i]
        start = self.now()

        def finish(error: bool) -> None:
            self.latencies[i] = self.now() - start
            self.errors += error
            self.completed += 1
            if self.on_progress is not None and (self.completed & 1023) == 0:
                self.on_progress(self.completed)
            if self.completed == self.n and not self.done.done():
                self.done.set_result(None)
            else:
                self.next_op(router, conns)

        if kind == UPDATE:
            index, frame, replies = router.write(key, self.value)
            conns[index].issue(frame, replies, finish)
            return
        index, frame, replies = router.read(key)
        if kind == READ:
            conns[index].issue(frame, replies, finish)
            return

        def then_write(read_error: bool) -> None:  # read-modify-write: the write follows the read's reply
            w_index, w_frame, w_replies = router.write(key, self.value)
            conns[w_index].issue(w_frame, w_replies, lambda error: finish(read_error or error))

        conns[index].issue(frame, replies, then_write)


async def connect_client(router: Router) -> list[OpConnection]:
    """One connection per endpoint of the router, in its order."""
    loop = asyncio.get_running_loop()
    conns = []
    for host, port in router.endpoints:
        if router.password is None:
            _, conn = await asyncio.wait_for(loop.create_connection(OpConnection, host, port), 5)
        else:
            sock = await asyncio.to_thread(authenticated_socket, host, port, router.password)
            _, conn = await loop.create_connection(OpConnection, sock=sock)
        conns.append(conn)
    return conns


async def drive(run: Run, clients: list[tuple[Router, list[OpConnection]]], window: int) -> float:
    """Run the phase to completion; returns its wall time in seconds."""
    for _, conns in clients:
        for c in conns:
            c.run = run
    start = run.now()
    for router, conns in clients:
        for _ in range(window):
            run.next_op(router, conns)
    run.flush()
    if run.n:
        await run.done
    return run.now() - start


def close_all(clients: list[tuple[Router, list[OpConnection]]]) -> None:
    for _, conns in clients:
        for c in conns:
            if c.transport is not None:
                c.transport.close()

