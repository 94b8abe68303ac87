"""Pipelined read-modify-writes (INCR, LPUSH, HSET ...) as one stream entry per read (issue 22 item 5).

A connection's pipelined writes of one read -- plain SETs and read-modify-writes mixed -- are one
MIXED entry at the stream origin: resolved there in order, each seeing the writes before it, and
applied at every replica in that order (deltas recomputed there). The replies and every replica's
data must be what the same commands give one at a time; a datalet error in such a batch leaves
nothing of it visible (ms-sc: on any replica; ms-ec master: nothing after the failed write).
"""
from __future__ import annotations

import asyncio
import random

import hiredis
import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.controlets.base import PUT, RMW, ControletOptions
from mlsyskit.tools.kv.controlets.batch import MIXED, ApplyBatch, mixed_apply
from mlsyskit.tools.kv.controlets.ms_sc import ChainReplication
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.requests import Request
from mlsyskit.tools.kv.node.undolog import UndoLog
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from mlsyskit.tools.kv.redis import rmw
from tests.kv.conftest import make_map
from tests.kv.faulty_datalet import FaultyDatalet

pytestmark = pytest.mark.slow
FAST = ControletOptions(write_timeout=2.0, sync_timeout=0.2, anti_entropy_interval=0.1)


def random_commands(rng: random.Random, tag: bytes, n: int, reads: bool = True) -> list[tuple]:
    """Writes over a few keys of every kind, so they read each other's results (and meet WRONGTYPE,
    a non-integer INCR, a pop of an empty list, a delete), and reads among them. No deadlines or
    random draws: pipelined and one by one agree."""
    def k(name: bytes) -> bytes:
        return b"{%b}%b" % (tag, name)

    makers = [
        lambda: (b"SET", k(rng.choice([b"s", b"n"])), rng.choice([b"7", b"x", b"-2"])),
        lambda: (b"INCR", k(rng.choice([b"n", b"s", b"l"]))),
        lambda: (b"INCRBY", k(b"n"), b"%d" % rng.randint(-5, 5)),
        lambda: (b"APPEND", k(b"s"), b"ab"),
        lambda: (b"LPUSH", k(b"l"), b"v%d" % rng.randint(0, 9)),
        lambda: (b"RPUSH", k(b"l"), b"w"),
        lambda: (b"RPOP", k(b"l")),
        lambda: (b"HSET", k(b"h"), b"f%d" % rng.randint(0, 3), b"v"),
        lambda: (b"HDEL", k(b"h"), b"f%d" % rng.randint(0, 3)),
        lambda: (b"SADD", k(b"t"), b"m%d" % rng.randint(0, 3)),
        lambda: (b"ZADD", k(b"z"), b"%d" % rng.randint(0, 9), b"m%d" % rng.randint(0, 3)),
        lambda: (b"GETDEL", k(rng.choice([b"s", b"n"]))),
    ]
    if reads:  # reads among them see the writes before them (session order)
        makers += [lambda: (b"GET", k(rng.choice([b"s", b"n"]))), lambda: (b"HLEN", k(b"h")),
                   lambda: (b"LRANGE", k(b"l"), b"0", b"-1")]
    return [rng.choice(makers)() for _ in range(n)]


async def pipeline(conn: RespConnection, commands: list[tuple]) -> list:
    """Commands sent in one write (RespConnection corks a loop turn's calls); replies or errors."""
    futs = [conn.call(*c) for c in commands]
    return [r if not isinstance(r, hiredis.ReplyError) else ("error", str(r))
            for r in await asyncio.gather(*futs, return_exceptions=True)]


def strip(data: dict, tag: bytes) -> dict:
    """The keys under one tag, as stored bytes (a live value as its record)."""
    prefix = b"{%b}" % tag
    return {k[len(prefix):]: v if type(v) is bytes else v.stored() for k, v in data.items() if k.startswith(prefix)}


