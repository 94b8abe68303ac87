"""One stream entry per pipeline batch, and a proxy's batch relayed as one frame (issue 22 item 5).

The controlet half runs on the pure state machines; the rest on in-process clusters over loopback
(LocalCluster): every write of a batch is acknowledged only once it is on every replica, a datalet
error on any write of a batch fails the whole batch everywhere, and a connection's order holds.
"""
from __future__ import annotations

import asyncio

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets.base import PUT, ControletOptions, Send
from mlsyskit.tools.kv.controlets.batch import BATCH, ApplyBatch, ReplyBatch, batch_fields, batch_pairs
from mlsyskit.tools.kv.controlets.ms_ec import AsyncPrimaryBackup
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.node.requests import Request
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from tests.kv.conftest import make_map

FAST = ControletOptions(write_timeout=2.0, sync_timeout=0.2, anti_entropy_interval=0.1)


class Req:
    def __init__(self, key: bytes, value: bytes = b"v") -> None:
        self.op, self.key, self.value, self.rmw = PUT, key, value, None


def wire(fields) -> list:
    """A message's fields as a receiver parses them: every one bytes."""
    return [f if type(f) is bytes else str(f).encode() for f in fields]


def test_a_chain_batch_is_one_entry_acknowledged_once_and_replayable_from_the_log() -> None:
    replicas = ["a", "b", "c"]
    head, mid, tail = (ChainReplication(n, replicas, 1) for n in replicas)
    for c in (head, mid, tail):
        c.history.restart(0, 0)  # a known state: position 0, checksum 0 (as after a first catch-up)
    reqs = [Req(b"k%d" % i, b"v%d" % i) for i in range(3)]
    out = head.on_client_batch(reqs)
    keys, values = [r.key for r in reqs], [r.value for r in reqs]
    assert out[0] == ApplyBatch(keys, values, reqs, 1)  # one number, three before-images
    (send,) = out[1:]
    assert send == Send("b", b"CHAIN", batch_fields(1, reqs))
    assert send.fields[:2] == (1, BATCH) and send.fields[3] == b"k0v0k1v1k2v2"  # the pairs back to back
    assert batch_pairs(wire(send.fields)) == (keys, values)
    relayed = mid.on_peer("a", b"CHAIN", wire(send.fields))
    assert relayed[0] == ApplyBatch(keys, values, None, 1)
    assert relayed[1].node == "c" and wire(relayed[1].fields) == wire(send.fields)
    assert tail.on_peer("b", b"CHAIN", wire(relayed[1].fields))[:1] == relayed[:1]
    assert tail.on_quiet() == [Send("a", b"ACK", (1,))]
    assert head.on_peer("c", b"ACK", [b"1"]) == [ReplyBatch(reqs)]
    assert head.history.chain == mid.history.chain == tail.history.chain != 0  # one checksum at every hop
    assert head.history.seq == 1
    # A replica one entry behind gets the batch from the log tail and applies it whole.
    (entry,) = mid.history.tail_after(0, 0)
    late = ChainReplication("c", replicas, 1)
    assert late.apply_stream("b", 1, tuple(entry))[:1] == relayed[:1]


def test_a_malformed_batch_entry_is_refused() -> None:
    fields = wire(batch_fields(1, [Req(b"k", b"v")]))
    with pytest.raises(ValueError):
        batch_pairs([fields[0], fields[1], fields[2], fields[3] + b"x"])  # a byte more than the lengths say


def test_a_batch_waits_its_turn_when_the_head_cannot_number_it() -> None:
    replicas = ["a", "b", "c"]
    mid = ChainReplication("b", replicas, 1)
    assert [type(a).__name__ for a in mid.on_client_batch([Req(b"x"), Req(b"y")])] == ["Forward", "Forward"]
    full = ChainReplication("a", replicas, 1, ControletOptions(max_pending=2))
    out = full.on_client_batch([Req(b"x"), Req(b"y"), Req(b"z")])  # one at a time: the third is refused
    assert [type(a).__name__ for a in out] == ["Apply", "Send", "Apply", "Send", "Fail"]


def test_an_ms_ec_batch_is_answered_at_the_master_and_streamed_as_one_entry() -> None:
    master, slave = AsyncPrimaryBackup("a", ["a", "b"], 1), AsyncPrimaryBackup("b", ["a", "b"], 1)
    reqs = [Req(b"k%d" % i) for i in range(2)]
    out = master.on_client_batch(reqs)
    assert out[:2] == [ApplyBatch([b"k0", b"k1"], [b"v", b"v"], reqs, 0), ReplyBatch(reqs)]
    assert out[2] == Send("b", b"REPL", batch_fields(1, reqs))
    assert slave.on_peer("a", b"REPL", wire(out[2].fields)) == [ApplyBatch([b"k0", b"k1"], [b"v", b"v"], None, 0)]


