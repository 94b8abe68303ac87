"""A push costs O(pushed), not O(list) (issue 22, item 1): the memory datalet keeps a list live
(redis/livelist.py), and nothing on a replica's write path -- the head's read-modify-write, the
replicas' deltas, the undo images, the size limit -- copies, encodes or measures the whole list.
Checked structurally (bytes allocated per push, records built), never by timing; and the live form
is checked to give exactly the bytes every other form gives (exports, digests, snapshots)."""
from __future__ import annotations

import random
import tracemalloc

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard, SimTransport
from mlsyskit.tools.kv.controlets.base import ControletOptions
from mlsyskit.tools.kv.datalets import make_datalet
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.interpreter import Interpreter
from mlsyskit.tools.kv.node.undolog import image_bytes
from mlsyskit.tools.kv.redis import datatypes, livelist, rmw, values
from mlsyskit.tools.kv.redis.livelist import LiveList, promote
from mlsyskit.tools.kv.redis.values import LIST, Entry
from tests.kv.faulty_datalet import FaultyDatalet

FAST = ControletOptions(write_timeout=0.5, sync_timeout=0.1, anti_entropy_interval=0.1)
settle = SimShard.answer
BIG = [b"%0100d" % i for i in range(20_000)]  # the list: 20,000 elements of 100 bytes (2 MB)


def test_the_live_push_gives_the_bytes_of_the_byte_path_and_of_the_generic_path() -> None:
    rng = random.Random(5)
    for deadline in (0, 10**13):
        live: object = values.encode(Entry(LIST, deadline, [b"a"]))
        raw, expected = live, [b"a"]
        for step in range(150):
            name = rng.choice([b"RPUSH", b"LPUSH", b"RPUSHX", b"LPUSHX"])
            sizes = [70_000] if rng.random() < 0.03 else [1, 30, 300]  # now and then a bin32 element
            items = [bytes([97 + rng.randrange(26)]) * rng.choice(sizes) for _ in range(rng.choice([1, 1, 2, 70]))]
            cmd = rmw.Command([name, b"L", *items], now_ms=1)
            live, answer = rmw.apply(cmd, promote(live) if step == 0 else live)
            raw, raw_answer = rmw.apply(cmd, raw)  # a blob datalet's path (lmdb): bytes in, bytes out
            generic, generic_answer = datatypes._push(cmd, Entry(LIST, deadline, expected), 1)
            expected = generic.data
            assert type(live) is LiveList and type(raw) is bytes and answer == raw_answer == generic_answer
            if step % 30 == 0 or step == 149:
                assert live == raw == values.encode(generic) and len(live) == len(raw), step
                assert values.decode(live) == values.decode(raw) == generic
        assert values.deadline_of(live) == deadline and promote(raw) == raw and list(promote(raw)) == expected


