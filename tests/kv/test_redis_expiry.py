"""Key expiry replicated through the controlets (issue 14, item 5).

Deadlines are absolute and decided at the write point, so every replica stores the same
bytes; a read past the deadline answers nil on every replica (lazy), and the sweep deletes
the key through the write path, so replicas end with the same keys and digests.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from mlsyskit.tools.kv.client.pipeline import RespConnection
from mlsyskit.tools.kv.ops.cluster import LocalCluster
from mlsyskit.tools.kv.redis import queries, rmw, values
from mlsyskit.tools.kv.redis.rmw import Command
from tests.kv.conftest import datalet_factory, make_map

NOW = 1_700_000_000_000


def at(now: int, *parts: bytes) -> Command:
    return Command(list(parts), now)


def test_expiry_semantics_are_redis_semantics() -> None:
    stored, answer = rmw.apply(at(NOW, b"SET", b"k", b"v", b"EX", b"10"), None)
    assert answer == b"+OK\r\n" and values.deadline_of(stored) == NOW + 10_000  # absolute, not relative
    assert queries.answer([b"TTL", b"k"], stored, NOW + 2_400) == b":8\r\n"  # rounded as Redis rounds
    assert queries.answer([b"PTTL", b"k"], stored, NOW + 2_400) == b":7600\r\n"
    assert values.get_answer(stored, NOW + 9_999) == b"$1\r\nv\r\n"
    assert values.get_answer(stored, NOW + 10_000) == b"$-1\r\n"  # past the deadline: absent
    assert queries.answer([b"TTL", b"k"], stored, NOW + 10_000) == b":-2\r\n"
    counted, _ = rmw.apply(at(NOW, b"INCR", b"k"), rmw.apply(at(NOW, b"SET", b"k", b"1", b"PX", b"50"), None)[0])
    assert values.deadline_of(counted) == NOW + 50  # INCR keeps the deadline
    assert values.deadline_of(rmw.apply(at(NOW, b"SET", b"k", b"2"), stored)[0]) == 0  # SET clears it
    kept, _ = rmw.apply(at(NOW, b"SET", b"k", b"2", b"KEEPTTL"), stored)
    assert values.deadline_of(kept) == NOW + 10_000
    # EXPIRE's conditions; a deadline in the past deletes the key; PERSIST removes the deadline
    assert rmw.apply(at(NOW, b"EXPIRE", b"k", b"5", b"NX"), stored)[1] == b":0\r\n"
    assert rmw.apply(at(NOW, b"EXPIRE", b"k", b"5", b"GT"), stored)[1] == b":0\r\n"
    shorter, answer = rmw.apply(at(NOW, b"EXPIRE", b"k", b"5", b"LT"), stored)
    assert answer == b":1\r\n" and values.deadline_of(shorter) == NOW + 5_000
    assert rmw.apply(at(NOW, b"PEXPIREAT", b"k", b"%d" % (NOW - 1)), stored) == (None, b":1\r\n")
    assert rmw.apply(at(NOW, b"EXPIRE", b"absent", b"5"), None) == (None, b":0\r\n")
    persisted, answer = rmw.apply(at(NOW, b"PERSIST", b"k"), stored)
    assert answer == b":1\r\n" and persisted == b"v"  # a plain string again: the fast paths serve it
    # an expired key is absent for every command, and the sweep's REAP deletes only expired keys
    assert rmw.apply(at(NOW + 10_000, b"SETNX", b"k", b"new"), stored) == (b"new", b":1\r\n")
    assert rmw.apply(at(NOW + 10_000, rmw.REAP, b"k"), stored) == (None, b":1\r\n")
    assert rmw.apply(at(NOW, rmw.REAP, b"k"), stored) == (stored, b":0\r\n")
    for bad in ([b"SET", b"k", b"v", b"EX", b"0"], [b"SET", b"k", b"v", b"EX", b"1", b"PX", b"1"],
                [b"SET", b"k", b"v", b"EX", b"1", b"KEEPTTL"], [b"EXPIRE", b"k", b"x"],
                [b"EXPIRE", b"k", b"1", b"YY"], [b"SETEX", b"k", b"-1", b"v"]):
        with pytest.raises(rmw.RmwSyntaxError):
            rmw.parse(bad)


async def _wait(condition, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.slow
@pytest.mark.parametrize("controlet", ["ms-sc", "ms-ec", "aa-sc"])
def test_expiry_is_replicated_and_swept_through_the_write_path(controlet: str, tmp_path) -> None:
    async def body() -> None:
        smap = make_map(controlet, shards=1, replicas=3)
        replicas = smap.shards[0]
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            conns = {n: await RespConnection.connect(smap.nodes[n].host, smap.nodes[n].port) for n in replicas}
            entry = conns[replicas[1]]  # not the write point: the command is forwarded or submitted
            deadline = _wall_ms() + 600
            assert await entry.call(b"SET", b"gone", b"v", b"PXAT", b"%d" % deadline) == b"OK"
            assert await entry.call(b"SET", b"kept", b"v", b"PX", b"600") == b"OK"
            assert await entry.call(b"PERSIST", b"kept") == 1
            assert await entry.call(b"SET", b"reset", b"v", b"PX", b"600") == b"OK"
            assert await entry.call(b"SET", b"reset", b"w") == b"OK"  # a plain SET clears the deadline
            assert 0 < await entry.call(b"PTTL", b"gone") <= 600

            def stored(key: bytes) -> list:
                return [cluster.nodes[n].datalet.get(key) for n in replicas]

            async def same_bytes() -> bool:
                return len(set(stored(b"gone"))) == 1
            await _wait(same_bytes, "every replica to hold the record")
            assert values.deadline_of(stored(b"gone")[0]) == deadline  # the absolute deadline, everywhere

            async def past() -> bool:
                return _wall_ms() >= deadline
            await _wait(past, "the deadline")
            for n in replicas:  # lazy: nil through every node, and from every replica's own bytes
                assert await conns[n].call(b"GET", b"gone") is None
                assert await conns[n].call(b"EXISTS", b"gone") == 0
                assert values.get_answer(cluster.nodes[n].datalet.get(b"gone"), _wall_ms()) == b"$-1\r\n"

            async def swept() -> bool:
                return stored(b"gone") == [None] * 3
            await _wait(swept, "the sweep to delete the key on every replica")
            assert stored(b"kept") == [b"v"] * 3 and stored(b"reset") == [b"w"] * 3
            digests = {tuple(await conns[n].call(b"BKV.DIGEST")) for n in replicas}
            assert len(digests) == 1
            for c in conns.values():
                await c.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.slow
def test_a_restarted_head_finds_deadlines_in_its_caught_up_data(tmp_path) -> None:
    """The sweep of a write point that (re)starts scans its datalet: deadlines came by replication."""
    async def body() -> None:
        smap = make_map("ms-sc", shards=1, replicas=3)
        head, middle, tail = smap.shards[0]
        async with LocalCluster(smap, datalet_factory("memory", tmp_path)) as cluster:
            conn = await RespConnection.connect(smap.nodes[tail].host, smap.nodes[tail].port)
            assert await conn.call(b"SET", b"k", b"v", b"PX", b"800") == b"OK"
            await cluster.kill(head)
            await cluster.restart(head)  # empty, then a snapshot from a live replica

            async def swept() -> bool:
                return all(cluster.nodes[n].datalet.get(b"k") is None for n in (head, middle, tail))
            await _wait(swept, "the restarted head's sweep to delete the key everywhere")
            assert await conn.call(b"GET", b"k") is None
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.slow
def test_deadlines_survive_a_whole_cluster_restart_on_lmdb(tmp_path) -> None:
    """Deadlines live in the stored bytes: after every node stops and starts again on its lmdb
    files, a key past its deadline is absent and swept, a key with time left keeps it."""
    async def body() -> None:
        smap = make_map("ms-sc", datalet="lmdb", shards=1, replicas=3)
        replicas = smap.shards[0]
        tail = smap.nodes[replicas[-1]]
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path)):
            conn = await RespConnection.connect(tail.host, tail.port)
            assert await conn.call(b"SET", b"short", b"v", b"PX", b"300") == b"OK"
            assert await conn.call(b"SET", b"long", b"v", b"EX", b"100") == b"OK"
            assert await conn.call(b"RPUSH", b"list", b"a", b"b") == 2
            assert await conn.call(b"PEXPIRE", b"list", b"100000") == 1
            await conn.close()
        deadline = _wall_ms() + 300

        async def past() -> bool:
            return _wall_ms() >= deadline
        await _wait(past, "the short deadline")
        async with LocalCluster(smap, datalet_factory("lmdb", tmp_path)) as cluster:
            conn = await RespConnection.connect(tail.host, tail.port)
            assert await conn.call(b"GET", b"short") is None
            assert 98 <= await conn.call(b"TTL", b"long") <= 100
            assert await conn.call(b"LRANGE", b"list", b"0", b"-1") == [b"a", b"b"]
            assert 98 <= await conn.call(b"TTL", b"list") <= 100

            async def swept() -> bool:
                return all(cluster.nodes[n].datalet.get(b"short") is None for n in replicas)
            await _wait(swept, "the sweep after the restart")
            await conn.close()

    asyncio.run(asyncio.wait_for(body(), 60))


class _FakeNode:
    """Just what the sweep touches: the write point's datalet reads and submit()."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self.data = data
        self.submitted: list = []
        self.controlet = type("C", (), {"read_local": staticmethod(data.get)})()

    def submit(self, req) -> None:
        self.submitted.append(req)


