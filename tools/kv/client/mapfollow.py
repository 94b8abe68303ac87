"""A smart client that follows the shard map: on a sign that the map moved on, it fetches it again,
and rides through a failover: an operation that failed because its shard is changing owner is sent
again under the newer map, for up to `ride_through_s` (kv.shardmap.RIDE_THROUGH_S by default; 0
when it records a history, whose caller decides what to retry), through `retrying` (core.retry):
any operation refused before it ran; a read or a SET also when its outcome is unknown; never a
DEL whose outcome is unknown (a second one would answer 0 for a key the first deleted).

A fenced refusal is recorded `fail`, not `info`: the node refused it before executing anything.
The signs: a node refused as fenced (deposed, or without a lease), a write failed because the
shard was reconfigured, or a node could not be reached or dropped the connection. The
operation itself still fails (recorded as the base client records it: a refused or unreachable
operation `fail`, an ambiguous one `info`); the caller retries, and the retry goes to the new
map's nodes. Fetches are rate-limited so a dead node does not turn every operation into one.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mlsyskit.core.clock import Clock
from mlsyskit.core.retry import Backoff, retry_async
from mlsyskit.tools.kv.client.smart import KVError, SmartClient
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.base import FENCED
from mlsyskit.tools.kv.shardmap import RIDE_THROUGH_S, ShardMap

MapSource = Callable[[], Awaitable[ShardMap | None]]
HINTS = ("fenced:", "reconfigured", "catching up", "link", "forward", "CLUSTERDOWN", "MOVED")


def means_new_map(error: BaseException) -> bool:
    if isinstance(error, KVError):
        return any(h in str(error) for h in HINTS)
    return isinstance(error, (OSError, TimeoutError))


class FollowingClient(SmartClient):
    def __init__(self, shard_map: ShardMap, fetch_map: MapSource, min_interval_s: float = 0.1,
                 ride_through_s: float | None = None, **kwargs) -> None:
        super().__init__(shard_map, **kwargs)
        self.ride_through_s = (ride_through_s if ride_through_s is not None
                               else 0.0 if self.history is not None else RIDE_THROUGH_S)
        self.fetch_map = fetch_map
        self.min_interval_s = min_interval_s
        self.last_fetch = -1e9
        self.refreshes = 0
        self._held: tuple | None = None  # an `info` record waiting for its error (see _record)

    async def _following(self, operation):
        self._held = None
        try:
            return await operation
        except (KVError, OSError, TimeoutError) as e:
            if self._held is not None:  # a fenced node refused before executing: certainly not applied
                kind, f, key, value = self._held
                super()._record("fail" if isinstance(e, KVError) and FENCED in str(e) else kind, f, key, value)
                self._held = None
            if means_new_map(e):
                await self.refresh()
            raise

    def _record(self, kind: str, f: str, key: bytes, value, node: str | None = None) -> None:
        if kind == "info":  # decided in _following, which sees the error
            self._held = (kind, f, key, value)
        else:
            super()._record(kind, f, key, value, node)

    async def _riding(self, call: Callable[[], Awaitable], idempotent: bool):
        if self.ride_through_s <= 0:
            return await self._following(call())
        return await retrying(lambda: self._following(call()), idempotent, within_s=self.ride_through_s)

    async def get(self, key: bytes) -> bytes | None:
        return await self._riding(lambda: SmartClient.get(self, key), True)

    async def put(self, key: bytes, value: bytes) -> None:
        await self._riding(lambda: SmartClient.put(self, key, value), True)

    async def delete(self, key: bytes) -> bool:
        return await self._riding(lambda: SmartClient.delete(self, key), False)

    async def exists(self, key: bytes) -> bool:
        return await self._riding(lambda: SmartClient.exists(self, key), True)

    async def refresh(self) -> bool:
        """Fetch the map (at most once per min_interval_s); True when a newer one was adopted."""
        loop = asyncio.get_running_loop()
        if loop.time() - self.last_fetch < self.min_interval_s:
            return False
        self.last_fetch = loop.time()
        try:
            current = await self.fetch_map()
        except (OSError, TimeoutError, RuntimeError):
            return False
        if current is None or current.epoch <= self.map.epoch:
            return False
        self.adopt(current)
        return True

    def adopt(self, current: ShardMap) -> None:
        self.refreshes += 1
        self.map = current
        self.cls = controlet_class(current.controlet)  # a live switch changes the controlet
        self._writes = [tuple(self.cls.write_targets(r)) for r in current.shards]
        self._reads = [tuple(self.cls.read_targets(r)) for r in current.shards]
        for node in [n for n in self.conns if n not in current.nodes]:
            conn = self.conns.pop(node)
            asyncio.get_running_loop().create_task(conn.close())


RETRY_INITIAL_S, RETRY_CAP_S = 0.05, 0.5

# Refused before anything ran, and over once the map settles: always worth another try.
TRANSIENT_REFUSALS = ("CLUSTERDOWN", FENCED, "TRYAGAIN not serving yet:", "MOVED")


def retriable(error: BaseException, idempotent: bool) -> bool:
    """Another try cannot hurt: the operation was refused before it ran, or running it twice has
    the effect of running it once (GET; SET of one value) and its outcome is merely unknown
    (any -TRYAGAIN, a timeout, a node that dropped the connection)."""
    if isinstance(error, KVError):
        text = str(error).removeprefix("ERR ")
        return text.startswith(TRANSIENT_REFUSALS) or (idempotent and text.startswith("TRYAGAIN"))
    return idempotent and isinstance(error, (OSError, TimeoutError))


async def retrying(call: Callable[[], Awaitable], idempotent: bool, within_s: float = 10.0,
                   backoff: Backoff | None = None, clock: Clock | None = None):
    """`await call()` again on retriable errors for up to `within_s` (a failover or a replica that
    has just joined answers -TRYAGAIN for about a heartbeat), then the last error. Waits between
    tries are core.retry's capped exponential backoff with full jitter (0.05 s doubling to 0.5 s)."""
    return await retry_async(call, retriable=lambda e: retriable(e, idempotent), deadline_s=within_s,
                             backoff=backoff or Backoff(RETRY_INITIAL_S, RETRY_CAP_S), clock=clock)
