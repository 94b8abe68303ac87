"""SADD, SREM, HSET, HDEL, ZADD, ZREM, HINCRBY, APPEND and LPOP/RPOP cost O(delta), not O(value) (issue 22
item 1):
the memory datalet keeps sets, hashes and sorted sets live (redis/livemap.py: a persistent hash trie
and an insertion-order log) and an APPENDed string as a rope (redis/livestring.py), so the write
point's read-modify-write, every replica's delta, the undo images and the size limit touch only the
members written. Checked structurally (bytes allocated per write, records built), never by timing;
and the live forms are checked to give exactly the answers and bytes of the generic path."""
from __future__ import annotations

import random
import tracemalloc

import pytest

from mlsyskit.tools.kv.check.simulate import SimShard
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.undolog import image_bytes
from mlsyskit.tools.kv.redis import live, rmw, values
from mlsyskit.tools.kv.redis.livelist import LiveList
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.livestring import LiveString
from mlsyskit.tools.kv.redis.values import HASH, LIST, SET, STRING, ZSET, Entry
from tests.kv.test_live_lists import _allocated, _seeded_with, settle

N = 20_000
MEMBERS = [b"%0100d" % i for i in range(N)]  # the size: 20,000 members of 100 bytes (2 MB)
BIG = {SET: dict.fromkeys(MEMBERS), HASH: {m[-20:]: m for m in MEMBERS}, ZSET: {m: float(i) for i, m in enumerate(MEMBERS)},
       STRING: b"s" * (100 * N)}
WRITE = {SET: [b"SADD", b"K", b"new-member"], HASH: [b"HSET", b"K", b"new-field", b"v" * 100],
         ZSET: [b"ZADD", b"K", b"1.5", b"new-member"], STRING: [b"APPEND", b"K", b"x" * 100]}


def _generic(cmd: list, current: bytes | None):
    """rmw.apply with no fast path: decode, the command's handler, encode (the bytes path)."""
    fast = live.FAST.pop(cmd[0], None)
    try:
        return rmw.apply(cmd, current)
    finally:
        if fast is not None:
            live.FAST[cmd[0]] = fast


def _random_command(rng: random.Random, span: int) -> list[bytes]:
    def m() -> bytes:
        return b"m%d" % rng.randrange(span)
    name = rng.choice([b"SADD", b"SREM", b"HSET", b"HMSET", b"HDEL", b"HSETNX", b"HINCRBY", b"ZADD", b"ZREM",
                       b"ZINCRBY", b"APPEND", b"PEXPIREAT", b"PERSIST", b"RPUSH", b"LPUSH", b"LPOP", b"RPOP",
                       b"ZPOPMIN", b"ZPOPMAX", b"SPOP", b"LSET", b"LTRIM", b"LINSERT", b"LREM"])
    if name == b"SADD":
        args = [m() for _ in range(rng.choice([1, 1, 3, 20]))]
    elif name in (b"SREM", b"HDEL", b"ZREM"):
        args = [m() for _ in range(rng.choice([1, 2, 10]))]
    elif name in (b"HSET", b"HMSET"):
        args = [x for _ in range(rng.choice([1, 2])) for x in (m(), b"v" * rng.randrange(300))]
    elif name == b"HSETNX":
        args = [m(), b"x"]
    elif name == b"HINCRBY":
        args = [m(), b"%d" % rng.randrange(-5, 5)]
    elif name == b"ZADD":
        flags = rng.choice([[], [b"NX"], [b"XX"], [b"GT"], [b"CH"], [b"INCR"], [b"LT", b"CH"]])
        pairs = 1 if b"INCR" in flags else rng.choice([1, 3])
        scores = [b"1", b"2.5", b"-0", b"0", b"inf", b"%d" % rng.randrange(9)]
        args = flags + [x for _ in range(pairs) for x in (rng.choice(scores), m())]
    elif name == b"ZINCRBY":
        args = [b"%d" % rng.randrange(-3, 3), m()]
    elif name == b"PEXPIREAT":
        args = [b"%d" % rng.randrange(1, 20)]
    elif name == b"PERSIST":
        args = []
    elif name in (b"RPUSH", b"LPUSH"):
        args = [m() for _ in range(rng.choice([1, 1, 3, 70, 150]))]  # whole chunks at times
    elif name == b"LSET":
        args = [b"%d" % rng.randrange(-span - 2, span + 2), rng.choice([m(), b"v" * rng.randrange(300)])]
    elif name == b"LTRIM":
        args = [b"%d" % rng.choice([0, 1, -1, rng.randrange(-span, span)]), b"%d" % rng.choice([-1, -2, rng.randrange(-span, span)])]
    elif name == b"LINSERT":
        args = [rng.choice([b"BEFORE", b"after", b"AFTER"]), m(), m()]
    elif name == b"LREM":
        args = [b"%d" % rng.choice([0, 1, -1, 2, -3]), m()]
    elif name in (b"LPOP", b"RPOP", b"ZPOPMIN", b"ZPOPMAX", b"SPOP"):
        args = rng.choice([[], [], [b"%d" % rng.choice([0, 1, 2, 65, 500])]])
    else:
        args = [rng.choice([b"", b"\x00BKV", b"a" * rng.randrange(50)])]
    return [name, b"K", *args]


