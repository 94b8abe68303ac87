"""The writes that cost O(delta) on a live value (the memory datalet's form of a collection or an
APPENDed string), the reads that look into one without decoding it (read_entry), and turning a
stored record into its live form.

rmw.apply tries FAST[name] first: a push or a pop (listpush.py), LSET/LTRIM/LINSERT/LREM (listedit.py),
APPEND (livestring.py), and the set, hash and sorted-set writes below (SPOP and ZPOPMIN/ZPOPMAX too), which run the command's own handler (datatypes.py) on a MapEdit of the
LiveMap (livemap.py) instead of a dict copy. Each answers exactly as the generic path does, gives a
value that stands for the bytes the generic path would store, and checks the value limit on the size
it counted before anything is stored or replicated. One returns None when the generic path must
decide (a key of another kind, an expired key, a record kept as bytes: a blob datalet such as lmdb).
"""
from __future__ import annotations

from typing import Any

from mlsyskit.tools.kv.redis import (
    collwrites,
    datatypes,
    listedit,
    listpush,
    livelist,
    livemap,
    livestring,
    members,
    resp,
    values,
    zranges,
)
from mlsyskit.tools.kv.redis.livebase import LiveValue
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.values import FIRST, HASH, LIST, SET, STRING, ZSET, Entry

MAP_WRITES = {b"SADD": SET, b"SREM": SET, b"SPOP": SET,
              b"HSET": HASH, b"HMSET": HASH, b"HSETNX": HASH, b"HDEL": HASH,
              b"HINCRBY": HASH, b"ZADD": ZSET, b"ZINCRBY": ZSET, b"ZREM": ZSET, b"ZPOPMIN": ZSET, b"ZPOPMAX": ZSET,
              **collwrites.KINDS}
MAP_HANDLERS = {name: table[name][1] for table in (datatypes.WRITES, collwrites.WRITES) for name in table
                if name in MAP_WRITES}


def map_write(cmd: list[bytes], current: Any, now_ms: int, limit: int) -> tuple[Any, bytes] | None:
    kind = MAP_WRITES[cmd[0]]
    if current is None:
        entry = None
    elif current.__class__ is LiveMap and current.kind == kind and not 0 < current.deadline <= now_ms:
        entry = Entry(kind, current.deadline, current.edit())
    else:
        return None
    try:
        after, answer = MAP_HANDLERS[cmd[0]](cmd, entry, now_ms)
    except datatypes.CommandError as e:
        return current, resp.error(f"ERR {e}")
    if after is None:
        return None, answer
    data = after.data
    if data.__class__ is dict:  # the key was absent: the handler made a dict of the new members
        value = LiveMap.of(kind, after.deadline, data) if data else None
    else:
        value = data.freeze(after.deadline)
    if value is not None and len(value) > limit and (current is None or len(value) > len(current)):
        return current, values.collection_too_large(kind, limit)  # nothing is stored or replicated
    return value, answer


FAST = {**dict.fromkeys(listpush.PUSHES, listpush.push), **dict.fromkeys(listpush.POPS, listpush.pop),
        **listedit.EDITS,
        b"APPEND": livestring.append,
        **dict.fromkeys(MAP_WRITES, map_write)}


# Reads whose handler (queries.py, zranges.py) looks only at the kind, the deadline, len, a member, an
# index or a sorted set's score index: on a live value they answer from its structure (view_entry),
# never decoding the other members.
VIEWED_READS = frozenset((b"TTL", b"PTTL", b"EXPIRETIME", b"PEXPIRETIME", b"TYPE", b"LLEN", b"LINDEX", b"LRANGE",
                          b"SCARD", b"SISMEMBER", b"SMISMEMBER", b"HGET", b"HMGET", b"HLEN", b"HEXISTS",
                          b"ZCARD", b"ZSCORE", *zranges.READS, *members.VIEWED))


def read_entry(name: bytes, stored: Any, now_ms: int) -> Entry | None:
    """The entry a read command sees (values.live: None when absent or past its deadline): a view of
    a live value for the reads above (O(1) or O(log n)), else the value decoded whole."""
    if name not in VIEWED_READS or not isinstance(stored, LiveValue):
        return values.live(stored, now_ms)
    if 0 < stored.deadline <= now_ms:
        return None
    return stored.view_entry()


def promote(stored: bytes) -> Any:
    """A record's bytes as the live value standing for them (the same bytes); anything else -- a
    plain string, aa-ec's versioned record, a damaged or non-canonical record -- unchanged."""
    if stored[:1] != FIRST:
        return stored
    kind = stored[4:5]
    if kind == LIST:
        return livelist.promote(stored)
    if kind == STRING:
        return livestring.promote(stored)
    if kind in livemap.KINDS:
        return livemap.promote(stored)
    return stored
