"""Point and size reads of a live value (HGET, SISMEMBER, ZSCORE, HEXISTS, SCARD, HLEN, ZCARD, LLEN,
LINDEX, LRANGE, TTL, TYPE ...) answer from its structure (redis/live.py read_entry: livemap.MapView,
livelist.ListView), never decoding the other members (issue 22 item 1): answers checked byte for
byte against the decode path on random values, costs checked structurally (bytes allocated per read
at 10 vs 20,000 members), never by timing."""
from __future__ import annotations

import random
import tracemalloc

import pytest

from mlsyskit.tools.kv.controlets.base import Read
from mlsyskit.tools.kv.datalets.memory import MemoryDatalet
from mlsyskit.tools.kv.node.interpreter import Interpreter
from mlsyskit.tools.kv.redis import live, members, queries, rmw, values
from mlsyskit.tools.kv.redis.livelist import ListView, LiveList
from mlsyskit.tools.kv.redis.livemap import LiveMap, MapView
from mlsyskit.tools.kv.redis.values import HASH, SET, ZSET
from tests.kv.test_live_collections import BIG, MEMBERS, N, _generic, _random_command
from tests.kv.test_live_lists import _allocated

READ_NAMES = sorted(set(queries.READS) - members.DRAWS)  # a random draw answers differently each time


def _random_read(rng: random.Random, span: int) -> list[bytes]:
    name = rng.choice(READ_NAMES)
    arity = queries.READS[name][0]
    if name in (b"ZRANGEBYSCORE", b"ZREVRANGEBYSCORE", b"ZCOUNT") or name == b"ZRANGE" and rng.random() < 0.4:
        return [name, b"K", *random_bounds(rng), *(random_range_options(rng, name) if name != b"ZCOUNT" else [])]
    if name in (b"LRANGE", b"ZRANGE", b"ZREVRANGE"):
        args = [b"%d" % rng.randrange(-span - 3, span + 3) for _ in range(2)]
        if name != b"LRANGE" and rng.random() < 0.5:
            args.append(b"WITHSCORES")
        if name == b"ZRANGE" and rng.random() < 0.3:
            args += rng.choice([[b"REV"], [b"LIMIT", b"0", b"-1"], [b"LIMIT", b"1", b"2"]])
    elif name == b"LINDEX":
        args = [b"%d" % rng.choice([0, -1, rng.randrange(-span - 3, span + 3)])]
    elif abs(arity) == 3:
        args = [b"m%d" % rng.randrange(span) for _ in range(1 if arity == 3 else rng.choice([1, 3]))]
    elif abs(arity) == 4:  # GETRANGE, ZLEXCOUNT, ZRANGEBYLEX ...: two bounds, good for some commands
        args = [rng.choice([b"0", b"-1", b"[m1", b"(m3", b"-", b"+"]) for _ in range(2)]
    else:
        args = []
    return [name, b"K", *args]


def random_bounds(rng: random.Random) -> list[bytes]:
    """Two score bounds (the scores _random_command writes are -3 .. 9, 2.5 and inf), now and then bad."""
    bound = [b"-inf", b"+inf", b"inf", b"0", b"(0", b"-0", b"1", b"(1", b"2.5", b"(2.5", b"4", b"(inf", b"(-inf", b"x"]
    return [rng.choice(bound[:-1] if rng.random() < 0.97 else bound) for _ in range(2)]


def random_range_options(rng: random.Random, name: bytes) -> list[bytes]:
    groups = [rng.choice([[b"WITHSCORES"], [b"LIMIT", b"%d" % rng.choice([-1, 0, 1, 3]), b"%d" % rng.choice([-1, 0, 2, 9])]])
              for _ in range(rng.choice([0, 1, 1, 2]))]
    if name == b"ZRANGE":
        groups += [[b"BYSCORE"]] + ([[b"REV"]] if rng.random() < 0.5 else [])
        rng.shuffle(groups)  # Redis takes ZRANGE's options in any order
    return [x for group in groups for x in group]


def test_every_read_of_a_live_value_answers_exactly_what_the_decode_path_does() -> None:
    """Random writes (every kind, pops, removals that compact, expiry) build a live value and the
    bytes the generic path stores; after each, random reads of both (at instants before and after
    a deadline) must answer the same bytes, and the point/size reads must have used a view."""
    rng = random.Random(11)
    viewed = 0
    for trial in range(6):
        span = (5, 40, 400)[trial % 3]
        current: object = None
        raw: bytes | None = None
        for step in range(200):
            cmd = rmw.Command(_random_command(rng, span), now_ms=rng.randrange(1, 10), max_bytes=10**6)
            after, _ = rmw.apply(cmd, current)
            raw, _ = _generic(cmd, raw)
            current = live.promote(after) if after.__class__ is bytes else after
            for _ in range(6):
                read = rmw.Command(_random_read(rng, span))
                now = rng.randrange(1, 25)
                assert queries.answer(read, current, now) == queries.answer(read, raw, now), (trial, step, read)
                assert values.get_answer(current, now) == values.get_answer(raw, now), (trial, step)
                entry = live.read_entry(read[0], current, now)
                if read[0] in live.VIEWED_READS and isinstance(current, LiveMap | LiveList) and entry is not None:
                    assert type(entry.data) is (MapView if isinstance(current, LiveMap) else ListView)
                    viewed += 1
    assert viewed > 600, viewed  # the comparison above covered the views, not only the decode path


