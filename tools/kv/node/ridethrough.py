"""Riding through a failover: a forwarded request that failed because its shard is changing owner
is held and sent again under the newer map, instead of answering -TRYAGAIN (issue 22).

Every request a node sends on to another node goes through `Rider.forward`: the proxy's, and a
replica's forward to its shard's write point or read point. When the answer says the request
never ran (-CLUSTERDOWN: the link never delivered it; a fenced or not-yet-serving replica refused
it), or says its outcome is unknown (-TRYAGAIN: the connection died after the send, a write
timed out) and the request is idempotent (a read or a plain SET: node/requests.idempotent), the
request is held and routed again from the start (`node.submit`: the current map, the current
controlet) with core.retry's backoff until it gets a final answer or RIDE_THROUGH_S has passed
since it was held; then the last answer goes to the client. A non-idempotent write whose outcome
is unknown (INCR, RPUSH, APPEND, DEL, SET NX ...) is never sent again: the client gets the
-TRYAGAIN, as a Redis Cluster client should for a write that may have happened (sending it again
could apply it twice; redis-py and Jedis leave that choice to the caller too).

Order: once a client connection has a held request, its later requests queue behind it and are
routed one at a time in arrival order, so a pipelined SET k 1, SET k 2 cannot be applied 2-then-1
by a retry: those it would forward (here) and those it would apply itself, on a node that has
become the new write point (Node.submit asks `queue_behind` first; while anything is held the
node's local fast paths are off, `on_riding`). A request that fails after a later one of its
connection went out under a newer map is not held at all (it keeps its error). Requests on other
connections are unaffected. Not covered: a request still unanswered (not yet held) when this node,
now the write point, applies a later one of its connection locally, which the rider does not see:
a paused old head's late refusal of the earlier one can still be resent after it (a kill -9 fails
it before the new map, so there it is held, and the later one queues behind it).

RIDE_THROUGH_S covers a kill -9: detection within 5 s (8 missed heartbeats of 0.5 s, issue 22
item 3), the new map committed and fetched (the proxy polls every heartbeat) and the new write
point's take-over; a longer outage still ends in the -CLUSTERDOWN/-TRYAGAIN it always was.
"""
from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from mlsyskit.core.retry import Backoff, retry_async
from mlsyskit.tools.kv.client.rawrelay import BULK, SIMPLE, RawBatch
from mlsyskit.tools.kv.controlets.base import GET
from mlsyskit.tools.kv.node.requests import RelayBatch, Request, relay_answer, relay_reply, worth_retrying
from mlsyskit.tools.kv.shardmap import RIDE_THROUGH_S

RETRY_INITIAL_S, RETRY_CAP_S = 0.05, 0.5


class Attempt(Request):
    """One more try of a held request: a copy routed afresh whose answer resolves `done`."""

    __slots__ = ("done",)

    def __init__(self, orig: Request, done: asyncio.Future) -> None:
        super().__init__(orig.op, orig.key, orig.value, orig.conn, orig.parent, orig.index)
        self.rmw, self.reply, self.done = orig.rmw, orig.reply, done

    def complete(self, payload: bytes) -> None:
        if self.payload is not None:
            Request.duplicate_completions += 1
            return
        self.payload = payload
        if not self.done.done():
            self.done.set_result(payload)


class _Again(Exception):
    def __init__(self, payload: bytes) -> None:
        super().__init__(payload[:80])
        self.payload = payload


def origin(req: Request) -> Any:
    """The client connection a request came on (a multi-key command's part: its parent's)."""
    return req.conn if req.parent is None else getattr(req.parent, "conn", None)


