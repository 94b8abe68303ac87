"""A write answered with an error leaves no trace on any replica (issue 22, item 2), on real
in-process clusters: the lmdb datalet wrapped to fail writes on command, and the redis datalet
with a replica's redis-server at `maxmemory 1` (the issue's repro: ms-sc, the head's redis out of
memory; five SETs answered OOM were then readable, head 390 keys vs 395). Strong modes: a failure
on the head/sequencer or on the tail fails the write everywhere. Eventual modes: a failure on the
replica that takes the write fails it and nothing is sent (a failure elsewhere cannot fail a write
already acknowledged: tests/kv/test_failed_write_sim.py)."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from tests.conftest import ProcManager, free_port, wait_for_port
from tests.kv.conftest import make_map, needs_redis
from tests.kv.faulty_datalet import FaultyDatalet

pytestmark = pytest.mark.slow  # every test here starts clusters (and redis-servers)

OPTIONS = ControletOptions(write_timeout=2.0, sync_timeout=0.2)
CASES = [("ms-sc", 0), ("ms-sc", 2), ("aa-sc", 0), ("aa-sc", 2), ("ms-ec", 0), ("aa-ec", 0)]


@pytest.fixture(scope="module")
def redis_servers() -> Iterator[list[int]]:
    """Three redis-servers, one per replica (maxmemory is per server)."""
    needs_redis()
    manager = ProcManager()
    ports = [free_port() for _ in range(3)]
    try:
        for port in ports:
            proc = manager.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--maxmemory-policy", "noeviction"])
            wait_for_port(port, proc=proc)
        yield ports
    finally:
        manager.stop_all()


async def _answer(conn: RespConnection, *command: bytes):
    try:
        return await conn.call(*command)
    except hiredis.ReplyError as e:
        return e


async def _digests(cluster: LocalCluster) -> list:
    out = []
    for n in cluster.map.shards[0]:
        conn = await RespConnection.connect(cluster.map.nodes[n].host, cluster.map.nodes[n].port)
        out.append(await conn.call(b"BKV.DIGEST"))
        await conn.close()
    return out


async def _scenario(cluster: LocalCluster, arm, disarm) -> None:
    """20 keys, then 5 SETs while one replica's datalet fails writes: each answered with an error
    that is not TRYAGAIN, none readable, and the replicas' digests equal once it has room again."""
    smap = cluster.map
    entry = smap.nodes[smap.shards[0][0]]
    conn = await RespConnection.connect(entry.host, entry.port)
    for i in range(20):
        assert await conn.call(b"SET", b"k%d" % i, b"v%d" % i) == b"OK"
    await arm()
    for i in range(20, 25):
        answer = await _answer(conn, b"SET", b"k%d" % i, b"v%d" % i)
        assert isinstance(answer, hiredis.ReplyError) and "OOM" in str(answer), answer
        assert not str(answer).startswith("TRYAGAIN"), answer
    await disarm()
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        digests = await _digests(cluster)
        if len(set(map(tuple, digests))) == 1 and int(digests[0][0]) == 20:
            break
        assert asyncio.get_running_loop().time() < deadline, digests
        await asyncio.sleep(0.1)
    for i in range(20, 25):  # never visible, from any replica
        for n in smap.shards[0]:
            c = await RespConnection.connect(smap.nodes[n].host, smap.nodes[n].port)
            assert await _answer(c, b"GET", b"k%d" % i) is None
            await c.close()
    assert await conn.call(b"SET", b"k99", b"after") == b"OK"  # the shard writes again
    await conn.close()


@pytest.mark.parametrize("controlet,bad", CASES)
def test_redis_at_maxmemory_on_one_replica_fails_writes_without_a_trace(redis_servers, controlet, bad) -> None:
    async def body() -> None:
        smap = make_map(controlet, "redis", shards=1, replicas=3)
        ports = dict(zip(smap.shards[0], redis_servers, strict=True))
        admin = [await RespConnection.connect("127.0.0.1", p) for p in redis_servers]
        for a in admin:
            await a.call(b"FLUSHALL")
            await a.call(b"CONFIG", b"SET", b"maxmemory", b"0")

        def factory(node_id: str):
            return node_datalet("redis", node_id, None, {"host": "127.0.0.1", "port": ports[node_id]})

        async def set_maxmemory(value: bytes) -> None:
            await admin[bad].call(b"CONFIG", b"SET", b"maxmemory", value)

        try:
            async with LocalCluster(smap, factory, options=OPTIONS) as cluster:
                await _scenario(cluster, lambda: set_maxmemory(b"1"), lambda: set_maxmemory(b"0"))
        finally:
            await set_maxmemory(b"0")
            for a in admin:
                await a.close()

    asyncio.run(asyncio.wait_for(body(), 90))


@pytest.mark.parametrize("controlet,bad", CASES)
def test_lmdb_failing_writes_on_one_replica_fails_them_without_a_trace(tmp_path, controlet, bad) -> None:
    async def body() -> None:
        smap = make_map(controlet, "lmdb", shards=1, replicas=3)
        failing = {"on": False}
        bad_node = smap.shards[0][bad]

        def factory(node_id: str):
            inner = node_datalet("lmdb", node_id, tmp_path)
            return FaultyDatalet(inner, lambda key: failing["on"] and node_id == bad_node)

        async def switch(on: bool) -> None:
            failing["on"] = on

        async with LocalCluster(smap, factory, options=OPTIONS) as cluster:
            await _scenario(cluster, lambda: switch(True), lambda: switch(False))

    asyncio.run(asyncio.wait_for(body(), 90))