def test_a_list_view_indexes_and_slices_as_the_list_does() -> None:
    """Every index and span of lists pushed from either end and popped (elements split between the
    front and back chunk lists in every proportion)."""
    rng = random.Random(3)
    for _ in range(40):
        value, items = LiveList.of(0, []), []
        for _ in range(rng.randrange(1, 8)):
            new = [b"e%d" % rng.randrange(10**6) for _ in range(rng.choice([1, 5, 64, 130]))]
            right = rng.random() < 0.5
            value = value.pushed(new, right=right)
            items = items + new if right else new[::-1] + items
            if rng.random() < 0.3:
                left, n = rng.random() < 0.5, rng.randrange(1, 70)
                popped, _ = value.popped(n, left=left)
                items = items[n:] if left else items[:max(len(items) - n, 0)]
                value = popped or LiveList.of(0, [])
        view = ListView(value)
        assert len(view) == len(items)
        for i in range(-len(items), len(items)):
            assert view[i] == items[i]
        for a in range(0, len(items) + 1, 7):
            for b in (a, a + 1, a + 70, len(items)):
                assert view[a:b] == items[a:b]
        with pytest.raises(IndexError):
            view[len(items)]


POINT_READS = {SET: [[b"SISMEMBER", b"K", MEMBERS[123]], [b"SCARD", b"K"], [b"SMISMEMBER", b"K", b"x", MEMBERS[5]]],
               HASH: [[b"HGET", b"K", MEMBERS[123][-20:]], [b"HLEN", b"K"], [b"HEXISTS", b"K", b"x"]],
               ZSET: [[b"ZSCORE", b"K", MEMBERS[123]], [b"ZCARD", b"K"], [b"TTL", b"K"]]}


@pytest.mark.parametrize("kind", [SET, HASH, ZSET])
def test_a_point_read_allocates_the_same_at_10_and_at_20000_members(kind: bytes) -> None:
    """A decode of the 2 MB value (or a dict of its members) would show in the peak."""
    short = LiveMap.of(kind, 0, dict(list(BIG[kind].items())[:130]))
    long = LiveMap.of(kind, 0, BIG[kind])
    lists = LiveList.of(0, MEMBERS[:130]), LiveList.of(0, MEMBERS).pushed([b"left"], right=False)
    list_reads = [[b"LLEN", b"K"], [b"LINDEX", b"K", b"0"], [b"LINDEX", b"K", b"-1"], [b"LRANGE", b"K", b"-3", b"-1"]]
    tracemalloc.start()
    try:
        for cmd in map(rmw.Command, POINT_READS[kind]):
            costs = [_allocated(lambda v=v, c=cmd: queries.answer(c, v, 1)) for v in (short, long, short, long)]
            assert max(costs) < 4 * 1024, (cmd, costs)
        costs = [_allocated(lambda v=v: values.get_answer(v, 1)) for v in (short, long, *lists)]
        assert max(costs) < 4 * 1024, ("GET", costs)  # WRONGTYPE from the header
        for cmd in map(rmw.Command, list_reads):
            costs = [_allocated(lambda v=v, c=cmd: queries.answer(c, v, 1)) for v in lists]
            assert max(costs) < 8 * 1024, (cmd, costs)
    finally:
        tracemalloc.stop()
    assert queries.answer(rmw.Command([b"LINDEX", b"K", b"0"]), lists[1], 1) == b"$4\r\nleft\r\n"


class _Answers:
    def __init__(self) -> None:
        self.got: list = []

    def answer(self, req, stored) -> None:
        self.got.append(stored)


class _Req:
    def __init__(self, key: bytes, command: list | None) -> None:
        self.key, self.rmw = key, command


def test_the_node_read_path_hands_a_query_the_live_value_and_a_get_the_bytes() -> None:
    """The interpreter's Read (a tail's or a replica's read behind writes): a query gets the value
    as held (then answered from its view), GET/EXISTS the record's bytes, as before."""
    datalet = MemoryDatalet()
    value = LiveMap.of(HASH, 0, {b"f": b"v"})
    datalet.put(b"K", value)
    answers = _Answers()
    interpreter = Interpreter(datalet, answers, {})
    interpreter.execute([Read(_Req(b"K", rmw.Command([b"HGET", b"K", b"f"]))), Read(_Req(b"K", None))])
    assert answers.got[0] is value and answers.got[1] == value.stored() and type(answers.got[1]) is bytes
    assert queries.answer(rmw.Command([b"HGET", b"K", b"f"]), answers.got[0], 1) == b"$1\r\nv\r\n"
    assert len(MEMBERS) == N