class PoisonDatalet(MemoryDatalet):
    """Writes of one key fail, as a redis datalet's do at maxmemory (every write goes through swap)."""

    def __init__(self, poison: bytes) -> None:
        super().__init__()
        self.poison = poison

    def swap(self, key, value):
        if key == self.poison:
            raise MemoryError("OOM command not allowed when used memory > 'maxmemory'")
        return super().swap(key, value)


async def pipeline(conn: RespConnection, *commands: tuple) -> list:
    """Commands sent in one write (RespConnection corks a loop turn's calls); replies or errors."""
    futs = [conn.call(*c) for c in commands]
    return await asyncio.gather(*futs, return_exceptions=True)


async def connect(smap, node: str) -> RespConnection:
    a = smap.nodes[node]
    return await RespConnection.connect(a.host, a.port)


@pytest.mark.slow
@pytest.mark.parametrize("poisoned", ["s0r0", "s0r1"])
def test_a_datalet_error_in_a_batch_fails_the_batch_on_every_replica(poisoned) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        before = Request.duplicate_completions
        cluster = LocalCluster(smap, lambda n: PoisonDatalet(b"bad") if n == poisoned else MemoryDatalet(),
                               options=FAST)
        async with cluster:
            head = await connect(smap, "s0r0")
            assert await head.call(b"SET", b"a", b"old") == b"OK"
            replies = await pipeline(head, (b"SET", b"a", b"new"), (b"SET", b"bad", b"x"), (b"SET", b"c", b"y"))
            assert cluster.nodes["s0r0"].stats["batches"] == 1  # the three arrived in one read: one entry
            assert all(isinstance(r, hiredis.ReplyError) for r in replies), replies
            assert "OOM" in str(replies[1]), replies  # the write that failed, and the rest of its batch:
            assert all("not applied on any replica" in str(r) for r in (replies[0], replies[2])), replies
            # later batches go through, and nothing of the failed one is on any replica
            assert await pipeline(head, *((b"SET", b"d%d" % i, b"z") for i in range(5))) == [b"OK"] * 5
            for n in smap.shards[0]:
                data = cluster.nodes[n].datalet.data
                assert data[b"a"] == b"old" and b"bad" not in data and b"c" not in data, n
                assert all(data[b"d%d" % i] == b"z" for i in range(5)), n
            assert Request.duplicate_completions == before
            await head.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.slow
def test_pipelined_writes_and_reads_keep_order_through_head_tail_and_proxy() -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=2, replicas=3)
        async with LocalCluster(smap, lambda n: MemoryDatalet(), options=FAST) as cluster:
            proxy = Node(smap, None, None, secret=cluster.secret)
            proxy_port = smap.nodes["s0r0"].port + 100
            await start_node(proxy, "127.0.0.1", proxy_port)
            try:
                direct = await connect(smap, "s0r0")
                via = await RespConnection.connect("127.0.0.1", proxy_port)
                keys = [k for k in (b"k%d" % i for i in range(40)) if smap.shard_for(k) == 0][:10]
                sets = [(b"SET", k, b"1" + k) for k in keys]
                assert await pipeline(direct, *sets) == [b"OK"] * len(keys)  # acknowledged: on every replica
                for n in smap.shards[0]:
                    assert all(cluster.nodes[n].datalet.data[k] == b"1" + k for k in keys), n
                assert cluster.nodes["s0r0"].stats["batches"] >= 1
                assert cluster.nodes["s0r2"].stats["peer_messages"] < len(keys)  # fewer chain messages than writes
                # one connection's SET, GET, SET, GET of one key, pipelined: each read sees the write before it
                order = [(b"SET", keys[0], b"2"), (b"GET", keys[0]), (b"SET", keys[0], b"3"), (b"GET", keys[0])]
                for conn in (direct, via):
                    assert await pipeline(conn, *order) == [b"OK", b"2", b"OK", b"3"]
                # the proxy: batches of one shard relayed as one frame, mixed shards one by one
                both = [b"m%d" % i for i in range(20)]
                assert await pipeline(via, *((b"SET", k, k) for k in both)) == [b"OK"] * 20
                assert await pipeline(via, *((b"GET", k) for k in both + keys)) == both + [b"3"] + [b"1" + k for k in keys[1:]]
                relayed = proxy.stats["batches"]
                assert await pipeline(via, *((b"GET", k) for k in keys)) == [b"3"] + [b"1" + k for k in keys[1:]]
                assert proxy.stats["batches"] == relayed + 1
                await direct.close()
                await via.close()
            finally:
                await proxy.stop()

    asyncio.run(asyncio.wait_for(body(), 60))