def test_the_live_writes_answer_and_store_exactly_what_the_generic_path_does() -> None:
    """Random commands (adds, removals that leave garbage to compact, updates, flags, wrong types,
    expiry, limits) on the live form and on bytes: same answers, same bytes, same counted size."""
    rng = random.Random(7)
    for trial in range(12):
        span = (5, 40, 600)[trial % 3]  # few members: many removals and rebuilds; many: trie splits
        current: object = None
        raw: bytes | None = None
        for step in range(250):
            cmd = rmw.Command(_random_command(rng, span), now_ms=rng.randrange(1, 10),
                              max_bytes=rng.choice([10**6, 10**6, 3000]))
            after, answer = rmw.apply(cmd, current)
            raw_after, raw_answer = _generic(cmd, raw)
            assert answer == raw_answer, (trial, step, cmd)
            assert (None if after is None else bytes(after)) == raw_after, (trial, step, cmd)
            assert after is None or len(after) == len(raw_after), (trial, step, cmd)
            current, raw = (live.promote(after) if after.__class__ is bytes else after), raw_after
            if rng.random() < 0.05 and raw is not None:
                current = live.promote(raw)  # a snapshot's bytes, turned live by the memory datalet
    assert type(LiveMap.of(SET, 0, {b"a": None})) is LiveMap


@pytest.mark.parametrize("kind", [SET, HASH, ZSET, STRING])
def test_a_write_allocates_the_same_at_10_and_at_20000_members(kind: bytes) -> None:
    """rmw.apply on a live value: a copy of the value (2 MB here) would show in the peak."""
    def of(data):
        return LiveString.of(0, data) if kind == STRING else LiveMap.of(kind, 0, data)
    short = of(BIG[kind][:1000] if kind == STRING else dict(list(BIG[kind].items())[:10]))
    long = of(BIG[kind])
    cmd = rmw.Command(WRITE[kind], now_ms=1)
    tracemalloc.start()
    try:
        costs = [_allocated(lambda v=v: rmw.apply(cmd, v)) for v in (short, long, short, long)]
    finally:
        tracemalloc.stop()
    assert max(costs) < 24 * 1024, costs  # a path of the trie, a leaf, a log chunk: never the value
    assert image_bytes(long) < 24 * 1024 and image_bytes(long) == image_bytes(short)  # an undo image
    after, answer = rmw.apply(cmd, long)
    expected, expected_answer = _generic(cmd, long.stored())
    assert answer == expected_answer and len(after) == len(expected) and after.stored() == expected


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc", "ms-ec"])
@pytest.mark.parametrize("kind", [SET, HASH])
def test_a_replicated_write_copies_no_value_on_any_replica(name: str, kind: bytes, monkeypatch) -> None:
    """Write point and every replica, with undo images (ms-sc, aa-sc): no record is built, and a write
    allocates no more at 20,000 members than at 10 (a copy of the 2 MB value would show)."""
    small = dict(list(BIG[kind].items())[:10])
    short, shard = _seeded_with(name, Entry(kind, 0, small)), _seeded_with(name, Entry(kind, 0, BIG[kind]))
    for s in (short, shard):  # each replica turns the bytes live, once
        assert _write(s, kind, b"first") == b":1\r\n"
    built = []
    real = LiveMap.stored
    monkeypatch.setattr(LiveMap, "stored", lambda self: built.append(1) or real(self))
    tracemalloc.start()
    try:
        costs = [[_allocated(lambda i=i, s=s: _write(s, kind, b"w%d" % i)) for i in range(5)] for s in (short, shard)]
    finally:
        tracemalloc.stop()
    assert not built, "a write built a value's bytes"
    assert max(costs[1]) < min(costs[0]) + 64 * 1024, costs
    for n in shard.ids:
        assert type(shard.datalets[n].inner.data[b"K"]) is LiveMap
        assert shard.interpreters[n].undo.bytes < 128 * 1024  # images of a 2 MB value, O(1) each
    monkeypatch.undo()
    shard.run_for(0.5)
    assert shard.converged()
    data = values.decode(shard.datalets["r2"].get(b"K")).data
    assert len(data) == N + 6 and list(data)[-6:] == [b"first"] + [b"w%d" % i for i in range(5)]


