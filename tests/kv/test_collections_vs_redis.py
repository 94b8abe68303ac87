"""The collection commands whose live forms issue 22 item 1 added (the sorted-set range reads and pops
off the score index, LSET/LTRIM/LREM/LINSERT on a live list) answer as a real redis-server does: one
seeded random sequence goes to Redis and, in process, to rmw.apply/queries.answer on the memory
datalet's live value; every answer must be equal. (The cluster-wide differential test of every
command is test_redis_types.py.)"""
from __future__ import annotations

import random

import hiredis
import pytest
import redis

from tests.kv.inprocess import execute
from tests.kv.test_live_reads import random_bounds, random_range_options

pytestmark = pytest.mark.slow  # a redis-server

MEMBERS = [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]


def _zset_command(rng: random.Random) -> list[bytes]:
    m = rng.choice(MEMBERS)
    score = rng.choice([b"1", b"2.5", b"-3", b"0", b"inf", b"-inf", b"4"])
    name = rng.choice([b"ZADD", b"ZADD", b"ZINCRBY", b"ZREM", b"ZPOPMIN", b"ZPOPMAX", b"ZRANGE", b"ZREVRANGE",
                       b"ZRANGEBYSCORE", b"ZREVRANGEBYSCORE", b"ZCOUNT", b"ZRANK", b"ZREVRANK", b"ZCARD"])
    if name == b"ZADD":
        return [name, b"z", *rng.choice([[], [b"NX"], [b"XX", b"CH"], [b"GT"]]), score, m]
    if name == b"ZINCRBY":
        return [name, b"z", score if score not in (b"inf", b"-inf") else b"1", m]
    if name == b"ZREM":
        return [name, b"z", m, rng.choice(MEMBERS)]
    if name in (b"ZPOPMIN", b"ZPOPMAX"):
        return [name, b"z", *rng.choice([[], [b"0"], [b"2"], [b"9"]])]
    if name in (b"ZRANK", b"ZREVRANK"):
        return [name, b"z", m]
    if name == b"ZCARD":
        return [name, b"z"]
    if name == b"ZREVRANGE" or name == b"ZRANGE" and rng.random() < 0.4:
        n = [b"%d" % rng.randint(-9, 9) for _ in range(2)]
        return [name, b"z", *n, *([b"WITHSCORES"] if rng.random() < 0.5 else [])]
    return [name, b"z", *random_bounds(rng), *([] if name == b"ZCOUNT" else random_range_options(rng, name))]


def _list_command(rng: random.Random) -> list[bytes]:
    m, n = rng.choice(MEMBERS), b"%d" % rng.randint(-8, 8)
    return rng.choice([
        [b"RPUSH", b"l", m, rng.choice(MEMBERS)], [b"LPUSH", b"l", m], [b"RPUSH", b"l", *MEMBERS[:rng.randint(1, 7)]],
        [b"LPOP", b"l"], [b"RPOP", b"l", b"2"], [b"LSET", b"l", n, m], [b"LTRIM", b"l", n, b"%d" % rng.randint(-8, 8)],
        [b"LTRIM", b"l", b"0", b"-2"], [b"LREM", b"l", b"%d" % rng.randint(-2, 2), m],
        [b"LINSERT", b"l", rng.choice([b"BEFORE", b"AFTER", b"before"]), m, rng.choice(MEMBERS)],
        [b"LRANGE", b"l", b"0", b"-1"], [b"LINDEX", b"l", n], [b"LLEN", b"l"],
    ])


def _value(answer: bytes):
    reader = hiredis.Reader()
    reader.feed(answer)
    value = reader.gets()
    return ("error", str(value).removeprefix("ERR ")) if isinstance(value, hiredis.ReplyError) else value


@pytest.mark.parametrize("kind", ["zset", "list"])
def test_a_random_sequence_answers_as_real_redis_does(redis_port: int, kind: str) -> None:
    real = redis.Connection(host="127.0.0.1", port=redis_port, db=41 if kind == "zset" else 42, protocol=2)
    real.send_command("FLUSHDB")
    real.read_response()
    make = _zset_command if kind == "zset" else _list_command
    rng = random.Random(22)
    store: dict = {}
    for i in range(1500):
        command = make(rng)
        real.send_command(*command)  # raw replies: no client-side parsing of scores or OK
        try:
            theirs = real.read_response()
        except redis.ResponseError as e:
            theirs = ("error", str(e))
        ours = _value(execute(command, store, 1))
        assert ours == theirs, (i, command, ours, theirs)
    real.disconnect()
