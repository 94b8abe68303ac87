"""Outbound links from a node to other nodes: one-way peer messages and forwarded requests.

A link connects lazily, authenticates with the cluster secret (peerauth.py) and queues
frames while connecting, so the state machines can emit Send actions without caring whether
the peer's socket is up yet. Nothing is dropped silently: when connecting fails `attempts`
times in a row, or the queue outgrows `max_queued` frames, the link gives up -- it discards
the queue, fails waiting calls, counts what it dropped and tells its owner (`on_give_up`),
whose controlet then fails or retries what depended on those messages. Receivers detect the
hole too: replicated streams are numbered and a replica never skips a number (stream.py).
The next send starts connecting afresh.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv import peerauth
from mlsyskit.tools.kv.client.pipeline import ConnectionLost, RespConnection
from mlsyskit.tools.kv.client.rawrelay import RawBatch, RelayConnection
from mlsyskit.tools.kv.node.requests import PEER_AUTH, PEER_NONCE


class Link:
    def __init__(self, host: str, port: int, clock: Clock | None = None, attempts: int = 40,
                 retry_delay: float = 0.05, secret: bytes | None = None, me: str = "", target: str = "",
                 on_give_up: Callable[[int], None] | None = None, max_queued: int = 100_000) -> None:
        self.host, self.port = host, port
        self.clock = clock or RealClock()
        self.attempts, self.retry_delay = attempts, retry_delay
        self.secret, self.me, self.target = secret, me.encode(), target.encode()
        self.on_give_up = on_give_up
        self.max_queued = max_queued
        self.conn: RespConnection | None = None
        self.pending: list[tuple[bytes, asyncio.Future | Waiter | None]] = []
        self.connecting: asyncio.Task | None = None
        self.failures = 0
        self.dropped = 0

    def _ready(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def send(self, frame: bytes) -> None:
        if self._ready():
            self.conn.send(frame)
        else:
            self._queue(frame, None)

    def call_frame(self, frame: bytes) -> asyncio.Future:
        if self._ready():
            return self.conn.call_frame(frame)
        fut = asyncio.get_running_loop().create_future()
        self._queue(frame, fut)
        return fut

    def call_back(self, frame: bytes, fn: Callable[[Waiter], None]) -> None:
        """call_frame without a Future: `fn(waiter)` runs as soon as the reply is parsed (or the call
        fails), with a waiter that answers exception() and result() as a done Future does. Saves the
        Future, its callback's loop turn and its handle per forwarded request (the proxy's hot path)."""
        waiter = Waiter(fn)
        if self._ready():
            self.conn.waiters.append(waiter)  # RespConnection resolves its waiters in reply order
            self.conn.send(frame)
        else:
            self._queue(frame, waiter)

    def call_many(self, frame: bytes, n: int, fn: Callable[[list], None]) -> bool:
        """`frame` holds n commands: `fn(replies)` runs once all n replies are parsed, each the value
        or the exception it failed with (a reply error, the connection lost). False, and nothing
        sent, unless the connection is open (the caller then sends them one by one)."""
        if not self._ready():
            return False
        self.conn.waiters.extend([Replies(fn, n)] * n)  # one slot per reply, resolved in order
        self.conn.send(frame)
        return True

    def call_raw(self, frame: bytes, batch: RawBatch) -> bool:
        """call_many whose replies, when all of the batch's expected type, come back as their raw
        bytes (client/rawrelay.py). False, nothing sent, when the connection cannot do it now."""
        return self._ready() and self.conn.call_raw(frame, batch)

    def _queue(self, frame: bytes, fut: asyncio.Future | Waiter | None) -> None:
        self.pending.append((frame, fut))
        if len(self.pending) > self.max_queued:
            self._give_up(f"more than {self.max_queued} messages queued for {self.host}:{self.port}")
            return
        if self.connecting is None or self.connecting.done():
            self.connecting = asyncio.get_running_loop().create_task(self._connect())

    def _give_up(self, why: str) -> None:
        pending, self.pending = self.pending, []
        self.failures += 1
        self.dropped += len(pending)
        for _, fut in pending:
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionLost(why))
        if self.connecting is not None and not self.connecting.done() \
                and self.connecting is not asyncio.current_task():
            self.connecting.cancel()
        if self.on_give_up is not None:
            self.on_give_up(len(pending))

    async def _open(self) -> RespConnection:
        conn = await RelayConnection.connect(self.host, self.port)
        if self.secret is not None:
            try:
                nonce = await asyncio.wait_for(conn.call(PEER_NONCE), 5.0)
                answer = await asyncio.wait_for(
                    conn.call(PEER_AUTH, self.me, peerauth.proof(self.secret, nonce, self.me, self.target)), 5.0)
            except Exception:
                await conn.close()
                raise
            if answer != b"OK":
                await conn.close()
                raise ConnectionLost(f"{self.host}:{self.port} refused this node's credentials")
        return conn

    async def _connect(self) -> None:
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                self.conn = await self._open()
                break
            except (TimeoutError, OSError, ConnectionError, Exception) as e:  # noqa: BLE001 - retried, then reported
                last = e
                await self.clock.asleep(self.retry_delay)
        if not self._ready():
            self._give_up(f"cannot reach {self.host}:{self.port}: {last}")
            return
        self.conn.on_lost = self._lost
        pending, self.pending = self.pending, []
        for frame, fut in pending:
            if fut is None:
                self.conn.send(frame)
            elif type(fut) is Waiter:
                self.conn.waiters.append(fut)
                self.conn.send(frame)
            else:
                _chain(self.conn.call_frame(frame), fut)

    def _lost(self) -> None:
        """The peer closed an open connection: frames already written may never have arrived."""
        self.failures += 1
        if self.on_give_up is not None:
            self.on_give_up(0)

    async def close(self) -> None:
        """Stop for good (the node stops, or the peer left the shard map): calls still queued fail."""
        self.on_give_up = None
        pending, self.pending = self.pending, []
        for _, fut in pending:
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionLost(f"link to {self.host}:{self.port} closed"))
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        if self.conn is not None:
            await self.conn.close()


class Waiter:
    """The reply half of a Future, resolved in place: RespConnection (and a link giving up) calls
    set_result/set_exception, which run `fn(self)` at once instead of scheduling it on the loop."""

    __slots__ = ("fn", "value", "error", "finished")

    def __init__(self, fn: Callable[[Waiter], None]) -> None:
        self.fn = fn
        self.value: object = None
        self.error: BaseException | None = None
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: object) -> None:
        self.value = value
        self._fire()

    def set_exception(self, error: BaseException) -> None:
        self.error = error
        self._fire()

    def _fire(self) -> None:
        self.finished = True
        try:
            self.fn(self)
        except Exception as e:  # noqa: BLE001 - as a Future's callback: reported, the reader goes on
            asyncio.get_running_loop().call_exception_handler(
                {"message": "exception in a link call's callback", "exception": e})

    def exception(self) -> BaseException | None:
        return self.error

    def result(self) -> object:
        if self.error is not None:
            raise self.error
        return self.value


class Replies:
    """The n replies of a batch of commands sent as one frame (call_many): RespConnection resolves
    each of the batch's n waiter slots, all this object, in order; `fn(replies)` runs on the last."""

    __slots__ = ("fn", "n", "replies")

    def __init__(self, fn: Callable[[list], None], n: int) -> None:
        self.fn, self.n = fn, n
        self.replies: list = []

    def done(self) -> bool:
        return len(self.replies) >= self.n

    def set_result(self, value: object) -> None:
        self.replies.append(value)
        if len(self.replies) == self.n:
            self._fire()

    set_exception = set_result  # an error reply or a lost connection: delivered as the value

    def _fire(self) -> None:
        try:
            self.fn(self.replies)
        except Exception as e:  # noqa: BLE001 - as Waiter: reported, the reader goes on
            asyncio.get_running_loop().call_exception_handler(
                {"message": "exception in a link batch's callback", "exception": e})


def _chain(src: asyncio.Future, dst: asyncio.Future) -> None:
    def done(f: asyncio.Future) -> None:
        if dst.done():
            return
        if f.exception() is not None:
            dst.set_exception(f.exception())
        else:
            dst.set_result(f.result())

    src.add_done_callback(done)