def _write(shard: SimShard, kind: bytes, member: bytes, writer: str = "r0"):
    req = shard.submit(writer, "rmw", b"K")
    args = {SET: [b"SADD", b"K", member], HASH: [b"HSET", b"K", member, b"v"]}[kind]
    req.rmw = rmw.Command(args, now_ms=1000)
    return settle(shard, req)


@pytest.mark.parametrize("name,bad", [("ms-sc", "r0"), ("ms-sc", "r2"), ("aa-sc", "r1")])
def test_a_write_that_fails_on_one_replica_leaves_the_live_value_unchanged_everywhere(name: str, bad: str) -> None:
    shard = _seeded_with(name, Entry(SET, 0, BIG[SET]))
    assert _write(shard, SET, b"ok") == b":1\r\n"
    shard.armed[bad].add(b"K")
    result = _write(shard, SET, b"failed")
    assert isinstance(result, Exception) and "OOM" in str(result), result
    shard.armed[bad].clear()
    shard.run_for(1.0)
    assert shard.converged()
    for n in shard.ids:
        data = values.decode(shard.datalets[n].get(b"K")).data
        assert len(data) == N + 1 and b"ok" in data and b"failed" not in data, n
    assert _write(shard, SET, b"after") == b":1\r\n"
    shard.run_for(0.5)
    assert shard.converged() and list(values.decode(shard.datalets["r1"].get(b"K")).data)[-2:] == [b"ok", b"after"]


def test_the_size_limit_is_checked_on_the_counted_size_before_anything_is_applied() -> None:
    current = LiveMap.of(SET, 0, dict.fromkeys(MEMBERS[:50]))
    fits = rmw.Command([b"SADD", b"K", b"x" * 100], now_ms=1, max_bytes=len(current) + 102)
    after, answer = rmw.apply(fits, current)
    assert answer == b":1\r\n" and len(after) == len(after.stored()) == len(current) + 102
    over = rmw.Command([b"SADD", b"K", b"y" * 100], now_ms=1, max_bytes=len(current) + 101)
    after, answer = rmw.apply(over, current)
    assert after is current and answer.startswith(b"-ERR the set would exceed the maximum size")
    text = LiveString.of(0, b"a" * 1000)
    after, answer = rmw.apply(rmw.Command([b"APPEND", b"K", b"b"], now_ms=1, max_bytes=1000), text)
    assert after is text and answer.startswith(b"-ERR string exceeds maximum allowed size")
    assert rmw.apply(rmw.Command([b"HSET", b"K", b"f", b"v" * 200], now_ms=1, max_bytes=100), None)[1] \
        .startswith(b"-ERR the hash would exceed")


def test_the_memory_datalet_keeps_collections_and_appended_strings_live_and_hands_out_bytes() -> None:
    d = MemoryDatalet()
    records = {kind: values.encode(Entry(kind, 0, dict(list(BIG[kind].items())[:100]))) for kind in (SET, HASH, ZSET)}
    records[STRING] = values.encode(Entry(STRING, 10**13, b"text"))  # a string with a deadline: a record
    for kind, stored in records.items():
        d.put(kind, stored)
        value = d.get_live(kind)
        assert type(value) is (LiveString if kind == STRING else LiveMap) and d.get(kind) == stored
        cmd = rmw.Command(WRITE[kind][:1] + [kind] + WRITE[kind][2:], now_ms=1)
        after = rmw.apply(cmd, value)[0]
        assert d.swap(kind, after) is value and d.get_live(kind) is after  # the image is the old version
        assert d.get(kind) == _generic(cmd, stored)[0] and type(d.get(kind)) is bytes
    odd = records[SET][:13] + b"\xdc\x00\x64" + records[SET][14:]  # a non-minimal array header
    d.put(b"odd", odd)
    assert d.get_live(b"odd") is odd  # not canonical: left as bytes, never rewritten by a read
    d.put(b"plain", b"abc")
    grown = rmw.apply(rmw.Command([b"APPEND", b"plain", b"def"], now_ms=1), d.get_live(b"plain"))[0]
    assert type(grown) is LiveString and bytes(grown) == b"abcdef" and grown[:1] == b"a"


