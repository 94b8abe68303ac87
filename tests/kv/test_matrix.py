"""Every controlet with every datalet on a 2-shard x 3-replica cluster on loopback.

Each case: puts, gets, overwrites, deletes and missing keys through the smart client, the
multi-key commands through a node that owns none of the keys' roles (proxy mode), and
replica agreement. Strong controlets must show an acknowledged write at every replica at
once; eventual ones must converge.
"""
from __future__ import annotations

import asyncio
import itertools

import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes

CONTROLETS = ["ms-sc", "ms-ec", "aa-sc", "aa-ec"]
DATALETS = ["memory", "lmdb", "redis"]
CASES = list(itertools.product(CONTROLETS, DATALETS))


async def read_at(conn: RespConnection, key: bytes):
    return await conn.call(b"GET", key)


async def eventually_equal(conns: list[RespConnection], key: bytes, expected, timeout: float = 10.0) -> None:
    """Poll every replica until it returns `expected` (a condition wait, not a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = [await read_at(c, key) for c in conns]
        if all(g == expected for g in got):
            return
        if loop.time() > deadline:
            raise AssertionError(f"{key!r}: replicas hold {got}, expected {expected!r}")
        await asyncio.sleep(0.005)


async def exercise(controlet: str, datalet: str, tmp_path, redis_port) -> None:
    smap = make_map(controlet, datalet)
    case = CASES.index((controlet, datalet))
    cluster = LocalCluster(smap, datalet_factory(datalet, tmp_path, redis_port, db_base=6 * (case % 10)))
    if datalet == "redis":
        for node in cluster.nodes.values():
            await node.datalet.open()
            await node.datalet.flush()
            await node.datalet.close()
    strong = controlet.endswith("sc")
    async with cluster:
        client = SmartClient(smap, seed=case)
        replica_conns = {n: await RespConnection.connect(a.host, a.port) for n, a in smap.nodes.items()}
        try:
            keys = [b"key-%d" % i for i in range(30)]
            for k in keys:
                await client.put(k, b"v1-" + k)
            for k in keys[:10]:
                await client.put(k, b"v2-" + k)  # overwrite
            assert len({smap.shard_for(k) for k in keys}) == 2, "keys should span both shards"

            for k in keys:
                expected = (b"v2-" if k in keys[:10] else b"v1-") + k
                shard = smap.shards[smap.shard_for(k)]
                conns = [replica_conns[n] for n in shard]
                if strong:  # linearizable: every replica answers with the acknowledged value now
                    assert [await read_at(c, k) for c in conns] == [expected] * 3, (controlet, k)
                else:
                    await eventually_equal(conns, k, expected)
                assert await client.get(k) == expected

            # Deletes answer whether the key existed (on eventual controlets, once the put has spread:
            # a delete at a replica the put has not reached yet would truthfully answer 0).
            assert await client.delete(keys[29]) is True
            await eventually_equal(list(replica_conns.values()), keys[29], None)
            assert await client.delete(keys[29]) is False
            assert await client.delete(b"never-written") is False
            await eventually_equal(list(replica_conns.values()), keys[29], None)
            assert await client.get(b"missing-key") is None
            assert await client.exists(keys[0]) is True and await client.exists(b"missing-key") is False

            # Multi-key commands through one node: it forwards what it does not own (proxy mode).
            proxy = replica_conns["s0r1"]
            assert await proxy.call(b"MSET", b"ma", b"1", b"mb", b"2", b"mc", b"3") == b"OK"
            if not strong:
                for key, value in ((b"ma", b"1"), (b"mb", b"2"), (b"mc", b"3")):
                    await eventually_equal(list(replica_conns.values()), key, value)
            assert await proxy.call(b"MGET", b"ma", b"mb", b"mc", b"nope") == [b"1", b"2", b"3", None]
            assert await proxy.call(b"EXISTS", b"ma", b"mb", b"nope") == 2
            assert await proxy.call(b"DEL", b"ma", b"mb", b"nope") == 2
            for key in (b"ma", b"mb"):
                await eventually_equal(list(replica_conns.values()), key, None)

            # Every replica of a shard ends with the same data.
            for shard in smap.shards:
                dumps = []
                for n in shard:
                    dumps.append(sorted([p async for p in cluster.nodes[n].datalet.export_pairs()]))
                assert dumps[0] == dumps[1] == dumps[2]
                assert len(dumps[0]) >= 5
        finally:
            await client.close()
            for c in replica_conns.values():
                await c.close()


@pytest.mark.parametrize(("controlet", "datalet"), CASES, ids=[f"{c}-{d}" for c, d in CASES])
def test_controlet_datalet_matrix(controlet: str, datalet: str, tmp_path, request) -> None:
    redis_port = request.getfixturevalue("redis_port") if datalet == "redis" else None
    asyncio.run(asyncio.wait_for(exercise(controlet, datalet, tmp_path, redis_port), 60))