@pytest.mark.parametrize("controlet,replicas", [("ms-sc", 3), ("ms-ec", 3), ("ms-sc", 1), ("ms-ec", 1)])
def test_pipelined_read_modify_writes_answer_and_replicate_as_one_at_a_time(controlet, replicas) -> None:
    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=replicas)
        before = Request.duplicate_completions
        async with LocalCluster(smap, lambda n: MemoryDatalet(), options=FAST) as cluster:
            origin = cluster.nodes["s0r0"]
            conn = await RespConnection.connect(smap.nodes["s0r0"].host, smap.nodes["s0r0"].port)
            errors: list[str] = []
            for seed in range(3):
                rng = random.Random(seed)
                for reads in (False, True):
                    commands = random_commands(rng, b"p%d" % seed, 80, reads)
                    alone = [tuple(c[:1]) + (c[1].replace(b"{p", b"{a"),) + c[2:] for c in commands]
                    batches = origin.stats["batches"]
                    piped = await pipeline(conn, commands)
                    if not reads:  # 80 writes as one stream entry per read of them
                        assert 1 <= origin.stats["batches"] - batches <= 4
                    one_by_one = [(await pipeline(conn, [c]))[0] for c in alone]
                    assert piped == one_by_one, (seed, reads)
                    errors += [r[1][:9] for r in piped if isinstance(r, tuple)]
            assert "WRONGTYPE" in errors and "ERR value" in errors  # a mix that errs too
            assert await conn.call(b"SET", b"fence", b"1") == b"OK"  # ms-ec: then every replica has it all
            for _ in range(200):
                if all(b"fence" in cluster.nodes[n].datalet.data for n in smap.shards[0]):
                    break
                await asyncio.sleep(0.01)
            for n in smap.shards[0]:
                data = cluster.nodes[n].datalet.data
                for seed in range(3):
                    assert strip(data, b"p%d" % seed) == strip(data, b"a%d" % seed), (n, seed)
                assert strip(data, b"p0") == strip(cluster.nodes["s0r0"].datalet.data, b"p0"), n
            assert Request.duplicate_completions == before
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("poisoned", ["s0r0", "s0r1", "s0r2"])
def test_a_datalet_error_in_a_chain_batch_of_read_modify_writes_leaves_none_of_it(poisoned) -> None:
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)

        def datalet(n: str):
            return FaultyDatalet(MemoryDatalet(), lambda key: key == b"bad") if n == poisoned else MemoryDatalet()

        async with LocalCluster(smap, datalet, options=FAST) as cluster:
            conn = await RespConnection.connect(smap.nodes["s0r0"].host, smap.nodes["s0r0"].port)
            assert await pipeline(conn, [(b"SET", b"n", b"5"), (b"RPUSH", b"l", b"a")]) == [b"OK", 1]
            replies = await pipeline(conn, [(b"INCR", b"n"), (b"LPUSH", b"l", b"b"), (b"SADD", b"bad", b"x"),
                                            (b"HSET", b"h", b"f", b"v"), (b"INCR", b"n")])
            assert all(isinstance(r, tuple) for r in replies), replies  # every write of the batch failed
            assert "OOM" in replies[2][1], replies
            assert await pipeline(conn, [(b"INCR", b"n"), (b"LPUSH", b"l", b"c")]) == [6, 2]  # and later ones go
            assert await conn.call(b"LRANGE", b"l", b"0", b"-1") == [b"c", b"a"]
            lists = set()
            for n in smap.shards[0]:
                d = cluster.nodes[n].datalet
                assert d.get(b"n") == b"6" and d.get(b"h") is None and d.get(b"bad") is None, n
                lists.add(d.get(b"l"))
            assert len(lists) == 1  # the same list on every replica
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("controlet,replicas", [("ms-ec", 3), ("ms-sc", 1)])
def test_a_write_point_that_answers_at_once_applies_nothing_after_a_failed_write_of_a_batch(controlet, replicas):
    async def body() -> None:  # an ms-ec master, a chain of one: no undo, so the writes after it are refused
        smap = make_map(controlet, shards=1, replicas=replicas)

        def datalet(n: str):
            return FaultyDatalet(MemoryDatalet(), lambda key: key == b"bad") if n == "s0r0" else MemoryDatalet()

        async with LocalCluster(smap, datalet, options=FAST) as cluster:
            conn = await RespConnection.connect(smap.nodes["s0r0"].host, smap.nodes["s0r0"].port)
            replies = await pipeline(conn, [(b"INCR", b"n"), (b"SADD", b"bad", b"x"), (b"INCR", b"n"),
                                            (b"HSET", b"h", b"f", b"v")])
            assert replies[0] == 1 and "OOM" in replies[1][1], replies
            assert all(isinstance(r, tuple) and "not applied" in r[1] for r in replies[2:]), replies
            master = cluster.nodes["s0r0"].datalet
            assert master.get(b"n") == b"1" and master.get(b"h") is None  # the INCR after it never counted
            assert await conn.call(b"INCR", b"n") == 2
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 60))