class Rider:
    def __init__(self, node: Any, window_s: float | None = None, seed: int = 0) -> None:
        self.node = node
        # None: RIDE_THROUGH_S on a node that follows a coordinator (node.agent), else 0 -- without
        # a control plane no new map ever comes, so holding a request would only delay its error
        self.window_s = window_s
        self.rng = random.Random(seed)
        self.held: dict[Any, deque[tuple[Request, float]]] = {}  # connection -> its held requests, in order
        self.stats = {"held": 0, "retries": 0, "rode_through": 0, "gave_up": 0}
        self.on_riding: Callable[[], None] | None = None  # called when `held` turns non-empty and empty again

    def queue_behind(self, req: Request) -> bool:
        """A request of a connection with held requests joins their queue, to be routed afresh after
        them, and True; else False. Node.submit asks it (while anything is held) before applying a
        request locally, as `forward` does before sending one on."""
        if type(req) is Attempt:
            return False
        queue = self.held.get(origin(req))
        if queue is None:
            return False
        queue.append((req, self.node.clock.now()))
        return True

    def forward(self, req: Request, node_id: str) -> None:
        epoch = self.node.map.epoch
        if type(req) is not Attempt:
            if self.held and self.queue_behind(req):  # keep this connection's order behind what it has held
                return
            conn = origin(req)
            if conn is not None:
                conn.ride_epoch = epoch  # the map its latest request went out under (see _overtaken)
        self.node.stats["forwarded"] += 1
        # answered in place when the reply is parsed (links.Waiter: no Future or loop turn per request)
        self.node.link(node_id).call_back(req.frame(), lambda f: self._answered(req, f, epoch))

    def forward_relay(self, batch: RelayBatch, link: Any) -> bool:
        """A proxy's RelayBatch, all for the node behind `link`, as one frame: its replies relayed as
        the bytes they came in when all are plain answers (client/rawrelay.py), else settled one by
        one as `forward`'s are (held and retried). False, nothing sent, when the link is not open or
        the connection has held requests (the caller submits them one by one)."""
        if self.held and batch.conn in self.held:
            return False
        epoch = self.node.map.epoch
        n = len(batch.keys)

        def parsed(replies: list) -> None:
            for req, reply in zip(batch.requests(), replies, strict=True):
                self.settle(req, relay_reply(req, reply), epoch)

        frame = batch.frame()
        raw = RawBatch(n, BULK if batch.op is GET else SIMPLE, batch.done, parsed)
        if not link.call_raw(frame, raw) and not link.call_many(frame, n, parsed):
            return False
        batch.conn.ride_epoch = epoch
        self.node.stats["forwarded"] += n
        self.node.stats["batches"] += 1
        return True

    def _answered(self, req: Request, fut: asyncio.Future, epoch: int) -> None:
        self.settle(req, relay_answer(req, fut), epoch)

    def settle(self, req: Request, payload: bytes, epoch: int) -> None:
        """A forwarded request's answer: to its client, or held and retried (module docstring)."""
        if (type(req) is Attempt or self.window() <= 0 or not worth_retrying(req, payload)
                or self._overtaken(req, epoch)):
            req.complete(payload)
            return
        self.hold(req)

    @staticmethod
    def _overtaken(req: Request, epoch: int) -> bool:
        """A later request of the same connection already went out under a newer map (perhaps to the
        new write point, and was applied): sending this one again would apply it after that one, so
        it keeps its error. (A kill -9 fails a request before the map changes, so it is held; a
        paused node's requests may fail only after.)"""
        conn = origin(req)
        return conn is not None and getattr(conn, "ride_epoch", epoch) > epoch

    def window(self) -> float:
        if self.window_s is not None:
            return self.window_s
        return RIDE_THROUGH_S if self.node.agent is not None else 0.0

    def hold(self, req: Request) -> None:
        """Hold a request whose forward failed retriably; it is retried in its connection's order."""
        self.stats["held"] += 1
        key = origin(req)
        queue = self.held.get(key)
        if queue is None:
            first = not self.held
            queue = self.held[key] = deque()
            self.node.spawn(self._drain(key, queue))
            if first and self.on_riding is not None:
                self.on_riding()
        queue.append((req, self.node.clock.now()))

    async def _drain(self, key: Any, queue: deque) -> None:
        try:
            while queue:
                req, since = queue[0]
                payload = await self._retry(req, since)
                queue.popleft()
                req.complete(payload)
        finally:
            if self.held.get(key) is queue:
                del self.held[key]
                if not self.held and self.on_riding is not None:
                    self.on_riding()

    async def _retry(self, req: Request, since: float) -> bytes:
        loop = asyncio.get_running_loop()
        clock = self.node.clock

        async def attempt() -> bytes:
            self.stats["retries"] += 1
            done = loop.create_future()
            self.node.submit(Attempt(req, done))
            payload = await done
            if worth_retrying(req, payload):
                raise _Again(payload)
            return payload

        try:
            payload = await retry_async(attempt, retriable=lambda e: isinstance(e, _Again),
                                        deadline_s=max(0.0, since + self.window() - clock.now()),
                                        backoff=Backoff(RETRY_INITIAL_S, RETRY_CAP_S, self.rng), clock=clock)
        except _Again as last:
            self.stats["gave_up"] += 1
            return last.payload
        self.stats["rode_through"] += 1
        return payload
