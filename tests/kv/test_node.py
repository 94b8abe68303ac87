"""Node runtime details: epoch fencing, lmdb cluster restart, histories, the YCSB generator."""
from __future__ import annotations

import asyncio

import hiredis
import numpy as np
import pytest

from mlsyskit.tools.kv.client import ycsb
from mlsyskit.tools.kv.client.history import History
from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.client.smart import SmartClient
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import datalet_factory, make_map, peer_connection


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.mark.slow
def test_peer_messages_from_another_epoch_are_fenced(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-ec", shards=1, replicas=2)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            conn = await peer_connection(cluster, "s0r1", "s0r0")
            stale = hiredis.pack_command((b"BKV.MSG", 0, b"s0r0", b"REPL", 1, b"P", b"k", b"stale"))
            current = hiredis.pack_command((b"BKV.MSG", smap.epoch, b"s0r0", b"REPL", 1, b"P", b"k", b"fresh"))
            conn.send(stale)
            conn.send(current)
            assert await conn.call(b"GET", b"k") == b"fresh"
            node = cluster.nodes["s0r1"]
            assert node.stats["fenced"] == 1 and node.stats["peer_messages"] == 2
            await conn.close()

    run(body())


@pytest.mark.slow
def test_lmdb_cluster_keeps_data_across_a_restart(tmp_path) -> None:
    smap = make_map("ms-sc", "lmdb", shards=2, replicas=2)

    async def write() -> None:
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path)):
            client = SmartClient(smap)
            for i in range(50):
                await client.put(b"p%d" % i, b"%d" % i)
            await client.delete(b"p7")
            await client.close()

    async def read() -> list:
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path)) as cluster:
            client = SmartClient(smap)
            values = [await client.get(b"p%d" % i) for i in range(50)]
            await client.close()
            sizes = {n: node.datalet.size() for n, node in cluster.nodes.items()}
        assert sum(sizes.values()) == 2 * 49  # two replicas of 49 keys
        return values

    run(write())
    values = run(read())
    assert values[7] is None
    assert [v for i, v in enumerate(values) if i != 7] == [b"%d" % i for i in range(50) if i != 7]


@pytest.mark.slow
def test_smart_client_records_an_invoke_ok_history(tmp_path) -> None:
    async def body() -> History:
        smap = make_map("aa-sc", shards=2, replicas=3)
        history = History()
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)):
            clients = [SmartClient(smap, seed=i, history=history, process=i) for i in range(3)]
            await asyncio.gather(*(c.put(b"x", b"from%d" % i) for i, c in enumerate(clients)))
            await asyncio.gather(*(c.get(b"x") for c in clients))
            for c in clients:
                await c.close()
        return history

    history = run(body())
    assert history.pending() == 0
    kinds = [e.type for e in history.events]
    assert kinds.count("invoke") == 6 and kinds.count("ok") == 6
    reads = [e.value for e in history.events if e.f == "get" and e.type == "ok"]
    assert len(set(reads)) == 1 and reads[0].startswith("from")  # all three reads after all writes agree


def test_zipf_is_skewed_and_plans_are_deterministic() -> None:
    w = ycsb.Workload(name="ycsb-b", keys=1000, ops=20_000, zipf=0.99, seed=5)
    kinds, keys = ycsb.plan_ops(w)
    kinds2, keys2 = ycsb.plan_ops(w)
    assert np.array_equal(kinds, kinds2) and np.array_equal(keys, keys2)
    counts = np.bincount(keys, minlength=1000)
    top = np.sort(counts)[::-1]
    assert top[:10].sum() > 0.2 * w.ops  # the hottest 1% of keys take over a fifth of the load
    assert abs((kinds == ycsb.READ).mean() - 0.95) < 0.01
    uniform = np.bincount(ycsb.zipf_ranks(1000, 0.0, 20_000, np.random.default_rng(0)), minlength=1000)
    assert uniform.max() < 60


@pytest.mark.slow
def test_ycsb_run_against_a_cluster_and_against_redis(tmp_path, redis_port) -> None:
    async def body() -> tuple[dict, dict]:
        smap = make_map("ms-sc", shards=2, replicas=3)
        w = ycsb.Workload(name="ycsb-f", keys=200, ops=1000, clients=4, seed=1)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            ours = await ycsb.run_workload(w, lambda s: ycsb.bespokv_target(smap, s))
            stored = sum(n.datalet.size() for n in cluster.nodes.values())
        assert stored == 3 * 200
        theirs = await ycsb.run_workload(w, ycsb.redis_target_factory([("127.0.0.1", redis_port)], wait=0))
        return ours, theirs

    ours, theirs = run(body())
    for r in (ours, theirs):
        assert r["errors"] == 0 and r["ops"] == 1000 and r["ops_per_s"] > 0
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"]


@pytest.mark.slow
def test_digest_matches_across_replicas_and_differs_on_divergence(tmp_path) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            client = SmartClient(smap)
            for i in range(100):
                await client.put(b"d%d" % i, b"%d" % i)
            conns = {n: await RespConnection.connect(a.host, a.port) for n, a in smap.nodes.items()}
            digests = {n: await c.call(b"BKV.DIGEST") for n, c in conns.items()}
            assert len({tuple(d) for d in digests.values()}) == 1 and digests["s0r0"][0] == b"100"
            cluster.nodes["s0r1"].datalet.put(b"d5", b"diverged")  # behind the protocol's back
            assert await conns["s0r1"].call(b"BKV.DIGEST") != digests["s0r0"]
            await client.close()
            for c in conns.values():
                await c.close()

    run(body())


def test_a_proxy_spreads_active_active_operations_over_the_replicas() -> None:
    from mlsyskit.tools.kv.node.requests import Request
    from mlsyskit.tools.kv.node.runtime import Node

    for controlet, spread in (("aa-sc", 3), ("aa-ec", 3), ("ms-sc", 1)):
        smap = make_map(controlet, shards=1, replicas=3)
        proxy = Node(smap, None, None)
        targets: list[str] = []
        proxy.forward = lambda req, node, seen=targets: seen.append(node)  # type: ignore[method-assign]
        for i in range(30):
            proxy.submit(Request("put", b"k%d" % i, b"v", None))
        assert len(set(targets)) == spread, (controlet, targets)
        targets.clear()
        conns = [type("Conn", (), {"id": i})() for i in range(6)]
        for i in range(30):  # one replica per client connection: its pipelined writes keep their order
            proxy.submit(Request("put", b"k%d" % i, b"v", conns[i % 6]))
        assert len(set(targets)) == spread
        assert all(targets[i] == targets[i % 6] for i in range(30))
