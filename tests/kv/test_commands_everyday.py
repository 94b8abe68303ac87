"""The everyday single-key commands an ordinary Redis application sends (GETEX, SETRANGE, INCRBYFLOAT,
HINCRBYFLOAT, LPOS, ZRANGEBYLEX, ZREMRANGEBY*, the SCAN family, SRANDMEMBER, OBJECT ENCODING ...):
their answers and effects in process, against the answers a real Redis 7.0 gives (recorded from
redis-server 7.0.15; test_commands_vs_redis.py compares with a live one), how the writes replicate,
and the value limit checked before anything is built."""
from __future__ import annotations

import random

import pytest

from mlsyskit.tools.kv.frontend import admin
from mlsyskit.tools.kv.frontend.commands import HANDLERS
from mlsyskit.tools.kv.redis import live, members, queries, rmw, values
from mlsyskit.tools.kv.redis.glob import matcher
from mlsyskit.tools.kv.redis.values import HASH, SET, STRING, ZSET, Entry
from tests.kv.inprocess import execute

NOW = 1_000_000


def run(commands: list[list[bytes]], as_live: bool = True) -> tuple[list[bytes], dict]:
    """Each command's RESP answer, applied in order to one in-process keyspace (live values or bytes)."""
    store: dict = {}
    answers = [execute(command, store, NOW, as_live) for command in commands]
    return answers, store