def test_the_sweep_reaps_only_expired_keys_retries_failures_and_stays_bounded() -> None:
    from mlsyskit.tools.kv.frontend.expiry import ActiveExpiry
    now = [NOW]
    data = {b"old": values.encode(values.Entry(values.STRING, NOW - 1, b"v")),
            b"later": values.encode(values.Entry(values.STRING, NOW + 5_000, b"v")),
            b"rewritten": b"plain"}
    node = _FakeNode(data)
    sweep = ActiveExpiry(node, unix_ms=lambda: now[0], retry_ms=1000)  # type: ignore[arg-type]
    sweep.note(b"old", NOW - 1)
    sweep.note(b"later", NOW - 1)  # noted early, then given a later deadline (stored bytes say so)
    sweep.note(b"rewritten", NOW - 1)
    assert sweep.sweep() == 1 and [r.key for r in node.submitted] == [b"old"]
    assert list(node.submitted[0].rmw) == [rmw.REAP, b"old"] and node.submitted[0].rmw.now_ms == NOW
    node.submitted[0].complete(b"-TRYAGAIN catching up\r\n")  # not applied: retried a second later
    assert sweep.sweep() == 0
    now[0] = NOW + 1_000
    assert sweep.sweep() == 1 and node.submitted[1].key == b"old"
    node.submitted[1].complete(b":1\r\n")
    now[0] = NOW + 5_000
    assert sweep.sweep() == 1 and node.submitted[2].key == b"later" and sweep.reaped == 1
    for i in range(100_000):  # EXPIRE in a loop on one key must not grow the heap
        sweep.note(b"hot", NOW + 10_000 + i)
    assert len(sweep.due) <= 1024 + 2 * len(sweep.noted)
