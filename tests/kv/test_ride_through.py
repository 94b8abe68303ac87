"""Issue 22 item 4 end to end: Redis Cluster clients against the nodes, and clients across a kill -9.

A cluster started by the one launcher (`bespokv up`'s ops.processes.up): redis-benchmark through
the proxy, redis-py through the proxy, redis-py's RedisCluster straight to the nodes and the smart
client all write while the chain head is killed with SIGKILL; none sees an error and every write it
was told succeeded is read back (tools/kv/check/ridecheck.py). And on two shards in one process:
CLUSTER SLOTS, -MOVED for another shard's key, hash tags, RedisCluster unchanged and
redis-benchmark's cluster mode.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import MovedError

from mlsyskit.core.net import free_range
from mlsyskit.tools.kv.check import ridecheck
from mlsyskit.tools.kv.frontend.cluster import hex_id
from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from mlsyskit.tools.kv.ops.processes import ClusterSpec, down, up
from mlsyskit.tools.kv.shardmap import key_slot
from tests.kv.conftest import ThreadedCluster, make_map

pytestmark = pytest.mark.slow  # every test here starts servers, clusters or processes


def test_redis_cluster_works_unchanged_against_two_shards_and_other_keys_are_moved() -> None:
    smap = make_map("ms-sc", shards=2, replicas=2)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n))) as tc:
        for node in tc.cluster.nodes.values():
            node.redirect = True  # as bespokv up's node processes do
        tail = smap.nodes["s1r1"]
        rc = RedisCluster(startup_nodes=[ClusterNode(tail.host, tail.port)])
        try:
            assert sorted(rc.cluster_slots()) == [(0, 8191), (8192, 16383)]
            for i in range(100):
                rc.set(f"k{i}", f"v{i}")
            assert rc.mget_nonatomic([f"k{i}" for i in range(100)]) == [f"v{i}".encode() for i in range(100)]
            assert rc.incr("{user1}.n") == 1 and rc.lpush("{user1}.l", "a") == 1  # one slot, one shard
            assert rc.keyslot("{user1}.n") == key_slot(b"user1") == rc.cluster_keyslot("user1")
            # SCAN goes to every primary and is merged: each key once (nodes answer for their own shard)
            assert sorted(rc.scan_iter(match="k*")) == sorted(f"k{i}".encode() for i in range(100))
            primaries = [redis.Redis(smap.nodes[n].host, smap.nodes[n].port) for n in ("s0r0", "s1r0")]
            assert sum(p.dbsize() for p in primaries) == 102
            assert all(smap.shard_for(k) == s for s, p in enumerate(primaries) for k in p.keys("*"))
            for p in primaries:
                p.close()
        finally:
            rc.close()
        on_s0 = next(f"k{i}" for i in range(100) if smap.shard_for(b"k%d" % i) == 0)
        plain = redis.Redis(tail.host, tail.port)  # shard 1's node, asked for a key of shard 0
        with pytest.raises(MovedError, match=f"^{key_slot(on_s0.encode())} 127.0.0.1:{smap.nodes['s0r0'].port}$"):
            plain.get(on_s0)
        assert plain.execute_command("CLUSTER", "INFO").decode().startswith("cluster_enabled:1")
        assert plain.execute_command("CLUSTER MYID") == hex_id("s1r1").encode()
        plain.close()
        if shutil.which("redis-benchmark") is not None:  # its cluster mode reads CLUSTER NODES
            run = subprocess.run(["redis-benchmark", "--cluster", "-h", tail.host, "-p", str(tail.port), "-t",
                                  "set,get", "-n", "2000", "-q"], capture_output=True, text=True, timeout=120)
            assert run.returncode == 0 and "rror" not in run.stdout + run.stderr, run.stdout + run.stderr
            assert "Master 1: " + hex_id("s1r0") in run.stdout and "GET: " in run.stdout


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    if shutil.which("redis-benchmark") is None:
        pytest.skip("needs redis-benchmark: apt-get install -y redis-tools")
    d = tmp_path_factory.mktemp("ride") / "cluster"
    record = up(ClusterSpec(shards=1, replicas=3, controlet="ms-sc", base_port=free_range(8), data_dir=d))
    try:
        yield record
    finally:
        down(d)


def test_the_proxy_of_bespokv_up_answers_keyspace_commands_for_the_whole_cluster(chain) -> None:
    proxy = redis.Redis(chain["proxy"]["host"], chain["proxy"]["port"])
    for i in range(20):
        proxy.set(f"scan{i}", i)
    assert sorted(proxy.scan_iter(match="scan*")) == sorted(f"scan{i}".encode() for i in range(20))
    assert proxy.dbsize() >= 20 and len(proxy.keys("scan*")) == 20
    proxy.close()


def test_clients_ride_through_a_kill_9_of_the_chain_head(chain) -> None:
    result = ridecheck.run(chain, after_s=1.0)
    assert result["killed"] == "s0r0" and result["new_map_s"] > 0
    assert result["bench_ran_to_end"] and not result["bench_errors"], result
    for name in ("proxy", "cluster", "smart"):
        assert result[name]["errors"] == 0, (name, result[name]["first_error"])
        assert result[name]["lost"] == 0 and result[name]["acked"] >= 40, (name, result[name])
    assert ridecheck.passed(result)
