"""What flows between the front end, the node runtime and the command handlers.

Kept apart from runtime.py and the front end (frontend/) so that neither imports the other: the front end
builds Requests, the node completes them, and the commands module needs only these types.
"""
from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import hiredis

from mlsyskit.tools.kv.client.pipeline import ConnectionLost
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, FLUSH, GET, PUT
from mlsyskit.tools.kv.redis import queries, resp, resp3, rmw, values
from mlsyskit.tools.kv.shardmap import ShardMap, key_slot

PEER_MESSAGE = b"BKV.MSG"  # BKV.MSG epoch src kind fields...: one-way, authenticated peers only
PEER_NONCE = b"BKV.NONCE"
PEER_AUTH = b"BKV.AUTH"
UNREACHABLE = "cannot reach"  # how a link that gave up connecting fails its queued calls (links.py)
# Every way a call fails before its frame was written (links.py, client/pipeline.py): never applied.
NEVER_SENT = (UNREACHABLE, "more than", "link to", "connection is closed")
FLUSH_SHARD = b"BKV.FLUSHSHARD"  # FLUSHALL's part for the shard that owns the key given


class Request:
    """One single-key client operation; `complete` hands its encoded reply to whoever waits.

    A request completes exactly once: a second completion is a protocol bug, so it is not
    delivered (the client would get a reply for a command it never sent) and it is counted
    in `Request.duplicate_completions`, which the tests assert stays 0.
    """

    __slots__ = ("op", "key", "value", "conn", "payload", "existed", "parent", "index", "rmw", "reply")
    duplicate_completions: ClassVar[int] = 0

    def __init__(self, op: str, key: bytes, value: bytes | None, conn: Any, parent: Any = None,
                 index: int = 0) -> None:
        self.op, self.key, self.value, self.conn = op, key, value, conn
        self.payload: bytes | None = None
        self.existed = False
        self.parent, self.index = parent, index
        self.rmw: list[bytes] | None = None  # the command of a read-modify-write (INCR, SETNX, SET NX ...)
        self.reply: bytes | None = None  # its answer, computed where it was resolved

    def complete(self, payload: bytes) -> None:
        if self.payload is not None:
            Request.duplicate_completions += 1
            return
        self.payload = payload
        if self.parent is not None:
            self.parent.part_done(self)
        elif self.conn is not None:
            self.conn.slot_done(self)

    def frame(self) -> bytes:
        """The command that performs this operation on another node."""
        if self.rmw is not None and self.reply is None:
            return hiredis.pack_command(tuple(self.rmw))
        if self.op is PUT:  # the client's own bytes (a value that reads as a record was escaped)
            value = self.value
            return hiredis.pack_command((b"SET", self.key, values.client_string(value) if value[:1] == values.FIRST
                                         else value))
        if self.op is FLUSH:
            return hiredis.pack_command((FLUSH_SHARD, self.key))
        return hiredis.pack_command(({GET: b"GET", EXISTS: b"EXISTS", DEL: b"DEL"}[self.op], self.key))


class RelayBatch:
    """A connection's plain GETs (or SETs) of one read at a proxy: ONE reply slot for them all.

    Relayed as one frame to their node, whose replies come back as one string when all are plain
    answers (client/rawrelay.py); otherwise, or when they cannot go as one frame, the batch becomes
    single requests (`requests()`, each a part of it, answered and retried one by one) and its
    payload is their answers in order. A batch counts as one read (one write) for session order."""

    __slots__ = ("op", "keys", "values", "conn", "payload", "parts", "remaining")
    nil_on_wrongtype = False  # a part answers what a single GET answers (not MGET's nil)

    def __init__(self, op: str, conn: Any) -> None:
        self.op, self.conn = op, conn
        self.keys: list[bytes] = []
        self.values: list[bytes] = []  # a SET batch's values
        self.payload: bytes | None = None
        self.parts: list[bytes | None] = []
        self.remaining = 0

    def requests(self) -> list[Request]:
        """The batch as single requests, in order (each completes its part)."""
        n = len(self.keys)
        self.parts, self.remaining = [None] * n, n
        if self.op is GET:
            return [Request(GET, k, None, None, self, i) for i, k in enumerate(self.keys)]
        return [Request(PUT, k, v, None, self, i) for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True))]

    def part_done(self, req: Request) -> None:
        self.parts[req.index] = req.payload
        self.remaining -= 1
        if not self.remaining:
            self.done(b"".join(self.parts))

    def done(self, payload: bytes) -> None:
        if self.payload is not None:
            Request.duplicate_completions += 1
            return
        self.payload = payload
        self.conn.slot_done(self)

    def frame(self) -> bytes:
        """The batch as the commands its node runs (Request.frame's, inlined: plain SETs are never
        escaped, the front end batches only values stored as they came)."""
        if self.op is GET:
            return b"".join([b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(k), k) for k in self.keys])
        return b"".join([b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(k), k, len(v), v)
                         for k, v in zip(self.keys, self.values, strict=True)])


