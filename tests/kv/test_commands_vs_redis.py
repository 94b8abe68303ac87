"""The everyday single-key commands added for ordinary Redis applications (GETEX, SETRANGE,
INCRBYFLOAT, HINCRBYFLOAT, LPOS, ZRANGEBYLEX, ZREMRANGEBY*, the SCAN family, SRANDMEMBER ...) answer
as a real redis-server does: one seeded random sequence over keys of every kind (so WRONGTYPE and
argument errors are in it) goes to Redis and, in process, to rmw.apply/queries.answer -- on the
memory datalet's live values and on plain record bytes (a blob datalet) -- and every answer must be
equal. Random draws (SRANDMEMBER, HRANDFIELD) are compared by what Redis defines: the count, the
distinctness, and membership. (The cluster-wide differential test is test_redis_types.py.)"""
from __future__ import annotations

import random
import re
import time

import pytest
import redis

from mlsyskit.tools.kv.ops.cluster import LocalCluster, node_datalet
from mlsyskit.tools.kv.redis import members, queries, rmw
from tests.kv.conftest import ThreadedCluster, make_map
from tests.kv.inprocess import execute
from tests.kv.test_collections_vs_redis import _value

pytestmark = pytest.mark.slow  # a redis-server, a cluster

KEYS = [b"s", b"n", b"l", b"h", b"t", b"z", b"zl", b"none"]
MEMBERS = [b"a", b"b", b"c", b"d", b"e"]
RANDOM = {b"SRANDMEMBER", b"HRANDFIELD"}
SCANS = {b"HSCAN", b"SSCAN", b"ZSCAN"}


def _setup() -> list[list[bytes]]:
    return [[b"SET", b"s", b"hello world"], [b"SET", b"n", b"10.5"], [b"RPUSH", b"l", *MEMBERS, b"a", b"c", b"a"],
            [b"HSET", b"h", b"a", b"1", b"b", b"2.5", b"c", b"x"], [b"SADD", b"t", *MEMBERS],
            [b"ZADD", b"z", b"1", b"a", b"2", b"b", b"2", b"c", b"3.5", b"d"],
            [b"ZADD", b"zl", *[x for m in MEMBERS for x in (b"0", m)]]]


def _lex(rng: random.Random) -> bytes:
    return rng.choice([b"-", b"+", b"[b", b"(b", b"[c", b"(d", b"[a", b"b", b"[", b"(z"])


def _command(rng: random.Random) -> list[bytes]:
    key, m = rng.choice(KEYS), rng.choice(MEMBERS)
    n, n2 = (b"%d" % rng.randint(-7, 7) for _ in range(2))
    flt = rng.choice([b"0.1", b"-2.5", b"1e3", b"abc", b"inf", b"3", b"0x10", b" 1", b"1.5e-3"])
    count = rng.choice([b"0", b"1", b"2", b"3", b"9", b"-2", b"-7", b"x"])
    return rng.choice([
        [b"GETSET", key, m], [b"GETEX", key], [b"GETEX", key, b"EX", b"100"], [b"GETEX", key, b"PERSIST"],
        [b"GETEX", key, b"PX", rng.choice([b"-1", b"0", b"x", b"100000"])], [b"GETEX", key, b"EX", b"5", b"PX", b"5"], [b"GETEX", key, b"EXAT", b"1"],
        [b"GETRANGE", key, n, n2], [b"SUBSTR", key, n, n2], [b"SETRANGE", key, rng.choice([b"0", b"3", b"14"]), m],
        [b"SETRANGE", key, n, b""], [b"INCRBYFLOAT", key, flt], [b"SETBIT", key, rng.choice([b"0", b"7", b"21"]), b"1"],
        [b"SETBIT", key, b"3", rng.choice([b"0", b"2"])], [b"GETBIT", key, rng.choice([b"0", b"9", b"99", b"-1"])],
        [b"BITCOUNT", key], [b"BITCOUNT", key, n, n2], [b"BITCOUNT", key, n, n2, rng.choice([b"BIT", b"BYTE", b"X"])],
        [b"HINCRBYFLOAT", key, m, flt], [b"HSTRLEN", key, m], [b"HRANDFIELD", key],
        [b"HRANDFIELD", key, count], [b"HRANDFIELD", key, count, b"WITHVALUES"],
        [b"SRANDMEMBER", key], [b"SRANDMEMBER", key, count],
        [b"LPOS", key, m], [b"LPOS", key, m, b"RANK", n], [b"LPOS", key, m, b"COUNT", count],
        [b"LPOS", key, m, b"RANK", rng.choice([b"1", b"-1", b"2"]), b"COUNT", b"0", b"MAXLEN", rng.choice([b"0", b"3"])],
        [b"ZMSCORE", key, m, b"zz"], [b"ZRANGEBYLEX", key, _lex(rng), _lex(rng)],
        [b"ZREVRANGEBYLEX", key, _lex(rng), _lex(rng), b"LIMIT", n, n2], [b"ZLEXCOUNT", key, _lex(rng), _lex(rng)],
        [b"ZRANGE", key, _lex(rng), _lex(rng), b"BYLEX", *rng.choice([[], [b"REV"], [b"WITHSCORES"]])],
        [b"ZRANGEBYLEX", key, b"-", b"+", b"LIMIT", b"1", b"2"],
        [b"ZREMRANGEBYSCORE", key, rng.choice([b"1", b"(2", b"-inf"]), rng.choice([b"2", b"+inf", b"(3.5"])],
        [b"ZREMRANGEBYRANK", key, n, n2], [b"ZREMRANGEBYLEX", key, _lex(rng), _lex(rng)],
        [b"HSCAN", key, b"0"], [b"SSCAN", key, b"0", b"MATCH", rng.choice([b"[ab]", b"*", b"[^a]", b"c?"])],
        [b"ZSCAN", key, b"0", b"COUNT", count], [b"HSCAN", key, b"x"],
        [b"ZADD", key, b"0", m], [b"HSET", key, m, b"4"], [b"SADD", key, m], [b"RPUSH", key, m], [b"SET", key, m],
    ])


