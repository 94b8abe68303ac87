"""bespokv fixtures: a shared redis-server, and in-process clusters on free loopback ports."""
from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlsyskit.tools.kv import peerauth
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.ops import processes
from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from mlsyskit.tools.kv.redis.resp import Limits
from mlsyskit.tools.kv.shardmap import ShardMap, layout
from tests.conftest import ProcManager, free_port, wait_for_port

REDIS_HINT = "needs redis-server and redis-cli: apt-get install -y redis-server redis-tools"


def needs_redis() -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip(REDIS_HINT)


@pytest.fixture(scope="session")
def redis_port() -> Iterator[int]:
    """One redis-server for the session; tests use distinct database numbers on it."""
    needs_redis()
    manager = ProcManager()
    port = free_port()
    proc = manager.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--databases", "64"])
    try:
        wait_for_port(port, proc=proc)
        yield port
    finally:
        manager.stop_all()


def down_if_recorded(data_dir: Path | str) -> None:
    """A test's cleanup: stop the cluster recorded under data_dir, if any, as `bespokv down` does
    (processes.down, in this process: a CLI process costs ~0.6 s CPU; tests of `down` itself run the CLI)."""
    if (Path(data_dir) / "cluster.json").exists():
        processes.down(Path(data_dir))


def make_map(controlet: str, datalet: str = "memory", shards: int = 2, replicas: int = 3) -> ShardMap:
    return layout(controlet, datalet, shards, replicas, "127.0.0.1", [free_port() for _ in range(shards * replicas)])


def datalet_factory(name: str, tmp_path: Path, redis_port: int | None = None, db_base: int = 0):
    node_index: dict[str, int] = {}

    def make(node_id: str):
        i = node_index.setdefault(node_id, len(node_index))
        redis = {"host": "127.0.0.1", "port": redis_port, "db": db_base + i} if name == "redis" else None
        return node_datalet(name, node_id, tmp_path, redis)

    return make


async def peer_connection(cluster: LocalCluster, target: str, me: str,
                          secret: bytes | None = None) -> RespConnection:
    """A connection to `target` that authenticated as replica `me` (with the cluster's secret)."""
    addr = cluster.map.nodes[target]
    conn = await RespConnection.connect(addr.host, addr.port)
    nonce = await conn.call(b"BKV.NONCE")
    proof = peerauth.proof(secret or cluster.secret, nonce, me.encode(), target.encode())
    assert await conn.call(b"BKV.AUTH", me, proof) == b"OK"
    return conn


class ThreadedCluster:
    """A LocalCluster running in its own event loop thread, for blocking clients (redis-py, redis-cli)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro, timeout: float = 20.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ThreadedCluster:
        self.thread.start()
        self.call(self.cluster.start())
        return self

    def __exit__(self, *exc) -> None:
        self.call(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def threaded_cluster() -> Iterator[ThreadedCluster]:
    """A 2x3 ms-sc memory cluster with small limits (64 B keys, 1 KiB values, 4 KiB requests)."""
    smap = make_map("ms-sc")
    limits = Limits(max_key_bytes=64, max_value_bytes=1024, max_request_bytes=4096, max_args=16)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n), limits)) as tc:
        yield tc
