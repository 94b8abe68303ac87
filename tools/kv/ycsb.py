"""A YCSB-style closed-loop load generator over RESP (for bespokv and, as the peer, Redis).

Workloads (Cooper et al., SoCC'10): A = 50% read / 50% update, B = 95/5, C = read only,
F = 50% read / 50% read-modify-write. Keys are drawn from a Zipfian distribution
(theta = --zipf) over N keys, with ranks scrambled by a seeded permutation so hot keys
spread over shards, as YCSB's ScrambledZipfian does. Each of C clients keeps one operation
outstanding; latency is measured per operation, throughput over the whole run phase.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import require
from mlsyskit.tools.kv.client import SmartClient
from mlsyskit.tools.kv.pipeline import RespConnection
from mlsyskit.tools.kv.shardmap import ShardMap

READ, UPDATE, RMW = 0, 1, 2
WORKLOADS: dict[str, tuple[float, float, float]] = {  # read, update, read-modify-write
    "ycsb-a": (0.5, 0.5, 0.0), "ycsb-b": (0.95, 0.05, 0.0), "ycsb-c": (1.0, 0.0, 0.0), "ycsb-f": (0.5, 0.0, 0.5),
}


@dataclass(frozen=True)
class Workload:
    name: str = "ycsb-a"
    keys: int = 10_000
    ops: int = 20_000
    zipf: float = 0.99
    value_size: int = 32
    clients: int = 16
    seed: int = 0
    load: bool = True

    def __post_init__(self) -> None:
        require(self.name in WORKLOADS, f"unknown workload {self.name!r}; choose from {sorted(WORKLOADS)}")
        require(self.keys >= 1 and self.ops >= 1, "--keys and --ops must be positive")
        require(0 <= self.zipf < 10, "--zipf must be in [0, 10)")
        require(1 <= self.value_size <= 1 << 20, "--value-size must be 1 B .. 1 MiB")
        require(1 <= self.clients <= 4096, "--clients must be 1..4096")


def zipf_ranks(n: int, theta: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` ranks in [0, n) with P(rank i) proportional to 1/(i+1)^theta (theta 0: uniform)."""
    weights = 1.0 / np.power(np.arange(1, n + 1, dtype=np.float64), theta)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(count)), n - 1)


def key_name(i: int) -> bytes:
    return b"user%010d" % i


def plan_ops(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """(op kinds, key indices) for the run phase, deterministic in the seed."""
    rng = np.random.default_rng(w.seed)
    scramble = rng.permutation(w.keys)
    keys = scramble[zipf_ranks(w.keys, w.zipf, w.ops, rng)]
    read, update, _ = WORKLOADS[w.name]
    u = rng.random(w.ops)
    kinds = np.where(u < read, READ, np.where(u < read + update, UPDATE, RMW))
    return kinds.astype(np.int8), keys


class Target:
    """Where a client sends operations: bespokv through a smart client, or Redis servers."""

    async def get(self, key: bytes) -> Any: ...
    async def put(self, key: bytes, value: bytes) -> Any: ...
    async def close(self) -> None: ...


class BespokvTarget(Target):
    def __init__(self, client: SmartClient) -> None:
        self.client = client
        self.get, self.put = client.get, client.put  # type: ignore[method-assign]

    async def close(self) -> None:
        await self.client.close()


class RedisTarget(Target):
    """Plain Redis: writes to the primary (then WAIT for `wait` replicas if asked). Reads go to the
    primary alone (`spread_reads=False`: the strong setting, as ms-sc reads at its tail) or spread
    over primary and replicas (as ms-ec's smart client spreads them)."""

    def __init__(self, conns: list[RespConnection], wait: int, rng: random.Random, spread_reads: bool) -> None:
        self.conns, self.wait, self.rng = conns, wait, rng
        self.readers = conns if spread_reads else conns[:1]

    async def get(self, key: bytes) -> Any:
        readers = self.readers  # the same seeded choice the smart client makes among read targets
        conn = readers[self.rng.randrange(len(readers))] if len(readers) > 1 else readers[0]
        return await conn.call(b"GET", key)

    async def put(self, key: bytes, value: bytes) -> Any:
        primary = self.conns[0]
        if not self.wait:
            return await primary.call(b"SET", key, value)
        done = primary.call(b"SET", key, value)
        acked = await primary.call(b"WAIT", self.wait, 0)
        await done
        return acked

    async def close(self) -> None:
        for c in self.conns:
            await c.close()


async def bespokv_target(shard_map: ShardMap, seed: int) -> Target:
    return BespokvTarget(SmartClient(shard_map, seed=seed))


def redis_target_factory(endpoints: list[tuple[str, int]], wait: int,
                         spread_reads: bool = True) -> Callable[[int], Any]:
    async def make(seed: int) -> Target:
        conns = [await RespConnection.connect(h, p) for h, p in endpoints]
        return RedisTarget(conns, wait, random.Random(seed), spread_reads)
    return make


async def run_workload(w: Workload, make_target: Callable[[int], Any], clock: Clock | None = None,
                       on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    clock = clock or RealClock()
    kinds, keys = plan_ops(w)
    value = (b"v" * w.value_size)
    targets = [await make_target(w.seed * 1000 + c) for c in range(w.clients)]
    try:
        if w.load:
            await _run_clients(targets, w.keys, lambda t, i: t.put(key_name(i), value))
        latencies = np.zeros(w.ops, dtype=np.float64)
        errors = [0]
        next_op = [0]
        now = clock.now

        async def one_client(t: Target) -> None:
            while True:
                i = next_op[0]
                if i >= w.ops:
                    return
                next_op[0] = i + 1
                key = key_name(int(keys[i]))
                start = now()
                try:
                    kind = kinds[i]
                    if kind == READ:
                        await t.get(key)
                    elif kind == UPDATE:
                        await t.put(key, value)
                    else:
                        await t.get(key)
                        await t.put(key, value)
                except (OSError, ConnectionError, RuntimeError):
                    errors[0] += 1
                latencies[i] = now() - start
                if on_progress is not None and (i & 1023) == 0:
                    on_progress(i)

        start = now()
        await asyncio.gather(*(one_client(t) for t in targets))
        elapsed = now() - start
    finally:
        for t in targets:
            await t.close()
    ms = latencies * 1e3
    return {"workload": w.name, "ops": w.ops, "keys": w.keys, "clients": w.clients, "zipf": w.zipf,
            "value_size": w.value_size, "seconds": elapsed, "ops_per_s": w.ops / elapsed if elapsed else 0.0,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "p999_ms": float(np.percentile(ms, 99.9)), "errors": errors[0]}


async def _run_clients(targets: list[Target], n: int, fn: Callable[[Target, int], Any]) -> None:
    cursor = [0]

    async def worker(t: Target) -> None:
        while cursor[0] < n:
            i = cursor[0]
            cursor[0] += 1
            await fn(t, i)

    await asyncio.gather(*(worker(t) for t in targets))