CASES = [  # (commands, the answers Redis 7.0 gives)
    ([[b"SET", b"s", b"hello"], [b"GETRANGE", b"s", b"-3", b"-1"], [b"SUBSTR", b"s", b"2", b"-100"],
      [b"GETRANGE", b"s", b"-100", b"-200"], [b"GETRANGE", b"none", b"0", b"-1"]],
     [b"+OK\r\n", b"$3\r\nllo\r\n", b"$0\r\n\r\n", b"$0\r\n\r\n", b"$0\r\n\r\n"]),
    ([[b"SETRANGE", b"s", b"-1", b"x"], [b"SETRANGE", b"none", b"5", b""], [b"SETRANGE", b"s", b"3", b"ab"],
      [b"GETRANGE", b"s", b"0", b"-1"], [b"SETRANGE", b"s", b"1", b""]],
     [b"-ERR offset is out of range\r\n", b":0\r\n", b":5\r\n", b"$5\r\n\x00\x00\x00ab\r\n", b":5\r\n"]),
    ([[b"INCRBYFLOAT", b"f", b"0.1"], [b"INCRBYFLOAT", b"f", b"0.2"], [b"INCRBYFLOAT", b"f", b"abc"],
      [b"INCRBYFLOAT", b"f", b"inf"], [b"INCRBYFLOAT", b"g", b"0x10"], [b"INCRBYFLOAT", b"g", b" 1"],
      [b"INCRBYFLOAT", b"h", b"-0"], [b"INCRBYFLOAT", b"h", b"5.0e3"]],
     [b"$3\r\n0.1\r\n", b"$3\r\n0.3\r\n", b"-ERR value is not a valid float\r\n",
      b"-ERR increment would produce NaN or Infinity\r\n", b"$2\r\n16\r\n", b"-ERR value is not a valid float\r\n",
      b"$1\r\n0\r\n", b"$4\r\n5000\r\n"]),
    ([[b"SET", b"s", b"v"], [b"GETSET", b"s", b"w"], [b"GETSET", b"none", b"x"], [b"RPUSH", b"l", b"a"],
      [b"GETSET", b"l", b"y"]],
     [b"+OK\r\n", b"$1\r\nv\r\n", b"$-1\r\n", b":1\r\n", values.WRONGTYPE]),
    ([[b"SET", b"s", b"v"], [b"GETEX", b"s", b"EX", b"0"], [b"GETEX", b"s", b"EX", b"10", b"EX", b"20"],
      [b"TTL", b"s"], [b"GETEX", b"s", b"EX", b"10", b"PX", b"20"], [b"GETEX", b"s", b"PERSIST"], [b"TTL", b"s"],
      [b"GETEX", b"s", b"KEEPTTL"], [b"GETEX", b"none", b"EX", b"abc"], [b"GETEX", b"s", b"EXAT", b"1"],
      [b"TYPE", b"s"]],
     [b"+OK\r\n", b"-ERR invalid expire time in 'getex' command\r\n", b"$1\r\nv\r\n", b":20\r\n",
      b"-ERR syntax error\r\n", b"$1\r\nv\r\n", b":-1\r\n", b"-ERR syntax error\r\n", b"$-1\r\n", b"$1\r\nv\r\n",
      b"+none\r\n"]),
    ([[b"SETBIT", b"b", b"7", b"1"], [b"SETBIT", b"b", b"7", b"0"], [b"SETBIT", b"b", b"1", b"1"],
      [b"SETBIT", b"b", b"3", b"2"], [b"GETBIT", b"b", b"1"], [b"GETBIT", b"b", b"99"], [b"SET", b"t", b"foobar"],
      [b"BITCOUNT", b"t"], [b"BITCOUNT", b"t", b"1", b"1"], [b"BITCOUNT", b"t", b"5", b"30", b"BIT"],
      [b"BITCOUNT", b"t", b"-5", b"-6", b"X"], [b"BITCOUNT", b"t", b"0"], [b"BITCOUNT", b"none", b"0"]],
     [b":0\r\n", b":1\r\n", b":0\r\n", b"-ERR bit is not an integer or out of range\r\n", b":1\r\n", b":0\r\n",
      b"+OK\r\n", b":26\r\n", b":6\r\n", b":17\r\n", b":0\r\n", b"-ERR syntax error\r\n", b":0\r\n"]),
    ([[b"HSET", b"h", b"f", b"10.5", b"g", b"abc"], [b"HINCRBYFLOAT", b"h", b"f", b"0.1"],
      [b"HINCRBYFLOAT", b"h", b"g", b"1"], [b"HINCRBYFLOAT", b"h", b"f", b"inf"], [b"HSTRLEN", b"h", b"f"],
      [b"HSTRLEN", b"h", b"zz"], [b"HRANDFIELD", b"h", b"1", b"x"], [b"HRANDFIELD", b"none", b"2"],
      [b"HSCAN", b"h", b"0", b"MATCH", b"[^g]"], [b"HSCAN", b"none", b"0", b"COUNT", b"0"], [b"HSCAN", b"h", b"x"],
      [b"HSCAN", b"h", b"0", b"COUNT", b"0"], [b"HSCAN", b"h", b"7"]],
     [b":2\r\n", b"$4\r\n10.6\r\n", b"-ERR hash value is not a float\r\n", b"-ERR value is NaN or Infinity\r\n",
      b":4\r\n", b":0\r\n", b"-ERR syntax error\r\n", b"*0\r\n", b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\nf\r\n$4\r\n10.6\r\n",
      b"*2\r\n$1\r\n0\r\n*0\r\n", b"-ERR invalid cursor\r\n", b"-ERR syntax error\r\n",
      b"-ERR invalid cursor (bespokv answers a SCAN of a key in one call, with cursor 0)\r\n"]),
    ([[b"RPUSH", b"l", b"a", b"b", b"c", b"1", b"2", b"3", b"c", b"c"], [b"LPOS", b"l", b"c"],
      [b"LPOS", b"l", b"c", b"RANK", b"2"], [b"LPOS", b"l", b"c", b"RANK", b"-1"], [b"LPOS", b"l", b"c", b"COUNT", b"2"],
      [b"LPOS", b"l", b"c", b"RANK", b"-1", b"COUNT", b"0"], [b"LPOS", b"l", b"c", b"COUNT", b"0", b"MAXLEN", b"4"],
      [b"LPOS", b"l", b"x"], [b"LPOS", b"none", b"x", b"COUNT", b"1"], [b"LPOS", b"l", b"c", b"RANK", b"0"],
      [b"LPOS", b"l", b"c", b"COUNT", b"x"], [b"LPOS", b"l", b"c", b"MAXLEN"]],
     [b":8\r\n", b":2\r\n", b":6\r\n", b":7\r\n", b"*2\r\n:2\r\n:6\r\n", b"*3\r\n:7\r\n:6\r\n:2\r\n", b"*1\r\n:2\r\n",
      b"$-1\r\n", b"*0\r\n", b"-ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... "
      b"or use negative to start from the end of the list\r\n", b"-ERR COUNT can't be negative\r\n",
      b"-ERR syntax error\r\n"]),
    ([[b"ZADD", b"z", b"0", b"a", b"0", b"b", b"0", b"c", b"0", b"d", b"0", b"e"],
      [b"ZRANGEBYLEX", b"z", b"-", b"[c"], [b"ZRANGEBYLEX", b"z", b"(b", b"+", b"LIMIT", b"1", b"2"],
      [b"ZREVRANGEBYLEX", b"z", b"[d", b"(a"], [b"ZLEXCOUNT", b"z", b"[b", b"(d"], [b"ZRANGEBYLEX", b"z", b"a", b"b"],
      [b"ZRANGE", b"z", b"[d", b"[b", b"BYLEX", b"REV", b"LIMIT", b"0", b"2"],
      [b"ZRANGEBYLEX", b"z", b"[a", b"[b", b"WITHSCORES"], [b"ZMSCORE", b"z", b"a", b"zz"],
      [b"ZREMRANGEBYLEX", b"z", b"[d", b"+"], [b"ZADD", b"z", b"5", b"x", b"7", b"y"],
      [b"ZREMRANGEBYSCORE", b"z", b"(0", b"5"], [b"ZREMRANGEBYRANK", b"z", b"0", b"-2"], [b"ZSCAN", b"z", b"0"],
      [b"ZREMRANGEBYSCORE", b"z", b"a", b"1"], [b"ZREMRANGEBYRANK", b"none", b"0", b"-1"]],
     [b":5\r\n", b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", b"*2\r\n$1\r\nd\r\n$1\r\ne\r\n",
      b"*3\r\n$1\r\nd\r\n$1\r\nc\r\n$1\r\nb\r\n", b":2\r\n", b"-ERR min or max not valid string range item\r\n",
      b"*2\r\n$1\r\nd\r\n$1\r\nc\r\n", b"-ERR syntax error, WITHSCORES not supported in combination with BYLEX\r\n",
      b"*2\r\n$1\r\n0\r\n$-1\r\n", b":2\r\n", b":2\r\n", b":1\r\n", b":3\r\n", b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\ny\r\n$1\r\n7\r\n",
      b"-ERR min or max is not a float\r\n", b":0\r\n"]),
    ([[b"SADD", b"t", b"a"], [b"SRANDMEMBER", b"t", b"1", b"2"], [b"SRANDMEMBER", b"none"],
      [b"SRANDMEMBER", b"t", b"-9223372036854775808"], [b"SSCAN", b"t", b"0", b"MATCH", b"\\a"]],
     [b":1\r\n", b"-ERR syntax error\r\n", b"$-1\r\n",
      b"-ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807\r\n",
      b"*2\r\n$1\r\n0\r\n*1\r\n$1\r\na\r\n"]),
]


