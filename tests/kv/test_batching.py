"""Per-read batching: the chain tail's cumulative ack, and the windowed load generator."""
from __future__ import annotations

import asyncio
import random

import hiredis
import pytest
import redis

from mlsyskit.tools.kv.client import ycsb
from mlsyskit.tools.kv.controlets.base import PUT, Apply, Send
from mlsyskit.tools.kv.controlets.batch import ReplyBatch
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication


class Req:
    def __init__(self, key: bytes) -> None:
        self.op, self.key, self.value = PUT, key, b"v"


def test_chain_tail_acks_once_per_drained_read_and_the_head_answers_every_write() -> None:
    replicas = ["a", "b", "c"]
    head, tail = ChainReplication("a", replicas, 1), ChainReplication("c", replicas, 1)
    reqs = [Req(b"k%d" % i) for i in range(3)]
    chain = [head.on_client(r)[1] for r in reqs]
    assert all(type(s) is Send and s.kind == b"CHAIN" for s in chain)
    for s in chain:  # three CHAIN messages drained from one read at the tail: applies, no ack yet
        actions = tail.on_peer("b", s.kind, [str(s.fields[0]).encode(), *s.fields[1:]])
        assert [type(a) for a in actions] == [Apply]
    (ack,) = tail.on_quiet()
    assert ack == Send("a", b"ACK", (3,))
    assert tail.on_quiet() == []  # nothing more due
    replies = head.on_peer("c", b"ACK", [b"3"])
    assert replies == [ReplyBatch(reqs)]  # answered together (controlets/batch.py)


@pytest.mark.slow
def test_windowed_generator_against_redis_pairs_set_and_wait(redis_port) -> None:
    """Several operations outstanding per client; a write is SET+WAIT and completes on WAIT's reply."""
    endpoints = [("127.0.0.1", redis_port)]

    async def make(seed: int) -> ycsb.RedisRouter:
        router = ycsb.RedisRouter(endpoints, 1, random.Random(seed), spread_reads=False)
        assert router.write(b"k", b"v")[2] == 2  # SET and WAIT: two replies per write
        router.wait_frame = hiredis.pack_command((b"WAIT", 0, 0))  # no replica here: wait for none
        return router

    w = ycsb.Workload(name="ycsb-a", keys=300, ops=2000, clients=3, window=4, seed=2)
    r = asyncio.run(ycsb.run_workload(w, make))
    assert r["errors"] == 0 and r["window"] == 4 and r["ops"] == 2000
    assert 0 < r["p50_ms"] <= r["p99_ms"]
    conn = redis.Redis(port=redis_port)
    assert conn.dbsize() >= 300 and conn.get(ycsb.key_name(0)) == b"v" * 32
