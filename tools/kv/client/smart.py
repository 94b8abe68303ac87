"""The smart client: fetches the shard map and sends each request straight to the right node.

Writes go to the controlet's write target for the key's shard (the chain head, the
master, or any replica for active-active), reads to one of its read targets (picked by a
seeded RNG). Each node connection is one pipelined RESP connection, so many coroutines
can share a client. Optionally every operation is recorded in a History.

Recording is honest about what the client knows: a write is `fail` only when it certainly
had no effect (the connection could not be opened, or the server refused it before doing
anything: bad arity, oversize key...); a write that was sent and then timed out, lost its
connection or got any other error (`forward failed`, a datalet error, TRYAGAIN) may have
been applied somewhere and is `info`. Reads have no effect, so a failed read is `fail`.
"""
from __future__ import annotations

import asyncio
import random

import hiredis

from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.shardmap import ShardMap


class KVError(RuntimeError):
    """The cluster answered with an error."""


# Errors a node answers before touching any state (front-end validation): a write that got
# one of these certainly did not happen. Any other error after a send is ambiguous.
# A node fenced by a newer epoch refuses before it executes anything ("TRYAGAIN fenced: ..."),
# so that refusal is a definite fail too, as is a replica's "not serving yet" (catching up or aligning:
# controlets/base.NOT_SERVING) for a new operation, and a -MOVED (a node that left the map, or a key of
# another shard: frontend/cluster.py); a plain TRYAGAIN (a write timed out waiting for a replica) is
# not: the write may have been applied.
REFUSED_BEFORE_EXECUTION = ("wrong number of arguments", "syntax error", "key too long", "value too large",
                            "unknown command", "too many arguments", "Protocol error", "only database 0",
                            "TRYAGAIN fenced:", "TRYAGAIN not serving yet:", "MOVED")


def certainly_not_applied(message: str) -> bool:
    text = message.removeprefix("ERR ").strip()
    return any(text.startswith(prefix) for prefix in REFUSED_BEFORE_EXECUTION)


class SmartClient:
    def __init__(self, shard_map: ShardMap, seed: int = 0, history: History | None = None,
                 process: int = 0, timeout: float | None = None, password: bytes | None = None) -> None:
        self.map = shard_map
        self.password = password  # sent with AUTH on every new connection (clusters with requirepass)
        self.timeout = timeout  # per recorded operation; None waits for ever
        self.cls = controlet_class(shard_map.controlet)
        self.rng = random.Random(seed)
        self.history = history
        self.process = process
        self.conns: dict[str, RespConnection] = {}
        # Per-shard target lists, computed once: the request path only indexes them.
        self._writes = [tuple(self.cls.write_targets(r)) for r in shard_map.shards]
        self._reads = [tuple(self.cls.read_targets(r)) for r in shard_map.shards]

    @classmethod
    async def connect(cls, host: str, port: int, **kwargs) -> SmartClient:
        seed_conn = await RespConnection.connect(host, port)
        try:
            if kwargs.get("password") is not None:
                await seed_conn.call(b"AUTH", kwargs["password"])
            text = await seed_conn.call(b"BKV.SHARDMAP")
        finally:
            await seed_conn.close()
        return cls(ShardMap.from_json(text), **kwargs)

    async def close(self) -> None:
        for conn in self.conns.values():
            await conn.close()
        self.conns.clear()

    async def _conn(self, node_id: str) -> RespConnection:
        conn = self.conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        addr = self.map.nodes[node_id]
        conn = await RespConnection.connect(addr.host, addr.port)
        if self.password is not None:
            try:
                await conn.call(b"AUTH", self.password)
            except hiredis.ReplyError as e:  # refused before any command: nothing was applied
                await conn.close()
                raise KVError(str(e)) from None
        self.conns[node_id] = conn
        return conn

    def target(self, key: bytes, write: bool) -> str:
        targets = (self._writes if write else self._reads)[self.map.shard_for(key)]
        return targets[0] if len(targets) == 1 else targets[self.rng.randrange(len(targets))]

    async def _call(self, f: str, key: bytes, value: bytes | None, *parts: bytes):
        write = f in ("put", "del")
        if self.history is not None:
            self.history.invoke(self.process, f, key, value)
        node = self.target(key, write)
        try:
            conn = self.conns.get(node)
            if conn is None or conn.closed:
                conn = await self._conn(node)
        except (TimeoutError, OSError, KVError):  # nothing was sent (KVError: AUTH refused)
            self._record("fail", f, key, value)
            raise
        try:
            pending = conn.call(*parts)
            result = await (pending if self.timeout is None else asyncio.wait_for(pending, self.timeout))
        except hiredis.ReplyError as e:
            ambiguous = write and not certainly_not_applied(str(e))
            self._record("info" if ambiguous else "fail", f, key, value)
            raise KVError(str(e)) from None
        except (TimeoutError, OSError):  # sent, then no answer: it may have been applied
            self._record("info" if write else "fail", f, key, value)
            raise
        if self.history is not None:
            outcome = result if f == "get" else value if f == "put" else ("1" if result else "0")
            self._record("ok", f, key, outcome, node)
        return result

    def _record(self, kind: str, f: str, key: bytes, value, node: str | None = None) -> None:
        if self.history is not None:
            self.history.complete(self.process, kind, f, key, value, node)

    async def get(self, key: bytes) -> bytes | None:
        if self.history is None:  # the load generator's path: no recording, one coroutine
            node = self.target(key, False)
            conn = self.conns.get(node)
            if conn is None or conn.closed:
                conn = await self._conn(node)
            try:
                return await conn.call(b"GET", key)
            except hiredis.ReplyError as e:
                raise KVError(str(e)) from None
        return await self._call("get", key, None, b"GET", key)

    async def put(self, key: bytes, value: bytes) -> None:
        if self.history is None:
            node = self.target(key, True)
            conn = self.conns.get(node)
            if conn is None or conn.closed:
                conn = await self._conn(node)
            try:
                await conn.call(b"SET", key, value)
                return
            except hiredis.ReplyError as e:
                raise KVError(str(e)) from None
        await self._call("put", key, value, b"SET", key, value)

    async def delete(self, key: bytes) -> bool:
        return bool(await self._call("del", key, None, b"DEL", key))

    async def exists(self, key: bytes) -> bool:
        return bool(await self._call("exists", key, None, b"EXISTS", key))
