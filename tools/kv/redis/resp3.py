"""RESP3 shapes for the few answers where RESP3 differs from RESP2 (HELLO 3 clients, e.g. redis-py 8).

Everything else bespokv answers (simple, bulk, null bulk, integer, flat arrays) is valid
RESP3 as it is. Answers are computed in RESP2 wherever a command is resolved (a write
point, a read replica, a relaying node: links speak RESP2), and reshaped here once, by the
node that answers the client, when that client chose RESP3: a hash is a map, a set is a
set, a score is a double, ZRANGE WITHSCORES gives [member, score] pairs.
"""
from __future__ import annotations

import hiredis

from mlsyskit.tools.kv.redis import resp


def _double(score: bytes) -> bytes:
    return b",%b\r\n" % score


def _pairs(flat: list, nested: bool) -> bytes:
    pairs = [resp.bulk(m) + _double(s) for m, s in zip(flat[0::2], flat[1::2], strict=True)]
    if not nested:
        return b"*%d\r\n" % (2 * len(pairs)) + b"".join(pairs)
    return b"*%d\r\n" % len(pairs) + b"".join(b"*2\r\n" + p for p in pairs)


RANGES = (b"ZRANGE", b"ZREVRANGE", b"ZRANGEBYSCORE", b"ZREVRANGEBYSCORE")


def _reshape(cmd: list, value) -> bytes | None:
    name = cmd[0]
    if name == b"HGETALL":
        return b"%%%d\r\n" % (len(value) // 2) + b"".join(resp.bulk(v) for v in value)
    if name == b"SMEMBERS":
        return b"~%d\r\n" % len(value) + b"".join(resp.bulk(v) for v in value)
    if name in (b"ZSCORE", b"ZINCRBY") or name == b"ZADD" and b"INCR" in (a.upper() for a in cmd[2:]):
        return None if value is None else _double(value)
    if name in RANGES:
        return _pairs(value, True) if b"WITHSCORES" in (a.upper() for a in cmd[4:]) else None
    if name in (b"ZPOPMIN", b"ZPOPMAX"):
        return _pairs(value, len(cmd) > 2)
    if name == b"ZMSCORE":
        return b"*%d\r\n" % len(value) + b"".join(resp.NULL if s is None else _double(s) for s in value)
    if name == b"HRANDFIELD" and len(cmd) == 4:  # WITHVALUES: [field, value] pairs
        return b"*%d\r\n" % (len(value) // 2) + b"".join(
            b"*2\r\n" + resp.bulk(f) + resp.bulk(v) for f, v in zip(value[0::2], value[1::2], strict=True))
    return None


SHAPED = {b"HGETALL", b"SMEMBERS", b"ZSCORE", b"ZINCRBY", b"ZADD", *RANGES, b"ZPOPMIN", b"ZPOPMAX", b"ZMSCORE",
          b"HRANDFIELD"}


def shape(cmd: list, payload: bytes) -> bytes:
    """`payload` (a RESP2 answer to `cmd`) as a RESP3 client expects it."""
    if cmd[0] not in SHAPED or payload[:1] == b"-":
        return payload
    reader = hiredis.Reader()
    reader.feed(payload)
    value = reader.gets()
    if isinstance(value, list) and any(isinstance(v, list) for v in value):
        return payload  # already nested
    return _reshape(cmd, value) or payload