def _allocated(work) -> int:
    """Peak bytes allocated while `work` runs (what it copies, encodes or builds)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    work()
    return tracemalloc.get_traced_memory()[1] - base


def test_a_push_allocates_the_same_at_10_and_at_20000_elements() -> None:
    """rmw.apply on a live list: a copy of the list (2 MB here) would show in the peak."""
    short, long = LiveList.of(0, BIG[:10]), LiveList.of(0, BIG)
    cmd = rmw.Command([b"RPUSH", b"L", b"x" * 100], now_ms=1)
    tracemalloc.start()
    try:
        costs = [_allocated(lambda v=v: rmw.apply(cmd, v)) for v in (short, long, short, long)]
        left = _allocated(lambda: rmw.apply(rmw.Command([b"LPUSH", b"L", b"y"], now_ms=1), long))
    finally:
        tracemalloc.stop()
    assert max(costs + [left]) < 8 * 1024, costs  # a chunk's pointers and a header, never the list
    assert len(rmw.apply(cmd, long)[0]) == len(values.encode(Entry(LIST, 0, BIG + [b"x" * 100])))


def _seeded(name: str, elements: list[bytes] = BIG) -> SimShard:
    return _seeded_with(name, Entry(LIST, 0, elements), b"L")


def _seeded_with(name: str, entry: Entry, key: bytes = b"K") -> SimShard:
    """A 3-replica shard whose replicas all hold `key` already (as bytes: a snapshot's form), on
    datalets that fail writes of the keys in `.armed[replica]` on command."""
    shard = SimShard(name, replicas=3, seed=3, options=FAST)
    shard.armed = {n: set() for n in shard.ids}
    stored = values.encode(entry)
    for n in shard.ids:
        shard.datalets[n] = FaultyDatalet(MemoryDatalet(), lambda key, n=n: key in shard.armed[n])
        shard.interpreters[n] = Interpreter(shard.datalets[n], SimTransport(shard, n), shard.stats)
        shard.datalets[n].put(key, stored)
    return shard


def _push(shard: SimShard, writer: str, element: bytes):
    req = shard.submit(writer, "rmw", b"L")
    req.rmw = rmw.Command([b"RPUSH", b"L", element], now_ms=1000)
    return settle(shard, req)


def _push_costs(shard: SimShard, pushes: int) -> list[int]:
    tracemalloc.start()
    try:
        return [_allocated(lambda i=i: _push(shard, "r0", b"%0100d" % i)) for i in range(pushes)]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc", "ms-ec"])
def test_a_replicated_push_copies_no_list_on_any_replica(name: str, monkeypatch) -> None:
    """Head/sequencer and every replica, with undo images (ms-sc, aa-sc): no record is built, and a
    push allocates no more at 20,000 elements than at 10 (a copy of the 2 MB list would show)."""
    short, shard = _seeded(name, BIG[:10]), _seeded(name)
    for s in (short, shard):  # each replica turns the bytes live, once
        assert _push(s, "r0", b"first") in (b":11\r\n", b":20001\r\n")
    built = []
    real = LiveList.stored
    monkeypatch.setattr(LiveList, "stored", lambda self: built.append(1) or real(self))
    small, large = _push_costs(short, 6), _push_costs(shard, 6)
    assert not built, "a push built a list's bytes"
    assert max(large) < min(small) + 64 * 1024, (small, large)
    assert all(type(shard.datalets[n].inner.data[b"L"]) is LiveList for n in shard.ids)
    for n in shard.ids:
        assert shard.interpreters[n].undo.bytes < 64 * 1024  # images of a 2 MB list, O(1) each
    monkeypatch.undo()
    shard.run_for(0.5)
    assert shard.converged()
    assert values.decode(shard.datalets["r2"].get(b"L")).data == BIG + [b"first"] + [b"%0100d" % i for i in range(6)]


@pytest.mark.parametrize("name,bad", [("ms-sc", "r0"), ("ms-sc", "r2"), ("aa-sc", "r1")])
def test_a_push_that_fails_on_one_replica_leaves_the_live_list_unchanged_everywhere(name: str, bad: str) -> None:
    shard = _seeded(name)
    assert _push(shard, "r0", b"ok") == b":20001\r\n"
    shard.armed[bad].add(b"L")
    result = _push(shard, "r0", b"failed")
    assert isinstance(result, Exception) and "OOM" in str(result), result
    shard.armed[bad].clear()
    shard.run_for(1.0)
    assert shard.converged()
    for n in shard.ids:
        assert values.decode(shard.datalets[n].get(b"L")).data == BIG + [b"ok"], n
    assert _push(shard, "r0", b"after") == b":20002\r\n"
    shard.run_for(0.5)
    assert shard.converged() and values.decode(shard.datalets["r1"].get(b"L")).data[-2:] == [b"ok", b"after"]


def test_the_size_limit_is_checked_on_the_counted_size_before_anything_is_applied() -> None:
    current = LiveList.of(0, BIG[:50])
    room = 1000 * 1024
    fits = rmw.Command([b"RPUSH", b"L", b"x" * 100], now_ms=1, max_bytes=len(current) + 102)
    after, answer = rmw.apply(fits, current)
    assert answer == b":51\r\n" and len(after) == len(after.stored()) == len(current) + 102
    over = rmw.Command([b"LPUSH", b"L", b"x" * 100], now_ms=1, max_bytes=len(current) + 101)
    after, answer = rmw.apply(over, current)
    assert after is current and answer.startswith(b"-ERR the list would exceed the maximum size")
    assert rmw.apply(rmw.Command([b"RPUSH", b"L", b"x" * room], now_ms=1, max_bytes=room), None)[1].startswith(b"-ERR")


def test_the_memory_datalet_hands_out_bytes_and_keeps_lists_live(tmp_path) -> None:
    import asyncio

    d = MemoryDatalet()
    stored = values.encode(Entry(LIST, 0, BIG[:100]))
    d.put(b"L", stored)
    d.put(b"s", b"plain")
    live = d.get_live(b"L")
    assert type(live) is LiveList and d.get(b"L") == stored and d.get_live(b"s") == b"plain"
    after = rmw.apply(rmw.Command([b"RPUSH", b"L", b"z"], now_ms=1), live)[0]
    assert d.swap(b"L", after) is live and d.get_live(b"L") is after  # the image is the old version
    exported = dict(asyncio.run(_pairs(d)))
    assert exported[b"L"] == values.encode(Entry(LIST, 0, BIG[:100] + [b"z"])) and type(exported[b"L"]) is bytes
    assert d.scan(b"L", 1)[0][1] == exported[b"L"]
    odd = stored[:13] + b"\xdd" + (100).to_bytes(4, "big") + stored[15:]  # a non-minimal array header
    d.put(b"odd", odd)
    assert d.get_live(b"odd") is odd  # not canonical: left as bytes, never rewritten by a read
    lmdb = make_datalet("lmdb", path=tmp_path / "lmdb")
    asyncio.run(lmdb.open())
    try:
        lmdb.put(b"L", after)
        assert lmdb.get(b"L") == exported[b"L"]
    finally:
        asyncio.run(lmdb.close())


async def _pairs(d: MemoryDatalet) -> list:
    return [p async for p in d.export_now()]


def test_an_undo_image_of_a_live_list_costs_a_chunk_not_the_list() -> None:
    short, long = LiveList.of(0, BIG[:10]), LiveList.of(0, BIG)
    assert image_bytes(short) == image_bytes(long) <= 8 * livelist.CHUNK + 128
    assert image_bytes(long.stored()) == len(long)  # the bytes form of the same value: its length
