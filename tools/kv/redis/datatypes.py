"""Lists, sets, hashes and sorted sets, and the read commands over any key, as pure functions.

Writes (`WRITES`: name -> (Redis arity, handler)) take the command, the key's live entry
(values.Entry, None when absent) and the instant the command takes effect (Unix ms), and
return the entry afterwards and the RESP answer; rmw.py runs them at the shard's write
point, and every replica runs them again on the same command (rmw.DELTAS). Reads (`READS`) turn the entry a read
replica holds into the answer. A key holding another kind raises values.WrongType
(-WRONGTYPE, nothing changes); an emptied collection is removed (values.encode), as in Redis.

Cost: on bytes (a blob datalet such as lmdb, or a form the memory datalet does not keep live) a
collection is one stored value, so a write decodes and re-encodes it -- O(size) per command --
except a push (listpush.py: one copy of the bytes, no decode). On the memory datalet's live values
(live.py) pushes, pops, LSET/LTRIM/LINSERT/LREM (listedit.py), APPEND and the set, hash and
sorted-set writes whose handlers change `data` with `e.data.copy()` below (a dict copy, or a MapEdit of a livemap.LiveMap: O(changed members)) cost
O(delta). The controlets replicate the command, not the value (rmw.DELTAS), and refuse a value past
the limit (rmw.too_large, live.py) before anything is applied.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable

from mlsyskit.tools.kv.redis import resp, zorder
from mlsyskit.tools.kv.redis.values import HASH, LIST, SET, ZSET, Entry, WrongType
from mlsyskit.tools.kv.shardmap import hash64


class CommandError(ValueError):
    """Bad arguments (answered -ERR, nothing changes)."""


def _int(raw: bytes) -> int:
    """A Redis integer argument: canonical decimal within int64 (Python's int() also takes
    spaces, underscores and a plus sign, which Redis refuses)."""
    try:
        value = int(raw)
    except ValueError:
        raise CommandError("value is not an integer or out of range") from None
    if raw != b"%d" % value or not -(2 ** 63) <= value < 2 ** 63:
        raise CommandError("value is not an integer or out of range")
    return value


def _float(raw: bytes) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise CommandError("value is not a valid float") from None
    if math.isnan(value):
        raise CommandError("value is not a valid float")
    return value


def fmt_score(score: float) -> bytes:
    if math.isinf(score):
        return b"inf" if score > 0 else b"-inf"
    if score.is_integer() and abs(score) < 1e17:
        return b"%d" % score
    return repr(score).encode()


def _of(entry: Entry | None, kind: bytes, empty) -> Entry:
    """The entry as `kind` (a fresh empty one when absent); another kind is WRONGTYPE."""
    if entry is None:
        return Entry(kind, 0, empty)
    if entry.kind != kind:
        raise WrongType
    return entry


def pop_count(cmd: list) -> int | None:
    if len(cmd) == 2:
        return None
    if len(cmd) > 3 or (n := _int(cmd[2])) < 0:
        raise CommandError("value is out of range, must be positive")
    return n


def popped_answer(items: list[bytes], count: int | None) -> bytes:
    return resp.bulk(items[0] if items else None) if count is None else resp.array(items)


# -- lists ---------------------------------------------------------------------------------
def _push(cmd: list, entry: Entry | None, now: int):
    if cmd[0].endswith(b"X") and entry is None:
        return None, resp.ZERO
    e = _of(entry, LIST, [])
    data = list(e.data)
    if cmd[0].startswith(b"L"):
        data[:0] = reversed(cmd[2:])
    else:
        data.extend(cmd[2:])
    return e._replace(data=data), resp.integer(len(data))


def _pop(cmd: list, entry: Entry | None, now: int):
    count = pop_count(cmd)
    if entry is None:
        return None, resp.NULL if count is None else b"*-1\r\n"
    e = _of(entry, LIST, [])
    n = 1 if count is None else count
    data = list(e.data)
    if cmd[0] == b"LPOP":
        taken, rest = data[:n], data[n:]
    else:
        taken, rest = list(reversed(data[-n:])) if n else [], data[:max(len(data) - n, 0)]  # n may exceed the length
    return e._replace(data=rest), popped_answer(taken, count)


def _lset(cmd: list, entry: Entry | None, now: int):
    index = _int(cmd[2])
    if entry is None:
        return None, b"-ERR no such key\r\n"  # an answer, not a syntax error: parse()'s dry run passes
    e = _of(entry, LIST, [])
    data = list(e.data)
    if not -len(data) <= index < len(data):
        raise CommandError("index out of range")
    data[index] = cmd[3]
    return e._replace(data=data), resp.OK


def _span(length: int, start: int, stop: int) -> tuple[int, int]:
    """Redis's inclusive [start, stop] with negative indexes, as a Python slice."""
    start = max(start + length if start < 0 else start, 0)
    stop = stop + length if stop < 0 else stop
    return start, max(min(stop, length - 1) + 1, start)


