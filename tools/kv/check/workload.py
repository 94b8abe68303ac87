"""The checker's workload: C clients, each one operation at a time, every value unique.

With failover, clients follow the shard map (mapfollow.FollowingClient).
Operations mix reads, writes and deletes of K register keys with writes of fresh
write-once keys (`u<n>`), whose loss is visible without any ordering argument. Each client
is a SmartClient with its own connections, a per-operation timeout and the shared History.
After an `info` outcome (the operation may still take effect) the client continues as a
new process, as in Jepsen, so every process's operations stay sequential.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from mlsyskit.core.clock import Clock
from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.mapfollow import FollowingClient, MapSource
from mlsyskit.tools.kv.client.smart import KVError, SmartClient
from mlsyskit.tools.kv.shardmap import ShardMap


@dataclass(frozen=True)
class Mix:
    read: float = 0.45
    write: float = 0.35
    delete: float = 0.05
    write_once: float = 0.15

    def pick(self, rng: random.Random) -> str:
        r = rng.random() * (self.read + self.write + self.delete + self.write_once)
        for name, share in (("get", self.read), ("put", self.write), ("del", self.delete)):
            if r < share:
                return name
            r -= share
        return "put-once"


def register_key(i: int) -> bytes:
    return b"k%d" % i


def once_key(n: int) -> bytes:
    return b"u%d" % n


def is_write_once(key: str) -> bool:
    return key.startswith("u")


class Workload:
    def __init__(self, smap: ShardMap, history: History, clock: Clock, *, ops: int, clients: int, keys: int,
                 seed: int, timeout: float, mix: Mix | None = None,
                 on_progress: Callable[[int], None] = lambda _: None, fetch_map: MapSource | None = None) -> None:
        self.smap, self.history, self.clock = smap, history, clock
        self.ops, self.clients, self.keys, self.seed, self.timeout = ops, clients, keys, seed, timeout
        self.mix = mix or Mix()
        self.on_progress = on_progress
        self.fetch_map = fetch_map  # with failover: where clients fetch a newer shard map
        self.issued = 0
        self.next_value = 0
        self.once_keys: list[bytes] = []
        self.outcomes = {"ok": 0, "fail": 0, "info": 0}

    def register_keys(self) -> list[bytes]:
        return [register_key(i) for i in range(self.keys)]

    async def run(self, keep_going: Callable[[], bool] = lambda: False) -> None:
        """Until `ops` operations were issued and `keep_going()` is false (the nemesis is not done)."""
        await asyncio.gather(*(self._client(c, keep_going) for c in range(self.clients)))

    async def _client(self, c: int, keep_going: Callable[[], bool]) -> None:
        rng = random.Random(self.seed * 1_000_003 + c)
        kwargs = {"seed": rng.randrange(2**32), "history": self.history, "process": c, "timeout": self.timeout}
        client = (SmartClient(self.smap, **kwargs) if self.fetch_map is None
                  else FollowingClient(self.smap, self.fetch_map, **kwargs))
        try:
            while self.issued < self.ops or keep_going():
                self.issued += 1
                self.on_progress(self.issued)
                try:
                    await self._one(client, rng)
                    self.outcomes["ok"] += 1
                except (KVError, OSError, TimeoutError):
                    kind = self._last_outcome(client.process)
                    self.outcomes[kind] += 1
                    if kind == "info":
                        client.process += self.clients  # the old process may still be in flight
                    await self.clock.asleep(0.02)  # a down node fails fast: do not spin on it
        finally:
            await client.close()

    def _last_outcome(self, process: int) -> str:
        for e in reversed(self.history.events):
            if e.process == process and e.type != "invoke":
                return e.type
        return "fail"

    async def _one(self, client: SmartClient, rng: random.Random) -> None:
        f = self.mix.pick(rng)
        if f == "put-once":
            key = once_key(len(self.once_keys))
            self.once_keys.append(key)
            await client.put(key, self._value())
            return
        key = register_key(rng.randrange(self.keys))
        if f == "get":
            await client.get(key)
        elif f == "put":
            await client.put(key, self._value())
        else:
            await client.delete(key)

    def _value(self) -> bytes:
        self.next_value += 1
        return b"v%d" % self.next_value