class Req:
    def __init__(self, key: bytes, value: bytes | None = None, command: list | None = None) -> None:
        self.key, self.value, self.reply = key, value, None
        self.rmw = None if command is None else rmw.parse(command)
        self.op = PUT if command is None else RMW


def test_a_mixed_entry_carries_deltas_and_values_and_a_head_that_cannot_number_it_defers() -> None:
    replicas = ["a", "b", "c"]
    head = ChainReplication("a", replicas, 1)
    store = MemoryDatalet()
    store.put(b"n", b"41")
    head.read_local = store.get_live
    reqs = [Req(b"n", command=[b"INCR", b"n"]), Req(b"s", b"x"), Req(b"s", command=[b"APPEND", b"s", b"y"]),
            Req(b"n", command=[b"GETDEL", b"n"])]
    apply, send = head.on_client_batch(reqs)
    assert [r.reply for r in reqs] == [b":42\r\n", None, b":2\r\n", b"$2\r\n42\r\n"]  # each saw the one before
    assert apply.values[0] == b"42" and apply.values[3] is None  # the head's own writes: made here
    assert send.fields[1] == MIXED and send.fields[2] == b"PPRD"  # APPEND goes down as its command
    wire = [f if type(f) is bytes else str(f).encode() for f in send.fields]
    at_replica = mixed_apply(wire, 1)
    assert type(at_replica) is ApplyBatch and at_replica.keys == [b"n", b"s", b"s", b"n"]
    assert at_replica.values[:2] == [b"42", b"x"] and at_replica.ops[2][0] == b"APPEND"
    with pytest.raises(ValueError):
        mixed_apply([wire[0], MIXED, b"PXRD", wire[3], wire[4]], 1)
    middle = ChainReplication("b", replicas, 1)  # not the head: one at a time, in the runtime
    assert middle.on_client_batch([Req(b"n", command=[b"INCR", b"n"]), Req(b"m", b"v")]) is None


def test_the_memory_datalets_batch_write_keeps_images_that_undo_it_and_changes_nothing_on_error() -> None:
    d = MemoryDatalet()
    d.put(b"a", b"1")
    keys, values = [b"a", b"b", b"a"], [b"2", b"3", b"4"]  # a key written twice in one batch
    befores = d.write_many(keys, values)
    assert d.data == {b"a": b"4", b"b": b"3"}
    log = UndoLog()
    log.keep_batch(1, keys, befores)
    for _, key, before in log.take(1):  # newest first, as the interpreter's Undo restores them
        d.delete(key) if before is None else d.put(key, before)
    assert d.data == {b"a": b"1"}
    with pytest.raises(TypeError):
        d.write_many([b"a", FailsSecondHash(), b"c"], [b"9", b"9", b"9"])  # fails in the write itself
    assert d.data == {b"a": b"1"}  # the write before the error was taken back
    assert PoisonDatalet().write_many is None  # a subclass that changes writes goes write by write


class FailsSecondHash:
    """A key whose lookup works and whose write then raises."""

    def __init__(self) -> None:
        self.hashed = 0

    def __hash__(self) -> int:
        self.hashed += 1
        if self.hashed > 1:
            raise TypeError("cannot store this key")
        return 1


class PoisonDatalet(MemoryDatalet):
    def swap(self, key, value):
        raise MemoryError("OOM")