@pytest.mark.parametrize("as_live", [True, False], ids=["live", "bytes"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_answers_are_redis_7_answers(case: int, as_live: bool) -> None:
    commands, expected = CASES[case]
    answers, _ = run(commands, as_live)
    for command, answer, want in zip(commands, answers, expected, strict=True):
        assert answer == want, (command, answer, want)


def test_incrbyfloat_keeps_the_ttl_and_replicates_the_stored_result() -> None:
    cmd = rmw.parse([b"INCRBYFLOAT", b"k", b"1.5"], now_ms=NOW)
    stored = values.encode(Entry(STRING, NOW + 5000, b"2"))
    after, answer = rmw.apply(cmd, stored)
    assert answer == b"$3\r\n3.5\r\n" and values.decode(after) == Entry(STRING, NOW + 5000, b"3.5")
    assert rmw.delta_of(cmd) is None  # a string: the write point's bytes go to the replicas, not the command


def test_hincrbyfloat_replicates_as_the_hset_of_its_result() -> None:
    for as_live in (True, False):
        _, store = run([[b"HSET", b"h", b"f", b"0.1"]], as_live)
        cmd = rmw.parse([b"HINCRBYFLOAT", b"h", b"f", b"0.2"], now_ms=NOW, max_bytes=4096)
        after, answer = rmw.apply(cmd, store[b"h"])
        assert answer == b"$3\r\n0.3\r\n"
        replica_cmd = rmw.from_delta(rmw.delta_of(cmd))
        assert list(replica_cmd) == [b"HSET", b"h", b"f", b"0.3"] and replica_cmd.max_bytes == 4096
        assert bytes(rmw.apply(replica_cmd, store[b"h"])[0]) == bytes(after)  # a replica's bytes are the write point's
        failed = rmw.parse([b"HINCRBYFLOAT", b"h", b"f", b"1"], now_ms=NOW)
        _, error = rmw.apply(failed, values.encode(Entry(HASH, 0, {b"f": b"x"})))
        assert error == b"-ERR hash value is not a float\r\n"
        no_op = rmw.from_delta(rmw.delta_of(failed))  # changes nothing on any replica's state
        for state in (None, values.encode(Entry(HASH, 0, {b"f": b"x"})), values.encode(Entry(SET, 0, {b"m": None}))):
            assert rmw.apply(no_op, state)[0] == state


def test_zremrange_commands_replicate_as_deltas_that_rebuild_the_same_bytes() -> None:
    for command in ([b"ZREMRANGEBYSCORE", b"z", b"(1", b"3"], [b"ZREMRANGEBYRANK", b"z", b"1", b"-2"],
                    [b"ZREMRANGEBYLEX", b"z", b"[b", b"(e"]):
        answers, store = run([[b"ZADD", b"z", b"1", b"a", b"2", b"b", b"3", b"c", b"3", b"d", b"9", b"e"], command])
        _, raw = run([[b"ZADD", b"z", b"1", b"a", b"2", b"b", b"3", b"c", b"3", b"d", b"9", b"e"], command], False)
        assert bytes(store[b"z"]) == raw[b"z"], command  # the live fast path leaves the decode path's bytes
        cmd = rmw.parse(command, now_ms=NOW)
        assert rmw.from_delta(rmw.delta_of(cmd)) == command


def test_setrange_and_setbit_check_the_value_limit_before_building_anything() -> None:
    stored = b"abc"
    cmd = rmw.parse([b"SETRANGE", b"k", b"%d" % (2 ** 40), b"x"], now_ms=NOW, max_bytes=1024)
    assert rmw.apply(cmd, stored) == (stored, values.string_too_large(1024))  # no 1 TiB string was made
    assert rmw.apply(rmw.parse([b"SETRANGE", b"k", b"1021", b"xyz"], max_bytes=1024), stored)[1] == b":1024\r\n"
    with pytest.raises(rmw.RmwSyntaxError, match="bit offset is not an integer or out of range"):
        rmw.parse([b"SETBIT", b"k", b"%d" % (1024 * 8), b"1"], max_bytes=1024)
    big = values.encode(Entry(values.LIST, 0, [b"x"]))
    assert rmw.apply(rmw.parse([b"SETRANGE", b"k", b"%d" % (2 ** 40), b"x"]), big) == (big, values.WRONGTYPE)


def test_draws_are_members_and_a_live_value_draws_as_its_bytes_do() -> None:
    _, live_store = run([[b"SADD", b"t", *[b"m%d" % i for i in range(40)]], [b"HSET", b"h", b"a", b"1", b"b", b"2"]])
    _, raw_store = run([[b"SADD", b"t", *[b"m%d" % i for i in range(40)]], [b"HSET", b"h", b"a", b"1", b"b", b"2"]],
                       False)
    for command in ([b"SRANDMEMBER", b"t", b"5"], [b"SRANDMEMBER", b"t", b"-50"], [b"SRANDMEMBER", b"t"],
                    [b"HRANDFIELD", b"h", b"-3", b"WITHVALUES"], [b"HRANDFIELD", b"h", b"5"]):
        answers = []
        for store in (live_store, raw_store):
            members._rng = random.Random(3)
            answers.append(queries.answer(rmw.Command(command), store[command[1]], NOW))
        assert answers[0] == answers[1], command
    members._rng = random.Random()
    drawn = queries.answer(rmw.Command([b"SRANDMEMBER", b"t", b"5"]), live_store[b"t"], NOW)
    picked = drawn.split(b"\r\n")[2::2]
    assert len(set(picked)) == 5 and all(p.startswith(b"m") for p in picked)
    assert queries.answer(rmw.Command([b"SRANDMEMBER", b"t", b"-2000000"]), live_store[b"t"], NOW).startswith(b"-ERR count")


def test_object_encoding_says_how_the_value_is_held() -> None:
    commands = [[b"SET", b"s", b"v"], [b"APPEND", b"r", b"x"], [b"RPUSH", b"l", b"a"], [b"SADD", b"t", b"a"],
                [b"HSET", b"h", b"f", b"v"], [b"ZADD", b"z", b"1", b"a"]]
    expected = {b"s": b"raw", b"r": b"rope", b"l": b"chunklist", b"t": b"hashtrie", b"h": b"hashtrie",
                b"z": b"hashtrie+btree", b"none": None}
    for as_live in (True, False):
        _, store = run(commands, as_live)
        for key, encoding in expected.items():
            if not as_live:  # a blob datalet's bytes: a string is raw, a collection its record
                encoding = b"raw" if key in (b"s", b"r") else None if key == b"none" else b"msgpack"
            assert queries.answer([b"OBJECT", b"ENCODING", key], store.get(key), NOW) == _bulk(encoding), (as_live, key)
    expired = values.encode(Entry(ZSET, NOW - 1, {b"a": 1.0}))
    assert queries.answer([b"OBJECT", b"ENCODING", b"z"], live.promote(expired), NOW) == b"$-1\r\n"


def _bulk(value: bytes | None) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%b\r\n" % (len(value), value)


def test_redis_glob_dialect() -> None:
    cases = [(b"h*llo", b"heeello", True), (b"h?llo", b"hallo", True), (b"h[^e]llo", b"hello", False),
             (b"h[^e]llo", b"hallo", True), (b"h[a-b]llo", b"hbllo", True), (b"h[b-a]llo", b"hallo", True),
             (b"h\\*", b"h*", True), (b"h\\*", b"hx", False), (b"a[]b", b"ab", False), (b"*", b"\n", True),
             (b"[!a]", b"!", True), (b"[!a]", b"b", False)]
    for pattern, text, want in cases:
        assert matcher(pattern)(text) is want, (pattern, text)


def test_the_command_table_routes_the_new_commands() -> None:
    for name in (b"GETEX", b"SETRANGE", b"INCRBYFLOAT", b"HINCRBYFLOAT", b"ZREMRANGEBYLEX", b"LPOS", b"HSCAN",
                 b"ZRANGEBYLEX", b"UNLINK", b"TOUCH", b"OBJECT", b"TIME", b"SETBIT", b"BITCOUNT"):
        assert name in HANDLERS and name in admin.ARITY, name
    assert admin.ARITY[b"OBJECT"][2:] == (2, 2, 1)  # redis-py's RedisCluster routes OBJECT ENCODING by its key
    assert admin.ARITY[b"UNLINK"][2:] == (1, -1, 1) and b"write" in admin.ARITY[b"GETEX"][1]
    assert b"readonly" in admin.ARITY[b"HSCAN"][1] and admin.ARITY[b"HINCRBYFLOAT"][0] == 4
