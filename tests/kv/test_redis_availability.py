"""-CLUSTERDOWN versus -TRYAGAIN (issue 14, item 4): which error says what about a write.

CLUSTERDOWN: the node could not reach the shard's node at all (its link gave up connecting),
so the request was never sent and certainly did not happen. TRYAGAIN: the request may have
reached the shard (a replica down the chain, a write timeout): the outcome is unknown.
"""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.client.smart import certainly_not_applied
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


async def _error(conn: RespConnection, *command: bytes) -> str:
    try:
        answer = await conn.call(*command)
    except hiredis.ReplyError as e:
        return str(e)
    raise AssertionError(f"{command} answered {answer!r}, not an error")


def test_an_unreachable_head_is_clusterdown_and_a_missing_tail_is_tryagain(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        head, middle, tail = smap.shards[0]
        options = ControletOptions(write_timeout=1.0)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path), options=options) as cluster:
            at_tail = await RespConnection.connect(smap.nodes[tail].host, smap.nodes[tail].port)
            at_head = await RespConnection.connect(smap.nodes[head].host, smap.nodes[head].port)
            assert await at_tail.call(b"SET", b"k", b"v") == b"OK"
            await cluster.kill(tail)  # the chain cannot complete: the head times out, outcome unknown
            error = await asyncio.wait_for(_error(at_head, b"SET", b"k", b"w"), 10)
            assert error.startswith("TRYAGAIN") and not certainly_not_applied(error)  # may have been applied
            await cluster.kill(head)  # now the write point itself is gone
            at_middle = await RespConnection.connect(smap.nodes[middle].host, smap.nodes[middle].port)
            error = await asyncio.wait_for(_error(at_middle, b"LPUSH", b"l", b"x"), 10)
            assert error.startswith("CLUSTERDOWN")  # never sent; the smart client still records it as info
            assert cluster.nodes[middle].datalet.get(b"l") is None
            for c in (at_tail, at_head, at_middle):
                await c.close()

    asyncio.run(asyncio.wait_for(body(), 60))