@pytest.mark.parametrize("name", ["ms-sc", "aa-sc", "ms-ec"])
def test_a_restarted_replica_copies_live_values_and_replays_later_deltas_once(name: str) -> None:
    """A replica restarted empty copies a snapshot (a view of live values taken at one instant) while
    writes go on; a delta in both the snapshot and the replayed stream would show twice (HINCRBY,
    APPEND are not idempotent). Every replica ends with the same bytes, each acknowledged write once."""
    shard = _seeded_with(name, Entry(SET, 0, dict.fromkeys(MEMBERS[:2000])))
    acked: dict[bytes, int] = {b"n": 0, b"tail": 0}
    tried = dict(acked)

    def write(i: int) -> None:
        for key, args in ((b"n", [b"HINCRBY", b"H", b"n", b"1"]), (b"tail", [b"APPEND", b"S", b"%d," % i])):
            req = shard.submit("r0", "rmw", args[1])
            req.rmw = rmw.Command(args, now_ms=1000)
            tried[key] += 1
            acked[key] += not isinstance(settle(shard, req), Exception)
        assert _write(shard, SET, b"w%d" % i) == b":1\r\n" or name != "ms-ec"

    for i in range(5):
        write(i)
    shard.crash("r2")
    for i in range(5, 10):
        write(i)  # while r2 is down (ms-sc, aa-sc: failed until the shard is reconfigured or r2 is back)
    shard.restart("r2")
    for i in range(10, 20):
        write(i)  # while r2 copies and replays
    shard.run_for(2.0)
    assert shard.controlets["r2"].ready and shard.converged()
    counter = int(values.decode(shard.datalets["r2"].get(b"H")).data[b"n"])
    assert acked[b"n"] <= counter <= tried[b"n"] and acked[b"n"] >= 10
    appended = values.decode(shard.datalets["r2"].get(b"S")).data.split(b",")[:-1]
    assert len(appended) == len(set(appended)) and acked[b"tail"] <= len(appended) <= tried[b"tail"]
    assert [int(x) for x in appended] == sorted(int(x) for x in appended)
    assert type(shard.datalets["r0"].inner.data[b"S"]) is LiveString


def test_pops_on_a_live_list_cost_the_same_at_10_and_at_20000_elements_from_either_end() -> None:
    """LPOP/RPOP take elements off a LiveList's ends (a banker's deque of chunks): a queue (RPUSH,
    LPOP) and pops alternating between the ends allocate no copy of the list. Also the count form:
    RPOP past the length empties the list (the generic path once kept part of it)."""
    short, long = LiveList.of(0, MEMBERS[:10]), LiveList.of(0, MEMBERS)
    tracemalloc.start()
    try:
        costs = []
        for value in (short, long):
            for name in (b"LPOP", b"RPOP", b"LPOP", b"LPOP", b"RPOP", b"RPOP", b"LPOP"):
                before = value
                costs.append(_allocated(lambda n=name, v=value: rmw.apply(rmw.Command([n, b"L"], now_ms=1), v)))
                value = rmw.apply(rmw.Command([name, b"L"], now_ms=1), value)[0]
            assert list(value) == list(before)[:-1] if name == b"RPOP" else list(before)[1:]
    finally:
        tracemalloc.stop()
    assert max(costs) < 24 * 1024, costs  # the first pop at an end splits the chunk cells: never a copy
    assert rmw.apply(rmw.Command([b"RPOP", b"L", b"5"], now_ms=1), LiveList.of(0, [b"a", b"b", b"c"])) \
        == (None, b"*3\r\n$1\r\nc\r\n$1\r\nb\r\n$1\r\na\r\n")
    assert _generic(rmw.Command([b"RPOP", b"L", b"5"], now_ms=1), values.encode(Entry(LIST, 0, [b"a", b"b"])))[0] is None
