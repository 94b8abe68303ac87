"""Read commands over any key (TTL, TYPE, LRANGE, HGET, ZSCORE ...; GETRANGE and the bit reads in
strings.py, LPOS, ZMSCORE, the random draws and the SCAN family in members.py, the sorted-set ranges
in zranges.py, OBJECT ENCODING below), as pure functions.

Each takes the command, the live entry a read replica holds (values.live: None when absent
or past its deadline) and the instant of the read (Unix ms), and returns the RESP answer.
They are served where the controlet serves GET (the chain tail, any ms-ec replica, the
aa-sc replica after its READ round), so they are exactly as consistent as GET.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlsyskit.tools.kv.redis import live, members, resp, strings, values, zranges
from mlsyskit.tools.kv.redis.datatypes import CommandError, _int, _of, _span, fmt_score
from mlsyskit.tools.kv.redis.livelist import LiveList
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.livestring import LiveString
from mlsyskit.tools.kv.redis.values import HASH, LIST, SET, STRING, TYPE_NAMES, ZSET, Entry, WrongType


def _ttl(cmd: list, entry: Entry | None, now: int) -> bytes:
    """TTL/PTTL: -2 absent, -1 no deadline, else what is left (TTL rounds like Redis)."""
    if entry is None:
        return resp.integer(-2)
    if not entry.deadline:
        return resp.integer(-1)
    left = max(entry.deadline - now, 0)
    return resp.integer(left if cmd[0] == b"PTTL" else (left + 500) // 1000)


def _expiretime(cmd: list, entry: Entry | None, now: int) -> bytes:
    if entry is None:
        return resp.integer(-2)
    if not entry.deadline:
        return resp.integer(-1)
    return resp.integer(entry.deadline if cmd[0] == b"PEXPIRETIME" else entry.deadline // 1000)


def _type(cmd: list, entry: Entry | None, now: int) -> bytes:
    return b"+%b\r\n" % (b"none" if entry is None else TYPE_NAMES[entry.kind])


def _strlen(cmd: list, entry: Entry | None, now: int) -> bytes:
    return resp.integer(len(values.string_of(entry) or b""))


def _len(kind: bytes):
    def handler(cmd: list, entry: Entry | None, now: int) -> bytes:
        return resp.integer(0 if entry is None else len(_of(entry, kind, None).data))
    return handler


def _lrange(cmd: list, entry: Entry | None, now: int) -> bytes:
    start, stop = _int(cmd[2]), _int(cmd[3])
    if entry is None:
        return resp.EMPTY_ARRAY
    data = _of(entry, LIST, None).data
    a, b = _span(len(data), start, stop)
    return resp.array(data[a:b])


def _lindex(cmd: list, entry: Entry | None, now: int) -> bytes:
    index = _int(cmd[2])
    if entry is None:
        return resp.NULL
    data = _of(entry, LIST, None).data
    return resp.bulk(data[index] if -len(data) <= index < len(data) else None)


def _members(kind: bytes, fields: bool, vals: bool):
    """SMEMBERS, HKEYS, HVALS, HGETALL."""
    def handler(cmd: list, entry: Entry | None, now: int) -> bytes:
        if entry is None:
            return resp.EMPTY_ARRAY
        data = _of(entry, kind, None).data
        if fields and vals:
            return resp.array([x for pair in data.items() for x in pair])
        return resp.array(list(data.keys() if fields else data.values()))
    return handler


def _sismember(cmd: list, entry: Entry | None, now: int) -> bytes:
    found = entry is not None and cmd[2] in _of(entry, SET, None).data
    return resp.ONE if found else resp.ZERO


def _smismember(cmd: list, entry: Entry | None, now: int) -> bytes:
    data = {} if entry is None else _of(entry, SET, None).data
    return b"*%d\r\n" % (len(cmd) - 2) + b"".join(resp.ONE if m in data else resp.ZERO for m in cmd[2:])


def _hget(cmd: list, entry: Entry | None, now: int) -> bytes:
    return resp.bulk(None if entry is None else _of(entry, HASH, None).data.get(cmd[2]))


def _hmget(cmd: list, entry: Entry | None, now: int) -> bytes:
    data = {} if entry is None else _of(entry, HASH, None).data
    return resp.array([data.get(f) for f in cmd[2:]])


def _hexists(cmd: list, entry: Entry | None, now: int) -> bytes:
    return resp.ONE if entry is not None and cmd[2] in _of(entry, HASH, None).data else resp.ZERO


def _zscore(cmd: list, entry: Entry | None, now: int) -> bytes:
    score = None if entry is None else _of(entry, ZSET, None).data.get(cmd[2])
    return resp.bulk(None if score is None else fmt_score(score))


Handler = Callable[[list, Entry | None, int], bytes]
READS: dict[bytes, tuple[int, Handler]] = {  # name: (Redis arity, handler)
    b"TTL": (2, _ttl), b"PTTL": (2, _ttl), b"EXPIRETIME": (2, _expiretime), b"PEXPIRETIME": (2, _expiretime),
    b"TYPE": (2, _type), b"STRLEN": (2, _strlen),
    b"LLEN": (2, _len(LIST)), b"LRANGE": (4, _lrange), b"LINDEX": (3, _lindex),
    b"SCARD": (2, _len(SET)), b"SMEMBERS": (2, _members(SET, True, False)), b"SISMEMBER": (3, _sismember),
    b"SMISMEMBER": (-3, _smismember),
    b"HGET": (3, _hget), b"HMGET": (-3, _hmget), b"HGETALL": (2, _members(HASH, True, True)),
    b"HLEN": (2, _len(HASH)), b"HEXISTS": (3, _hexists), b"HKEYS": (2, _members(HASH, True, False)),
    b"HVALS": (2, _members(HASH, False, True)),
    b"ZCARD": (2, _len(ZSET)), b"ZSCORE": (3, _zscore), **zranges.READS, **strings.READS, **members.READS,
}


def object_encoding(stored: Any, now_ms: int) -> bytes:
    """OBJECT ENCODING's answer: how this replica really holds the value, in bespokv's own words
    (Redis's names describe structures bespokv does not have): a string's bytes "raw", an APPENDed
    string "rope" (livestring.py), a list "chunklist" (livelist.py), a set or hash "hashtrie" and a
    sorted set "hashtrie+btree" (livemap.py, counted.py), a collection kept as its record's bytes (a
    blob datalet such as lmdb) "msgpack"."""
    entry = live.read_entry(b"TYPE", stored, now_ms)  # a live value's kind and deadline: nothing decoded
    if entry is None:
        return resp.NULL
    cls = stored.__class__
    if cls is LiveString:
        return resp.bulk(b"rope")
    if cls is LiveList:
        return resp.bulk(b"chunklist")
    if cls is LiveMap:
        return resp.bulk(b"hashtrie+btree" if entry.kind == ZSET else b"hashtrie")
    return resp.bulk(b"raw" if entry.kind == STRING else b"msgpack")


def answer(cmd: list, stored: Any, now_ms: int) -> bytes:
    """A read command's answer from a replica's stored bytes or live value (live.read_entry: a point
    or size read of a live collection looks into its structure instead of decoding it)."""
    try:
        if cmd[0] == b"OBJECT":  # OBJECT ENCODING key: looks at the stored form itself
            return object_encoding(stored, now_ms)
        entry = live.read_entry(cmd[0], stored, now_ms)
        return READS[cmd[0]][1](cmd, entry, now_ms)
    except values.CorruptValue:
        return values.CORRUPT
    except WrongType:
        return values.WRONGTYPE
    except CommandError as e:
        return resp.error(f"ERR {e}")


def check(cmd: list) -> bytes | None:
    """A read command's argument error, found before it is sent anywhere (a dry run on an absent key)."""
    try:
        READS[cmd[0]][1](cmd, None, 0)
    except CommandError as e:
        return resp.error(f"ERR {e}")
    return None