def _members(real: redis.Connection, key: bytes) -> set:
    real.send_command("TYPE", key)
    kind = real.read_response()
    if kind not in (b"set", b"hash"):
        return set()
    real.send_command("SMEMBERS" if kind == b"set" else "HKEYS", key)
    return set(real.read_response())


def _same_draw(command: list[bytes], ours, theirs, members: set) -> bool:
    """A random draw: same shape, size and distinctness as Redis's, from the key's members."""
    if not isinstance(ours, list) or not isinstance(theirs, list):
        return (ours is None) == (theirs is None) and (ours is None or ours in members or isinstance(ours, tuple))
    withvalues = len(command) == 4
    picked = ours[0::2] if withvalues else ours
    distinct = len(set(picked)) == len(picked) or int(command[2]) < 0  # a negative count may repeat
    return len(ours) == len(theirs) and set(picked) <= members and distinct


@pytest.mark.parametrize("as_live", [True, False], ids=["live", "bytes"])
def test_new_commands_answer_as_real_redis_does(redis_port: int, as_live: bool, monkeypatch) -> None:
    monkeypatch.setattr(members, "_rng", random.Random(7))  # our draws replay; Redis's are checked by property
    real = redis.Connection(host="127.0.0.1", port=redis_port, db=43 if as_live else 44, protocol=2)
    rng = random.Random(2027)
    for round_ in range(6):
        real.send_command("FLUSHDB")
        real.read_response()
        store: dict = {}
        for command in _setup():
            real.send_command(*command)
            real.read_response()
            execute(command, store, 1_000, as_live)
        for i in range(250):
            command = _command(rng)
            real.send_command(*command)  # raw replies: no client-side parsing
            try:
                theirs = real.read_response()
            except redis.ResponseError as e:
                theirs = ("error", str(e))
            ours = _value(execute(command, store, 1_000, as_live))
            name = command[0]
            if name in RANDOM and not isinstance(theirs, tuple):
                assert _same_draw(command, ours, theirs, _members(real, command[1])), (round_, i, command, ours, theirs)
                continue
            if name in SCANS and isinstance(theirs, list):
                ours, theirs = [ours[0], sorted(ours[1])], [theirs[0], sorted(theirs[1])]
            assert ours == theirs, (round_, i, command, ours, theirs)
            real.send_command("TYPE", command[1])
            ours_type = _value(queries.answer(rmw.Command([b"TYPE", command[1]]), store.get(command[1]), 1_000))
            assert ours_type == real.read_response(), (round_, i, command, "the key's kind differs afterwards")
    real.disconnect()


def test_front_end_commands_through_a_cluster() -> None:
    """OBJECT ENCODING served where GET is (forwarded from the chain head to the tail), its other
    subcommands, TIME on the node's clock, UNLINK/TOUCH, WATCH refused as MULTI is, and the command
    table redis-py's RedisCluster routes by."""
    smap = make_map("ms-sc", shards=1, replicas=3)
    with ThreadedCluster(LocalCluster(smap, lambda n: node_datalet("memory", n))) as tc:
        head = tc.cluster.map.nodes[smap.shards[0][0]]
        r = redis.Redis(head.host, head.port, protocol=2)
        r.rpush("l", "a")
        r.append("s", "x")
        assert [r.object("encoding", k) for k in ("l", "s", "none")] == [b"chunklist", b"rope", None]
        for bad, message in ((("OBJECT", "REFCOUNT", "l"), "not supported by bespokv"),
                             (("OBJECT", "FOO", "l"), "unknown subcommand 'FOO'. Try OBJECT HELP."),
                             (("OBJECT", "ENCODING"), "wrong number of arguments for 'object|encoding' command"),
                             (("WATCH", "l"), "WATCH is not supported by bespokv"),
                             (("WATCH",), "wrong number of arguments for 'watch' command")):
            with pytest.raises(redis.ResponseError, match=re.escape(message)):
                r.execute_command(*bad)
        assert r.execute_command("UNWATCH") is True and r.get("s") == b"x"  # the connection stays usable
        seconds, micros = r.time()
        assert abs(seconds + micros / 1e6 - time.time()) < 5
        assert r.touch("l", "s", "none", "l") == 3 and r.unlink("l", "none") == 1 and r.exists("l") == 0
        info = r.execute_command("COMMAND", "INFO", "OBJECT", "UNLINK", "GETEX")
        assert info["object"]["first_key_pos"] == 2 and info["unlink"]["last_key_pos"] == -1
        assert "write" in info["getex"]["flags"]
        r.close()
