"""Sizes like Redis on a real 1 x 3 ms-sc cluster (issue 22, item 1), the issue's repros:
six `RPUSH L2 <3 MiB>` (the 6th used to stop the shard: TRYAGAIN for ever, the head ahead of
the middle and tail), APPEND growing a string past the value limit, and a 100 MiB SET (a broken
pipe before; now an error on a connection that stays usable). CONFIG GET tells the limits."""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from mlsyskit.tools.kv.redis.resp import Limits
from tests.kv.conftest import make_map

pytestmark = pytest.mark.slow  # starts in-process clusters on loopback sockets

MIB = 1 << 20


async def _answer(conn: RespConnection, *command: bytes):
    try:
        return await conn.call(*command)
    except hiredis.ReplyError as e:
        return e


async def _converged(cluster: LocalCluster, timeout: float = 15.0) -> list:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        digests = []
        for n in cluster.map.shards[0]:
            c = await RespConnection.connect(cluster.map.nodes[n].host, cluster.map.nodes[n].port)
            digests.append(tuple(await c.call(b"BKV.DIGEST")))
            await c.close()
        if len(set(digests)) == 1:
            return digests
        assert asyncio.get_running_loop().time() < deadline, digests
        await asyncio.sleep(0.1)


async def _head(cluster: LocalCluster) -> RespConnection:
    addr = cluster.map.nodes[cluster.map.shards[0][0]]
    return await RespConnection.connect(addr.host, addr.port)


def test_six_3mib_pushes_a_100mib_set_and_config_get_with_the_default_limits() -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, lambda n: node_datalet("memory", n)) as cluster:
            conn = await _head(cluster)
            for i in range(6):
                assert await conn.call(b"RPUSH", b"L2", bytes([65 + i]) * (3 * MIB)) == i + 1
            assert await conn.call(b"SET", b"after", b"1") == b"OK"  # the shard still writes
            assert await conn.call(b"LLEN", b"L2") == 6
            assert await conn.call(b"LINDEX", b"L2", b"5") == b"F" * (3 * MIB)
            digests = await _converged(cluster)
            assert int(digests[0][0]) == 2
            big = await _answer(conn, b"SET", b"big", b"x" * (100 * MIB))
            assert isinstance(big, hiredis.ReplyError) and "value too large" in str(big), big
            assert await conn.call(b"GET", b"big") is None and await conn.call(b"PING") == b"PONG"
            limits = Limits()
            config = await conn.call(b"CONFIG", b"GET", b"*")
            config = dict(zip(config[0::2], config[1::2], strict=True))
            assert config[b"proto-max-bulk-len"] == b"%d" % limits.max_value_bytes == b"%d" % (64 * MIB)
            assert config[b"client-query-buffer-limit"] == b"%d" % limits.max_request_bytes
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_growth_past_the_value_limit_is_one_error_and_changes_nothing_anywhere() -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        limits = Limits(max_value_bytes=MIB, max_request_bytes=4 * MIB)
        async with LocalCluster(smap, lambda n: node_datalet("memory", n), limits) as cluster:
            conn = await _head(cluster)
            chunk = b"a" * (300 * 1024)
            for i in range(3):
                assert await conn.call(b"APPEND", b"s", chunk) == (i + 1) * len(chunk)
            over = await _answer(conn, b"APPEND", b"s", chunk)
            assert isinstance(over, hiredis.ReplyError) and "exceeds maximum allowed size" in str(over)
            for i in range(3):
                assert await conn.call(b"RPUSH", b"l", chunk) == i + 1
            over = await _answer(conn, b"RPUSH", b"l", chunk)
            assert isinstance(over, hiredis.ReplyError) and "would exceed the maximum size" in str(over)
            too_big = await _answer(conn, b"SET", b"x", b"b" * (MIB + 1))
            assert isinstance(too_big, hiredis.ReplyError) and "value too large" in str(too_big)
            assert await conn.call(b"STRLEN", b"s") == 3 * len(chunk)
            assert await conn.call(b"LLEN", b"l") == 3
            assert await conn.call(b"SET", b"after", b"1") == b"OK"
            digests = await _converged(cluster)
            assert int(digests[0][0]) == 3
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 120))
