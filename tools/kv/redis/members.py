"""Reads of one collection beyond queries.py's, with its handler signature and Redis 7's answers:
HSTRLEN, ZMSCORE, LPOS, SRANDMEMBER, HRANDFIELD, and HSCAN / SSCAN / ZSCAN.

SRANDMEMBER and HRANDFIELD draw at random, as Redis does (a read: no replica's state depends on the
draw). On a live set or hash they index its insertion order (livemap.InOrder, O(log n) a draw) and
never decode the rest. A draw with repetition (a negative count) is capped at MAX_DRAWS: Redis
streams any count, but an answer that large is a memory hazard for the node that builds it.

The SCAN family answers a key whole in one call with cursor 0, as Redis itself does for a small
collection and as bespokv's SCAN does for the keyspace (COUNT is a hint Redis may ignore too); the
guarantees of a cursor (every member present throughout is returned) hold trivially. A cursor other
than 0 was never handed out, so it is refused. MATCH uses Redis's glob dialect (glob.py).
"""
from __future__ import annotations

import random

from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.redis.datatypes import CommandError, _int, _of, fmt_score
from mlsyskit.tools.kv.redis.glob import matcher
from mlsyskit.tools.kv.redis.values import HASH, LIST, SET, ZSET, Entry

MAX_DRAWS = 1_000_000
LONG_MAX = 2 ** 63 - 1
_rng = random.Random()  # seeded from the OS: a read's draw, never replicated


def hstrlen(cmd: list, entry: Entry | None, now: int) -> bytes:
    value = None if entry is None else _of(entry, HASH, None).data.get(cmd[2])
    return resp.integer(0 if value is None else len(value))


def zmscore(cmd: list, entry: Entry | None, now: int) -> bytes:
    data = {} if entry is None else _of(entry, ZSET, None).data
    scores = [data.get(m) for m in cmd[2:]]
    return resp.array([None if s is None else fmt_score(s) for s in scores])


def _long(raw: bytes, name: str) -> int:
    """A non-negative option (Redis's getPositiveLongFromObjectOrReply: one message for both errors)."""
    try:
        value = _int(raw)
    except CommandError:
        value = -1
    if value < 0:
        raise CommandError(f"{name} can't be negative")
    return value


def lpos(cmd: list, entry: Entry | None, now: int) -> bytes:
    """LPOS key element [RANK rank] [COUNT n] [MAXLEN len]: indexes of matches (Redis's lposCommand)."""
    rank, count, maxlen, i = 1, None, 0, 3
    while i < len(cmd):
        option = cmd[i].upper()
        if i + 1 == len(cmd) or option not in (b"RANK", b"COUNT", b"MAXLEN"):
            raise CommandError("syntax error")
        if option == b"RANK":
            rank = _int(cmd[i + 1])
            if rank == -(2 ** 63):
                raise CommandError(f"value is out of range, value must between {-LONG_MAX} and {LONG_MAX}")
            if rank == 0:
                raise CommandError("RANK can't be zero: use 1 to start from the first match, 2 from the second "
                                   "... or use negative to start from the end of the list")
        elif option == b"COUNT":
            count = _long(cmd[i + 1], "COUNT")
        else:
            maxlen = _long(cmd[i + 1], "MAXLEN")
        i += 2
    if entry is None:
        return resp.NULL if count is None else resp.EMPTY_ARRAY
    data = _of(entry, LIST, None).data
    n, target = len(data), cmd[2]
    order = range(n) if rank > 0 else range(n - 1, -1, -1)
    if maxlen:
        order = order[:maxlen]
    found, skip = [], abs(rank) - 1
    for index in order:
        if data[index] == target:
            if skip:
                skip -= 1
                continue
            found.append(index)
            if count is None or count and len(found) == count:
                break
    if count is None:
        return resp.NULL if not found else resp.integer(found[0])
    return b"*%d\r\n" % len(found) + b"".join(resp.integer(x) for x in found)