class Ready:
    """An immediate reply queued behind a slower one (or filled in later by a handler)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes | None) -> None:
        self.payload = payload


def now_ms(req: Request) -> int:
    """The wall clock of the connection a request came on (for lazy expiry)."""
    conn = req.conn if req.conn is not None else req.parent.conn
    return conn.unix_ms()


def for_client(req: Request, payload: bytes) -> bytes:
    """A typed command's RESP2 answer, reshaped for a client that chose RESP3 (resp3.py)."""
    conn = req.conn if req.conn is not None else req.parent.conn
    if getattr(conn, "protocol", 2) == 3 and req.rmw[0] in resp3.SHAPED:
        return resp3.shape(req.rmw, payload)
    return payload


def read_answer(req: Request, stored: bytes | None) -> bytes:
    """A read's answer from a replica's stored bytes: plain strings as they are, records
    (values.py) decoded; a key past its deadline is absent (lazy expiry)."""
    if req.rmw is not None:
        return for_client(req, queries.answer(req.rmw, stored, now_ms(req)))
    if stored is not None and stored[:1] == values.FIRST and values.is_tagged(stored):
        now = now_ms(req)
        if req.op is not GET:
            return resp.ZERO if values.expired(stored, now) else resp.ONE
        answer = values.get_answer(stored, now)
        mget = req.parent is not None and req.parent.nil_on_wrongtype
        return resp.NULL if answer is values.WRONGTYPE and mget else answer  # MGET: nil
    if req.op is GET:
        return resp.bulk(stored)
    return resp.ZERO if stored is None else resp.ONE


def write_reply(req: Request) -> bytes:
    if req.reply is not None:
        return req.reply if req.rmw is None else for_client(req, req.reply)
    return resp.OK if req.op is PUT or req.op is FLUSH else (resp.ONE if req.existed else resp.ZERO)


def relay_answer(req: Request, fut: asyncio.Future) -> bytes:
    """Re-encode a forwarded request's answer the way this op answers."""
    exc = fut.exception()
    return relay_reply(req, exc if exc is not None else fut.result())


def relay_reply(req: Request, reply: object) -> bytes:
    """relay_answer for a reply as a link delivers it: the value, or the exception it failed with."""
    if isinstance(reply, BaseException):
        exc = reply
        if isinstance(exc, hiredis.ReplyError):
            if req.parent is not None and req.parent.nil_on_wrongtype and req.op is GET \
                    and str(exc).startswith("WRONGTYPE"):
                return resp.NULL  # MGET answers nil for a key of another kind
            return resp.error(str(exc))
        if isinstance(exc, ConnectionLost) and str(exc).startswith(NEVER_SENT):
            # the link never connected (or closed, or gave up) with it still queued: it was never sent
            return resp.error(f"CLUSTERDOWN the shard's node is unreachable, not applied: {exc}")
        return resp.error(f"TRYAGAIN forward failed: {exc}")  # it may have been sent: the outcome is unknown
    value = reply
    if req.rmw is not None:
        return for_client(req, rmw.relayed(req.rmw, value))
    if req.op is FLUSH:
        return resp.OK
    if req.op is GET:
        return resp.bulk(value)
    if req.op is PUT:
        return resp.OK
    return resp.integer(int(value))


# -- riding through a failover and redirecting cluster clients (issue 22) -------------------------
# Answers that say the operation was refused before anything ran: safe to send again, whatever it is.
NOT_APPLIED = (b"-CLUSTERDOWN", b"-TRYAGAIN fenced:", b"-TRYAGAIN not serving yet:", b"-MOVED")


def idempotent(req: Request) -> bool:
    """Running it twice has the effect and the answer of running it once: reads (GET, EXISTS and the
    typed queries) and a plain SET. Not DEL (a second one answers 0), INCR, RPUSH, APPEND, SETNX, SET
    with options, EXPIRE ... (every read-modify-write): their outcome must not be guessed."""
    if req.op is GET or req.op is EXISTS or req.op is FLUSH:
        return True
    return req.op is PUT and req.rmw is None


def worth_retrying(req: Request, payload: bytes) -> bool:
    """Whether an answer is a failure that a retry may turn into the right answer: a refusal before
    execution (any request), or an unknown outcome (-TRYAGAIN) of an idempotent request."""
    if payload[:1] != b"-":
        return False
    if payload.startswith(NOT_APPLIED):
        return True
    return payload.startswith(b"-TRYAGAIN") and idempotent(req)


def shard_order(controlet_cls: Any, replicas: tuple[str, ...]) -> list[str]:
    """A shard's replicas as a cluster client sees them: its write point(s) first, then the rest."""
    first = list(controlet_cls.write_targets(replicas))
    return first + [n for n in replicas if n not in first]


def moved(smap: ShardMap, controlet_cls: Any, key: bytes) -> bytes:
    """Redis Cluster's redirect for a key this node does not hold: -MOVED slot host:port of the
    write point of the shard that owns the key's slot."""
    slot = key_slot(key)
    addr = smap.nodes[shard_order(controlet_cls, smap.shards[smap.shard_of_slot(slot)])[0]]
    return b"-MOVED %d %s:%d\r\n" % (slot, addr.host.encode(), addr.port)
