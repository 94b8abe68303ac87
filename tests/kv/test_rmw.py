"""Read-modify-write commands, resolved where each shard orders its writes (issue 14, item 5)."""
from __future__ import annotations

import asyncio

import pytest
import redis

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from mlsyskit.tools.kv.redis import rmw
from tests.kv.conftest import ThreadedCluster, datalet_factory, make_map


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_rmw_semantics_are_redis_semantics() -> None:
    assert rmw.apply([b"INCR", b"k"], None) == (b"1", b":1\r\n")
    assert rmw.apply([b"DECRBY", b"k", b"5"], b"3") == (b"-2", b":-2\r\n")
    assert rmw.apply([b"INCR", b"k"], b"abc") == (b"abc", rmw.NOT_AN_INTEGER)
    assert rmw.apply([b"INCRBY", b"k", b"1"], b"%d" % (2 ** 63 - 1))[1].startswith(b"-ERR increment")
    assert rmw.apply([b"SETNX", b"k", b"v"], b"old") == (b"old", b":0\r\n")
    assert rmw.apply([b"SET", b"k", b"v", b"NX"], None) == (b"v", b"+OK\r\n")
    assert rmw.apply([b"SET", b"k", b"v", b"XX"], None) == (None, b"$-1\r\n")
    assert rmw.apply([b"SET", b"k", b"v", b"GET"], b"old") == (b"v", b"$3\r\nold\r\n")
    for bad in ([b"SET", b"k", b"v", b"NX", b"XX"], [b"SET", b"k", b"v", b"EX", b"0"], [b"SET", b"k", b"v", b"PX", b"x"], [b"INCRBY", b"k", b"x"],
                [b"INCR"], [b"SET", b"k", b"v", b"FOO"]):
        with pytest.raises(rmw.RmwSyntaxError):
            rmw.parse(bad)


@pytest.mark.slow
@pytest.mark.parametrize("controlet", ["ms-sc", "ms-ec", "aa-sc"])
def test_concurrent_increments_through_any_node_are_never_lost(controlet: str, tmp_path) -> None:
    async def body() -> None:
        smap = make_map(controlet, shards=2, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            nodes = list(smap.nodes)
            conns = [await RespConnection.connect(smap.nodes[n].host, smap.nodes[n].port) for n in nodes]

            async def worker(i: int) -> list:
                conn = conns[i % len(conns)]
                return [await conn.call(b"INCR", b"counter") for _ in range(40)]

            results = await asyncio.gather(*(worker(i) for i in range(6)))
            seen = sorted(v for r in results for v in r)
            assert seen == list(range(1, 241))  # every increment got its own number: none lost or doubled
            shard = smap.shard_for(b"counter")

            async def replicas_agree() -> bool:
                return all(cluster.nodes[n].datalet.get(b"counter") == b"240" for n in smap.shards[shard])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not await replicas_agree():
                assert loop.time() < deadline, "replicas did not converge on the counter"
                await asyncio.sleep(0.01)
            for c in conns:
                await c.close()

    run(body())


@pytest.mark.slow
def test_set_options_and_setnx_through_redis_py(tmp_path) -> None:
    smap = make_map("ms-sc", shards=2, replicas=3)
    with ThreadedCluster(LocalCluster(smap, datalet_factory("memory", tmp_path))) as tc:
        a = tc.cluster.map.nodes["s1r1"]
        r = redis.Redis(a.host, a.port)
        assert r.set("a", "1", nx=True) is True
        assert r.set("a", "2", nx=True) is None and r.get("a") == b"1"
        assert r.set("b", "1", xx=True) is None and r.get("b") is None
        assert r.set("a", "3", get=True) == b"1" and r.get("a") == b"3"
        assert r.setnx("c", "x") is True and r.setnx("c", "y") is False
        assert r.incrby("n", 10) == 10 and r.decr("n") == 9 and r.decrby("n", 4) == 5
        with pytest.raises(redis.ResponseError, match="not an integer"):
            r.incr("c")
        assert r.set("a", "1", ex=10) is True and 9 <= r.ttl("a") <= 10  # through a node that forwards
        assert r.expire("a", 20) is True and 19 <= r.ttl("a") <= 20
        with pytest.raises(redis.ResponseError, match="invalid expire time"):
            r.set("a", "1", ex=0)
        r.close()


@pytest.mark.slow
def test_active_active_eventual_refuses_read_modify_write(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("aa-ec", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)):
            a = smap.nodes["s0r1"]
            conn = await RespConnection.connect(a.host, a.port)
            with pytest.raises(Exception, match="not supported by aa-ec"):
                await conn.call(b"INCR", b"k")
            assert await conn.call(b"GET", b"k") is None
            await conn.close()

    run(body())