def _draw_count(cmd: list) -> int | None:
    """SRANDMEMBER's / HRANDFIELD's count (None: absent), with Redis's range checks."""
    if len(cmd) < 3:
        return None
    count = _int(cmd[2])
    if count == -(2 ** 63):
        raise CommandError(f"value is out of range, value must between {-LONG_MAX} and {LONG_MAX}")
    if -count > MAX_DRAWS:
        raise CommandError(f"count is out of range: bespokv draws at most {MAX_DRAWS} with repetition")
    return count


def _members(data) -> object:
    """The members in insertion order as a sequence: a live map's order tree (O(log n) an index)."""
    return list(data) if data.__class__ is dict else data.in_order()


def _draw(data, count: int) -> list[bytes]:
    members = _members(data)
    if count < 0:
        return _rng.choices(members, k=-count)
    return _rng.sample(members, min(count, len(members)))


def srandmember(cmd: list, entry: Entry | None, now: int) -> bytes:
    if len(cmd) > 3:
        raise CommandError("syntax error")
    count = _draw_count(cmd)
    if entry is None:
        return resp.NULL if count is None else resp.EMPTY_ARRAY
    data = _of(entry, SET, None).data
    if count is None:
        return resp.bulk(_draw(data, 1)[0])
    return resp.array(_draw(data, count))


def hrandfield(cmd: list, entry: Entry | None, now: int) -> bytes:
    withvalues = len(cmd) == 4 and cmd[3].upper() == b"WITHVALUES"
    count = _draw_count(cmd)
    if len(cmd) > 4 or len(cmd) == 4 and not withvalues:
        raise CommandError("syntax error")
    if withvalues and not -(LONG_MAX // 2) <= count <= LONG_MAX // 2:
        raise CommandError("value is out of range")
    if entry is None:
        return resp.NULL if count is None else resp.EMPTY_ARRAY
    data = _of(entry, HASH, None).data
    if count is None:
        return resp.bulk(_draw(data, 1)[0])
    fields = _draw(data, count)
    return resp.array([x for f in fields for x in (f, data.get(f))] if withvalues else fields)


def _scan(kind: bytes):
    """HSCAN / SSCAN / ZSCAN key cursor [MATCH pattern] [COUNT count]: the whole key, cursor 0."""
    def handler(cmd: list, entry: Entry | None, now: int) -> bytes:
        cursor = cmd[2]
        if not cursor.isdigit() or int(cursor) >= 2 ** 64:
            raise CommandError("invalid cursor")
        if entry is None:  # Redis answers an absent key before it reads the options
            return b"*2\r\n$1\r\n0\r\n*0\r\n"
        data = _of(entry, kind, None).data
        match, i = matcher(b"*"), 3
        while i < len(cmd):
            option = cmd[i].upper()
            if option == b"COUNT" and i + 1 < len(cmd):
                if _int(cmd[i + 1]) < 1:
                    raise CommandError("syntax error")
            elif option == b"MATCH" and i + 1 < len(cmd):
                match = matcher(cmd[i + 1])
            else:
                raise CommandError("syntax error")
            i += 2
        if int(cursor):
            raise CommandError("invalid cursor (bespokv answers a SCAN of a key in one call, with cursor 0)")
        if kind == SET:
            items = [m for m in data if match(m)]
        else:
            items = [x for m, v in data.items() if match(m) for x in (m, fmt_score(v) if kind == ZSET else v)]
        return b"*2\r\n$1\r\n0\r\n" + resp.array(items)
    return handler


READS = {b"HSTRLEN": (3, hstrlen), b"ZMSCORE": (-3, zmscore), b"LPOS": (-3, lpos),
         b"SRANDMEMBER": (-2, srandmember), b"HRANDFIELD": (-2, hrandfield),
         b"HSCAN": (-3, _scan(HASH)), b"SSCAN": (-3, _scan(SET)), b"ZSCAN": (-3, _scan(ZSET))}
VIEWED = (b"HSTRLEN", b"ZMSCORE", b"SRANDMEMBER", b"HRANDFIELD")  # live.read_entry: no decode
DRAWS = frozenset((b"SRANDMEMBER", b"HRANDFIELD"))