def _ltrim(cmd: list, entry: Entry | None, now: int):
    start, stop = _int(cmd[2]), _int(cmd[3])
    if entry is None:
        return None, resp.OK
    e = _of(entry, LIST, [])
    a, b = _span(len(e.data), start, stop)
    return e._replace(data=e.data[a:b]), resp.OK


def _lrem(cmd: list, entry: Entry | None, now: int):
    count = _int(cmd[2])
    if entry is None:
        return None, resp.ZERO
    e = _of(entry, LIST, [])
    data, target = list(e.data), cmd[3]
    order = range(len(data) - 1, -1, -1) if count < 0 else range(len(data))
    limit = abs(count) or len(data)
    drop = [i for i in order if data[i] == target][:limit]
    for i in sorted(drop, reverse=True):
        del data[i]
    return e._replace(data=data), resp.integer(len(drop))


def _linsert(cmd: list, entry: Entry | None, now: int):
    """LINSERT key BEFORE|AFTER pivot element: the new length, -1 without the pivot, 0 without the key."""
    where = cmd[2].upper()
    if where not in (b"BEFORE", b"AFTER"):
        raise CommandError("syntax error")
    if entry is None:
        return None, resp.ZERO
    e = _of(entry, LIST, [])
    data = list(e.data)
    if cmd[3] not in data:
        return e, resp.integer(-1)
    data.insert(data.index(cmd[3]) + (where == b"AFTER"), cmd[4])
    return e._replace(data=data), resp.integer(len(data))


# -- sets ----------------------------------------------------------------------------------
def _sadd(cmd: list, entry: Entry | None, now: int):
    e = _of(entry, SET, {})
    data = e.data.copy()
    before = len(data)
    data.update(dict.fromkeys(cmd[2:]))
    return e._replace(data=data), resp.integer(len(data) - before)


def _removing(kind: bytes):
    """SREM, HDEL, ZREM: drop the named members (each counted once) from a set, hash or sorted set."""
    def remove(cmd: list, entry: Entry | None, now: int):
        if entry is None:
            return None, resp.ZERO
        e = _of(entry, kind, {})
        data = e.data.copy()
        members = [m for m in dict.fromkeys(cmd[2:]) if m in data]
        for m in members:
            del data[m]
        return e._replace(data=data), resp.integer(len(members))
    return remove


def _spop(cmd: list, entry: Entry | None, now: int):
    """Random members, drawn from a generator seeded by (key, instant): computed once at the
    write point and replicated by effect, so replicas agree whatever they would have drawn."""
    count = pop_count(cmd)
    if entry is None:
        return None, resp.NULL if count is None else resp.EMPTY_ARRAY
    e = _of(entry, SET, {})
    # The members in insertion order: the dict's list, or a live set's order tree as a sequence whose
    # [j] costs O(log n), from which random.sample draws the very same members (O(count log n)).
    members = list(e.data) if e.data.__class__ is dict else e.data.in_order()
    rng = random.Random(hash64(b"%b|%d" % (cmd[1], now)))
    taken = rng.sample(members, min(1 if count is None else count, len(members)))
    data = e.data.copy()
    for m in taken:
        del data[m]
    return e._replace(data=data), popped_answer(taken, count)


# -- hashes --------------------------------------------------------------------------------
def _hset(cmd: list, entry: Entry | None, now: int):
    if len(cmd) % 2:
        raise CommandError(f"wrong number of arguments for '{cmd[0].decode().lower()}' command")
    e = _of(entry, HASH, {})
    data = e.data.copy()
    before = len(data)
    if cmd[0] == b"HSETNX":
        if cmd[2] in data:
            return e, resp.ZERO
        data[cmd[2]] = cmd[3]
        return e._replace(data=data), resp.ONE
    data.update(zip(cmd[2::2], cmd[3::2], strict=True))
    return e._replace(data=data), resp.OK if cmd[0] == b"HMSET" else resp.integer(len(data) - before)


