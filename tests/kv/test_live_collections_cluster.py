"""A big set, hash and APPENDed string on a real 1 x 3 ms-sc cluster (issue 22 item 1): written as
deltas that every replica applies to its live value (redis/livemap.py, livestring.py), they converge
byte for byte; a replacement of a killed replica copies them (the snapshot's bytes, turned live by
its memory datalet on the next write) and takes the writes after it."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.coord.failover import plan_failover, plan_join
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.livestring import LiveString
from tests.kv.conftest import datalet_factory, make_map
from tests.kv.test_large_values import wait_until
from tests.kv.test_limits_cluster import _converged

pytestmark = pytest.mark.slow  # starts an in-process cluster on loopback sockets

MEMBERS = 6000  # 100-byte members, 100 per command


async def _grow(conn: RespConnection, start: int, stop: int) -> None:
    calls = []
    for at in range(start, stop, 100):
        items = [b"%0100d" % i for i in range(at, min(at + 100, stop))]
        calls.append(conn.call(b"SADD", b"S", *items))
        calls.append(conn.call(b"HSET", b"H", *[x for m in items for x in (m[-12:], m)]))
        calls.append(conn.call(b"APPEND", b"A", b"".join(m[-8:] for m in items)))
    answers = await asyncio.gather(*calls)
    assert answers[0::3] == [min(100, stop - at) for at in range(start, stop, 100)]
    assert answers[1::3] == answers[0::3]


def test_a_big_set_and_hash_replicate_as_deltas_and_a_replacement_catches_up(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            head_addr = smap.nodes["s0r0"]
            conn = await RespConnection.connect(head_addr.host, head_addr.port)
            await _grow(conn, 0, MEMBERS)
            await _converged(cluster)
            for nid in smap.shards[0]:  # every replica applied the commands to a live value
                data = cluster.nodes[nid].datalet.data
                assert type(data[b"S"]) is LiveMap and type(data[b"H"]) is LiveMap and type(data[b"A"]) is LiveString
            await cluster.kill("s0r2")
            shrunk = plan_failover(smap, ["s0r2"])
            for nid in ("s0r0", "s0r1"):
                cluster.nodes[nid].reconfigure(shrunk)
            await wait_until(lambda: all(cluster.nodes[n].ready for n in ("s0r0", "s0r1")))
            await _grow(conn, MEMBERS, MEMBERS + 500)  # while s0r2 is gone
            grown = plan_join(shrunk, 0, smap.nodes["s0r2"])
            cluster.map = grown
            fresh = cluster.nodes["s0r2"] = cluster._make("s0r2")
            await start_node(fresh, catch_up=True)
            for nid in grown.nodes:
                cluster.nodes[nid].reconfigure(grown)
            await wait_until(lambda: fresh.ready and fresh.datalet.size() == 3)
            await _grow(conn, MEMBERS + 500, MEMBERS + 1000)  # after it: deltas on the copied values
            await _converged(cluster)
            assert await conn.call(b"SCARD", b"S") == MEMBERS + 1000
            assert await conn.call(b"HLEN", b"H") == MEMBERS + 1000
            assert await conn.call(b"STRLEN", b"A") == 8 * (MEMBERS + 1000)
            for key in (b"S", b"H", b"A"):
                assert fresh.datalet.get(key) == cluster.nodes["s0r0"].datalet.get(key)
            assert type(fresh.datalet.data[b"S"]) is LiveMap
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 120))


EVERYDAY_WRITES = [  # (command, its answer): the writes added for everyday applications, each key's kind fixed
    ([b"HSET", b"H", b"f", b"0.1", b"g", b"x"], 2), ([b"HINCRBYFLOAT", b"H", b"f", b"0.2"], b"0.3"),
    ([b"HINCRBYFLOAT", b"H", b"g", b"1"], "hash value is not a float"), ([b"HINCRBYFLOAT", b"H", b"n", b"1e3"], b"1000"),
    ([b"SET", b"F", b"10.5"], b"OK"), ([b"INCRBYFLOAT", b"F", b"0.1"], b"10.6"), ([b"GETEX", b"F", b"EX", b"1000"], b"10.6"),
    ([b"GETSET", b"G", b"v"], None), ([b"SETRANGE", b"G", b"3", b"xy"], 5), ([b"SETBIT", b"G", b"7", b"1"], 0),
    ([b"ZADD", b"Z", *[x for i in range(20) for x in (b"%d" % (i % 4), b"m%02d" % i)]], 20),
    ([b"ZREMRANGEBYSCORE", b"Z", b"(0", b"1"], 5), ([b"ZREMRANGEBYRANK", b"Z", b"0", b"1"], 2),
    ([b"ZADD", b"L", *[x for m in (b"a", b"b", b"c", b"d") for x in (b"0", m)]], 4),
    ([b"ZREMRANGEBYLEX", b"L", b"[b", b"(d"], 2), ([b"UNLINK", b"G", b"nothing"], 1),
]


@pytest.mark.parametrize("controlet", ["ms-sc", "ms-ec", "aa-sc"])
def test_the_everyday_writes_leave_every_replica_the_same_bytes(controlet: str, tmp_path) -> None:
    """GETEX, SETRANGE, INCRBYFLOAT, HINCRBYFLOAT (replicated as HSET of its result), ZREMRANGEBY* (as
    commands) ... sent pipelined through every node: the answers are Redis's and the replicas converge
    on one digest, the float fields holding the write point's own digits."""
    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            conns = [await RespConnection.connect(a.host, a.port) for a in smap.nodes.values()]
            for round_ in range(3):  # through a different node each round: forwarded and local
                conn = conns[round_]
                answers = await asyncio.gather(*(conn.call(*c) for c, _ in EVERYDAY_WRITES), return_exceptions=True)
                for (command, want), got in zip(EVERYDAY_WRITES, answers, strict=True):
                    if round_ == 0:
                        assert (want in str(got)) if isinstance(want, str) else got == want, (command, got)
                await _converged(cluster)
            assert await conns[1].call(b"HGET", b"H", b"f") == b"0.3"  # 0.1 + 0.2 in long double, as Redis
            assert await conns[2].call(b"GET", b"F") == b"10.6" and await conns[0].call(b"TTL", b"F") > 990
            for nid in smap.shards[0]:
                data = cluster.nodes[nid].datalet.data
                assert type(data[b"H"]) is LiveMap and data[b"H"].get(b"n") == b"3000", nid
            for c in conns:
                await c.close()

    asyncio.run(asyncio.wait_for(body(), 120))
