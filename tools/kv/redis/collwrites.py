"""Collection writes beyond datatypes.py's, with its handler signature: HINCRBYFLOAT, and
ZREMRANGEBYSCORE / ZREMRANGEBYRANK / ZREMRANGEBYLEX.

They change their collection with `e.data.copy()` and item assignment or `del`, as datatypes.py's
handlers do, so on the memory datalet's live value they run on a MapEdit (live.map_write): O(changed
members x log n), the removed range read off the sorted set's score index (zorder.py).

Replication: the ZREMRANGE commands are deltas (rmw.DELTAS): every replica removes the same range
from the same state. HINCRBYFLOAT is computed once, in long double (longdouble.py), and goes to the
replicas as the write it amounted to (BY_EFFECT, effect_of: HSET of the result, or a write that
changes nothing), as Redis replicates it, so no replica redoes the float arithmetic.
"""
from __future__ import annotations

from mlsyskit.tools.kv.redis import longdouble, resp
from mlsyskit.tools.kv.redis.datatypes import CommandError, _int, _of, _span
from mlsyskit.tools.kv.redis.values import HASH, ZSET, Entry
from mlsyskit.tools.kv.redis.zorder import ranking
from mlsyskit.tools.kv.redis.zranges import _bound, lex_item, lex_range


def _hincrbyfloat(cmd: list, entry: Entry | None, now: int):
    """HINCRBYFLOAT key field increment: the field's new value, as INCRBYFLOAT prints it."""
    step = longdouble.parse(cmd[3])
    if step is None:
        raise CommandError("value is not a valid float")
    if longdouble.human(step) is None:
        raise CommandError("value is NaN or Infinity")
    e = _of(entry, HASH, {})
    current = e.data.get(cmd[2])
    base = longdouble.parse(b"0" if current is None else current)
    if base is None:
        raise CommandError("hash value is not a float")
    text = longdouble.human(longdouble.add(base, step))
    if text is None:
        raise CommandError("increment would produce NaN or Infinity")
    data = e.data.copy()
    data[cmd[2]] = text
    return e._replace(data=data), resp.bulk(text)


def effect_of(cmd: list, answer: bytes) -> list[bytes]:
    """The write replicas apply for a BY_EFFECT command the write point answered with `answer`: HSET
    of the value it computed, or (an error: nothing changed) HDEL of no field, which changes nothing
    on any state."""
    if answer[:1] == b"$":
        return [b"HSET", cmd[1], cmd[2], answer[answer.index(b"\r\n") + 2:-2]]
    return [b"HDEL", cmd[1]]


def _removed(entry: Entry, pairs: list) -> tuple[Entry, bytes]:
    data = entry.data.copy()
    for _, member in pairs:
        del data[member]
    return entry._replace(data=data), resp.integer(len(pairs))


def _zremrangebyscore(cmd: list, entry: Entry | None, now: int):
    (lo, lo_open), (hi, hi_open) = _bound(cmd[2]), _bound(cmd[3])
    if entry is None:
        return None, resp.ZERO
    e = _of(entry, ZSET, {})
    order = ranking(e.data)
    a, b = order.below(lo, lo_open), order.below(hi, not hi_open)
    return _removed(e, order.between(a, b) if a < b else [])


def _zremrangebyrank(cmd: list, entry: Entry | None, now: int):
    start, stop = _int(cmd[2]), _int(cmd[3])
    if entry is None:
        return None, resp.ZERO
    e = _of(entry, ZSET, {})
    order = ranking(e.data)
    a, b = _span(len(order), start, stop)
    return _removed(e, order.between(a, b) if a < b else [])


def _zremrangebylex(cmd: list, entry: Entry | None, now: int):
    low, high = lex_item(cmd[2]), lex_item(cmd[3])
    if entry is None:
        return None, resp.ZERO
    e = _of(entry, ZSET, {})
    return _removed(e, lex_range(ranking(e.data), low, high))


WRITES = {b"HINCRBYFLOAT": (4, _hincrbyfloat), b"ZREMRANGEBYSCORE": (4, _zremrangebyscore),
          b"ZREMRANGEBYRANK": (4, _zremrangebyrank), b"ZREMRANGEBYLEX": (4, _zremrangebylex)}
BY_EFFECT = frozenset((b"HINCRBYFLOAT",))
KINDS = {b"HINCRBYFLOAT": HASH, b"ZREMRANGEBYSCORE": ZSET, b"ZREMRANGEBYRANK": ZSET, b"ZREMRANGEBYLEX": ZSET}
