"""A YCSB-style closed-loop load generator over RESP (for bespokv and, as the peer, Redis).

Workloads (Cooper et al., SoCC'10): A = 50% read / 50% update, B = 95/5, C = read only,
F = 50% read / 50% read-modify-write. Keys are drawn from a Zipfian distribution
(theta = --zipf) over N keys, with ranks scrambled by a seeded permutation so hot keys
spread over shards, as YCSB's ScrambledZipfian does. Each of C clients keeps `window`
operations outstanding (1 by default: closed loop); latency is measured per operation,
throughput over the whole run phase. The engine is `loadgen.py` (reply callbacks, batched sends).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hiredis
import numpy as np

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import require
from mlsyskit.core.telemetry import percentile
from mlsyskit.tools.kv.client import loadgen
from mlsyskit.tools.kv.client.loadgen import READ, RMW, UPDATE, Router
from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.shardmap import ShardMap

__all__ = ["READ", "RMW", "UPDATE", "Workload", "plan_ops", "run_workload"]
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
    window: int = 1  # operations each client keeps outstanding

    def __post_init__(self) -> None:
        require(self.name in WORKLOADS, f"unknown workload {self.name!r}; choose from {sorted(WORKLOADS)}")
        require(self.keys >= 1 and self.ops >= 1, "--keys and --ops must be positive")
        require(0 <= self.zipf < 10, "--zipf must be in [0, 10)")
        require(1 <= self.value_size <= 1 << 20, "--value-size must be 1 B .. 1 MiB")
        require(1 <= self.clients <= 4096, "--clients must be 1..4096")
        require(1 <= self.window <= 1024, "--window must be 1..1024")


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


def set_frame(key: bytes, value: bytes) -> bytes:
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)


def get_frame(key: bytes) -> bytes:
    return b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key)


class BespokvRouter(Router):
    """The smart client's routing (shard map; write target, seeded choice among read targets)."""

    def __init__(self, shard_map: ShardMap, seed: int, password: bytes | None = None) -> None:
        self.client = SmartClient(shard_map, seed=seed)  # its routing only; connections are loadgen's
        self.password = password
        names = list(shard_map.nodes)
        self.index = {n: i for i, n in enumerate(names)}
        self.endpoints = [(shard_map.nodes[n].host, shard_map.nodes[n].port) for n in names]

    def read(self, key: bytes) -> tuple[int, bytes, int]:
        return self.index[self.client.target(key, False)], get_frame(key), 1

    def write(self, key: bytes, value: bytes) -> tuple[int, bytes, int]:
        return self.index[self.client.target(key, True)], set_frame(key, value), 1


class RedisRouter(Router):
    """Plain Redis: writes to the primary, followed by `WAIT wait 0` in the same send when asked
    (the operation completes with WAIT's reply). Reads go to the primary alone
    (`spread_reads=False`: the strong setting, as ms-sc reads at its tail) or to a seeded choice
    among primary and replicas (as ms-ec's smart client spreads them)."""

    def __init__(self, endpoints: list[tuple[str, int]], wait: int, rng: random.Random, spread_reads: bool) -> None:
        self.endpoints, self.rng = endpoints, rng
        self.readers = len(endpoints) if spread_reads else 1
        self.wait_frame = hiredis.pack_command((b"WAIT", wait, 0)) if wait else b""

    def read(self, key: bytes) -> tuple[int, bytes, int]:
        index = self.rng.randrange(self.readers) if self.readers > 1 else 0
        return index, get_frame(key), 1

    def write(self, key: bytes, value: bytes) -> tuple[int, bytes, int]:
        if self.wait_frame:
            return 0, set_frame(key, value) + self.wait_frame, 2
        return 0, set_frame(key, value), 1


async def bespokv_target(shard_map: ShardMap, seed: int, password: bytes | None = None) -> Router:
    return BespokvRouter(shard_map, seed, password)


def redis_target_factory(endpoints: list[tuple[str, int]], wait: int,
                         spread_reads: bool = True) -> Callable[[int], Any]:
    async def make(seed: int) -> Router:
        return RedisRouter(endpoints, wait, random.Random(seed), spread_reads)
    return make


async def run_workload(w: Workload, make_target: Callable[[int], Any], clock: Clock | None = None,
                       on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Load phase (when `w.load`: every key written once, in order), then the measured run."""
    clock = clock or RealClock()
    kinds, keys = plan_ops(w)
    value = b"v" * w.value_size
    clients = []
    try:
        for c in range(w.clients):
            router = await make_target(w.seed * 1000 + c)
            clients.append((router, await loadgen.connect_client(router)))
        if w.load:
            load = loadgen.Run(np.full(w.keys, UPDATE, dtype=np.int8), np.arange(w.keys), value, key_name, clock,
                               None)
            await loadgen.drive(load, clients, w.window)
        run = loadgen.Run(kinds, keys, value, key_name, clock, on_progress)
        elapsed = await loadgen.drive(run, clients, w.window)
    finally:
        loadgen.close_all(clients)
    ms = sorted((run.latencies * 1e3).tolist())  # the suite's one percentile rule: nearest rank
    return {"workload": w.name, "ops": w.ops, "keys": w.keys, "clients": w.clients, "window": w.window,
            "zipf": w.zipf, "value_size": w.value_size, "seconds": elapsed,
            "ops_per_s": w.ops / elapsed if elapsed else 0.0,
            "p50_ms": percentile(ms, 50, presorted=True), "p99_ms": percentile(ms, 99, presorted=True),
            "p999_ms": percentile(ms, 99.9, presorted=True), "errors": run.errors + (load.errors if w.load else 0)}
