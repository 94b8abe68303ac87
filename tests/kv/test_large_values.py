"""Issue 22's large-value catch-up, in one process: `bespokv up --shards 1 --replicas 3`, 300 x
`SET mv$i <70,000 bytes>`, kill -9 s0r2; its replacement used to stay "copying: 0 keys" forever
because one snapshot message of 256 such pairs (18 MB) was over every receiver's 16 MiB request
limit. Snapshots now go in chunks of bytes and a value larger than a chunk in parts
(node/snapshot.py, controlets/streamparts.py), so the replacement catches up, a value bigger than
one chunk included."""
from __future__ import annotations

import asyncio

import pytest

from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.controlets.streamparts import CHUNK_BYTES
from mlsyskit.tools.kv.coord.failover import plan_failover, plan_join
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map

pytestmark = pytest.mark.slow


async def wait_until(cond, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("controlet", ["ms-sc", "aa-sc"])
def test_a_replacement_catches_up_300_values_of_70kb_and_one_larger_than_a_chunk(controlet: str, tmp_path) -> None:
    values = {b"mv%d" % i: (b"%06d" % i) * (70_000 // 6) + b"ab" * 2 for i in range(300)}  # 70,000 bytes
    big = bytes(range(256)) * ((CHUNK_BYTES + CHUNK_BYTES // 2) // 256) + b"tail"  # 1.5 chunks: in parts
    values[b"big"] = big
    assert all(len(v) == 70_000 for k, v in values.items() if k != b"big") and len(big) > CHUNK_BYTES

    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for k, v in values.items():
                await client.put(k, v)
            await client.close()
            await cluster.kill("s0r2")
            shrunk = plan_failover(smap, ["s0r2"])
            for nid in ("s0r0", "s0r1"):
                cluster.nodes[nid].reconfigure(shrunk)
            await wait_until(lambda: all(cluster.nodes[n].ready for n in ("s0r0", "s0r1")))
            # the replacement comes back empty under the same id, joins, and copies a snapshot
            grown = plan_join(shrunk, 0, smap.nodes["s0r2"])
            cluster.map = grown
            fresh = cluster.nodes["s0r2"] = cluster._make("s0r2")
            await start_node(fresh, catch_up=True)
            for nid in grown.nodes:
                cluster.nodes[nid].reconfigure(grown)
            await wait_until(lambda: fresh.ready and fresh.datalet.size() == len(values))
            assert dict(fresh.datalet.data) == {k: cluster.nodes["s0r0"].datalet.data[k] for k in values}
            info = fresh.info()
            assert int(info["sync_bytes"]) >= sum(map(len, values.values()))
            after = SmartClient(grown)
            await after.put(b"new", b"1")
            assert await after.get(b"big") == big and await after.get(b"mv299") == values[b"mv299"]
            await after.close()

    asyncio.run(asyncio.wait_for(body(), 120))