def _hincrby(cmd: list, entry: Entry | None, now: int):
    step = _int(cmd[3])
    e = _of(entry, HASH, {})
    data = e.data.copy()
    try:
        total = _int(data.get(cmd[2], b"0")) + step
    except CommandError:
        raise CommandError("hash value is not an integer") from None
    if not -(2 ** 63) <= total < 2 ** 63:
        raise CommandError("increment or decrement would overflow")
    data[cmd[2]] = b"%d" % total
    return e._replace(data=data), resp.integer(total)


# -- sorted sets ---------------------------------------------------------------------------
def _zadd(cmd: list, entry: Entry | None, now: int):
    """ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]."""
    i, flags = 2, set()
    while i < len(cmd) and cmd[i].upper() in (b"NX", b"XX", b"GT", b"LT", b"CH", b"INCR"):
        flags.add(cmd[i].upper())
        i += 1
    pairs = cmd[i:]
    if not pairs or len(pairs) % 2 or ({b"NX", b"XX"} <= flags) or ({b"GT", b"LT"} <= flags) \
            or (b"NX" in flags and flags & {b"GT", b"LT"}) or (b"INCR" in flags and len(pairs) != 2):
        raise CommandError("syntax error")
    scores = [_float(s) for s in pairs[0::2]]
    e = _of(entry, ZSET, {})
    data = e.data.copy()
    added = changed = 0
    result = None
    for score, member in zip(scores, pairs[1::2], strict=True):
        old = data.get(member)
        if old is None and b"XX" in flags or old is not None and b"NX" in flags:
            continue
        new = old + score if b"INCR" in flags and old is not None else score
        if math.isnan(new):
            raise CommandError("resulting score is not a number (NaN)")
        if old is not None and (b"GT" in flags and new <= old or b"LT" in flags and new >= old):
            continue
        added += old is None
        changed += old is not None and new != old
        data[member] = result = new
    if b"INCR" in flags:
        return e._replace(data=data), resp.bulk(None if result is None else fmt_score(result))
    return e._replace(data=data), resp.integer(added + (changed if b"CH" in flags else 0))


def _zincrby(cmd: list, entry: Entry | None, now: int):
    return _zadd([b"ZADD", cmd[1], b"INCR", cmd[2], cmd[3]], entry, now)


def _zpop(cmd: list, entry: Entry | None, now: int):
    """ZPOPMIN/ZPOPMAX key [count]: the lowest (highest) members, read off the set's order
    (zorder.py: a live set's score index, O(log n + count))."""
    count = pop_count(cmd)
    if entry is None:
        return None, resp.EMPTY_ARRAY
    e = _of(entry, ZSET, {})
    taken = zorder.popped(e.data, 1 if count is None else count, cmd[0] == b"ZPOPMAX")
    data = e.data.copy()
    for _, member in taken:
        del data[member]
    return e._replace(data=data), resp.array([x for s, m in taken for x in (m, fmt_score(s))])


Handler = Callable[[list, Entry | None, int], tuple[Entry | None, bytes]]
WRITES: dict[bytes, tuple[int, Handler]] = {
    b"LPUSH": (-3, _push), b"RPUSH": (-3, _push), b"LPUSHX": (-3, _push), b"RPUSHX": (-3, _push),
    b"LPOP": (-2, _pop), b"RPOP": (-2, _pop), b"LSET": (4, _lset), b"LTRIM": (4, _ltrim), b"LREM": (4, _lrem),
    b"LINSERT": (5, _linsert),
    b"SADD": (-3, _sadd), b"SREM": (-3, _removing(SET)), b"SPOP": (-2, _spop),
    b"HSET": (-4, _hset), b"HMSET": (-4, _hset), b"HSETNX": (4, _hset), b"HDEL": (-3, _removing(HASH)),
    b"HINCRBY": (4, _hincrby),
    b"ZADD": (-4, _zadd), b"ZINCRBY": (4, _zincrby), b"ZREM": (-3, _removing(ZSET)), b"ZPOPMIN": (-2, _zpop),
    b"ZPOPMAX": (-2, _zpop),
}
