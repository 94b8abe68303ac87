"""The sorted-set reads by rank, score or member bytes: ZRANGE (by rank, BYSCORE or BYLEX, REV,
LIMIT), ZREVRANGE, ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZCOUNT, ZRANK, ZREVRANK, ZRANGEBYLEX,
ZREVRANGEBYLEX and ZLEXCOUNT, as pure read handlers (queries.py); the ZREMRANGE writes
(collwrites.py) remove what these select.

They read the set's order (zorder.Ranking): a live sorted set's score index, so O(log n + k) for k
members answered; bytes decoded whole build the order first (O(n log n)).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from mlsyskit.tools.kv.redis import counted, resp
from mlsyskit.tools.kv.redis.datatypes import CommandError, _float, _int, _of, _span, fmt_score
from mlsyskit.tools.kv.redis.values import ZSET, Entry
from mlsyskit.tools.kv.redis.zorder import Ranking, ranking

LIMIT_NEEDS_BY = "syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"


def _answer(pairs: list[tuple[float, bytes]], withscores: bool) -> bytes:
    if withscores:
        return resp.array([x for s, m in pairs for x in (m, fmt_score(s))])
    return resp.array([m for _, m in pairs])


def _bound(raw: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (score, exclusive); `(1.5` excludes 1.5, `-inf`/`+inf` are open."""
    exclusive = raw[:1] == b"("
    try:
        return _float(raw[1:] if exclusive else raw), exclusive
    except CommandError:
        raise CommandError("min or max is not a float") from None


class _Options:
    """The options after ZRANGE's first three arguments, parsed in Redis's order (zrangeGenericCommand)."""

    def __init__(self, name: bytes, args: list[bytes]) -> None:
        self.withscores, self.rev = False, name.startswith(b"ZREV")
        self.byscore, self.bylex = name.endswith(b"BYSCORE"), name.endswith(b"BYLEX")
        self.offset, self.count = 0, -1
        i = 0
        while i < len(args):
            option = args[i].upper()
            if option == b"WITHSCORES":
                self.withscores = True
            elif option == b"LIMIT" and len(args) - i - 1 >= 2:
                self.offset, self.count = _int(args[i + 1]), _int(args[i + 2])
                i += 2
            elif name == b"ZRANGE" and option == b"REV" and not self.rev:
                self.rev = True
            elif name == b"ZRANGE" and option in (b"BYSCORE", b"BYLEX") and not (self.byscore or self.bylex):
                self.byscore, self.bylex = option == b"BYSCORE", option == b"BYLEX"
            else:
                raise CommandError("syntax error")
            i += 1
        if self.count != -1 and not (self.byscore or self.bylex):
            raise CommandError(LIMIT_NEEDS_BY)
        if self.withscores and self.bylex:
            raise CommandError("syntax error, WITHSCORES not supported in combination with BYLEX")


# -- lexicographic ranges (ZRANGEBYLEX, ZLEXCOUNT, ZREMRANGEBYLEX) ----------------------------------
LOWEST, HIGHEST = b"-", b"+"  # the open ends; an item is (bytes, exclusive) or one of them


def lex_item(raw: bytes):
    """Redis's zslParseLexRangeItem: `[a` includes a, `(a` excludes it, `-` and `+` are the open ends."""
    if raw in (LOWEST, HIGHEST):
        return raw
    if raw[:1] in (b"[", b"("):
        return raw[1:], raw[:1] == b"("
    raise CommandError("min or max not valid string range item")


def _lex_cmp(a, b) -> int:
    rank = {LOWEST: 0, HIGHEST: 2}
    if a in rank or b in rank:
        return rank.get(a, 1) - rank.get(b, 1)
    return (a[0] > b[0]) - (a[0] < b[0])


def _gte_min(member: bytes, low) -> bool:
    return low == LOWEST or low != HIGHEST and (member > low[0] if low[1] else member >= low[0])


def _lte_max(member: bytes, high) -> bool:
    return high == HIGHEST or high != LOWEST and (member < high[0] if high[1] else member <= high[0])


def _member(pair: tuple) -> bytes:
    return pair[1]


def lex_range(order: Ranking, low, high, rev: bool = False, offset: int = 0, count: int = -1) -> list:
    """The (score, member) pairs ZRANGEBYLEX answers, in answer order. With equal scores (the case
    Redis defines) the members are in byte order: two bisections, O(log n + k). Otherwise Redis's
    answer is unspecified; this one is its small-set (listpack) walk, O(n)."""
    n = len(order)
    exclusive = low not in (LOWEST, HIGHEST) and low[1] or high not in (LOWEST, HIGHEST) and high[1]
    cmp = _lex_cmp(low, high)
    if not n or cmp > 0 or cmp == 0 and (exclusive or low in (LOWEST, HIGHEST)) or offset < 0:
        return []
    first, last = order.between(0, 1)[0], order.between(n - 1, n)[0]
    if first[0] == last[0]:  # every score equal: the order is the members' byte order
        a = 0 if low == LOWEST else n if low == HIGHEST else \
            counted.rank_by(order.root, low[0], bisect_right if low[1] else bisect_left, _member)
        b = n if high == HIGHEST else 0 if high == LOWEST else \
            counted.rank_by(order.root, high[0], bisect_left if high[1] else bisect_right, _member)
        if rev:
            b -= offset
            a = a if count < 0 else max(a, b - count)
            return order.between(a, b)[::-1] if a < b else []
        a += offset
        b = b if count < 0 else min(b, a + count)
        return order.between(a, b) if a < b else []
    pairs = order.between(0, n)
    if not (_gte_min(last[1], low) and _lte_max(first[1], high)):
        return []
    walk = pairs[::-1] if rev else pairs
    enter, stay = (_lte_max, _gte_min) if rev else (_gte_min, _lte_max)
    bound_in, bound_on = (high, low) if rev else (low, high)
    start = next((i for i, p in enumerate(walk) if enter(p[1], bound_in)), None)
    if start is None or not stay(walk[start][1], bound_on):
        return []
    out = []
    for pair in walk[start + offset:]:
        if len(out) == count or not stay(pair[1], bound_on):
            break
        out.append(pair)
    return out


def zrangebylex(cmd: list, entry: Entry | None, now: int) -> bytes:
    opts = _Options(cmd[0], cmd[4:])
    low, high = (cmd[3], cmd[2]) if opts.rev else (cmd[2], cmd[3])
    low, high = lex_item(low), lex_item(high)
    if entry is None:
        return resp.EMPTY_ARRAY
    order = ranking(_of(entry, ZSET, None).data)
    return _answer(lex_range(order, low, high, opts.rev, opts.offset, opts.count), False)


def zlexcount(cmd: list, entry: Entry | None, now: int) -> bytes:
    low, high = lex_item(cmd[2]), lex_item(cmd[3])
    if entry is None:
        return resp.ZERO
    return resp.integer(len(lex_range(ranking(_of(entry, ZSET, None).data), low, high)))


def zrange(cmd: list, entry: Entry | None, now: int) -> bytes:
    """ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES], ZREVRANGE key start
    stop [WITHSCORES], ZRANGEBYSCORE key min max and ZREVRANGEBYSCORE key max min [WITHSCORES]
    [LIMIT offset count]."""
    opts = _Options(cmd[0], cmd[4:])
    if opts.bylex:
        return zrangebylex(cmd, entry, now)
    if opts.byscore:
        low, high = (cmd[3], cmd[2]) if opts.rev else (cmd[2], cmd[3])
        (lo, lo_open), (hi, hi_open) = _bound(low), _bound(high)
        if entry is None:
            return resp.EMPTY_ARRAY
        order = ranking(_of(entry, ZSET, None).data)
        a, b = order.below(lo, lo_open), order.below(hi, not hi_open)
        if opts.offset < 0 or b <= a:
            return resp.EMPTY_ARRAY
        if opts.rev:
            b -= opts.offset
            a = a if opts.count < 0 else max(a, b - opts.count)
        else:
            a += opts.offset
            b = b if opts.count < 0 else min(b, a + opts.count)
    else:
        start, stop = _int(cmd[2]), _int(cmd[3])
        if entry is None:
            return resp.EMPTY_ARRAY
        order = ranking(_of(entry, ZSET, None).data)
        n = len(order)
        a, b = _span(n, start, stop)
        if opts.rev:
            a, b = n - b, n - a
    pairs = order.between(a, b) if a < b else []
    if opts.rev:
        pairs.reverse()
    return _answer(pairs, opts.withscores)


def zcount(cmd: list, entry: Entry | None, now: int) -> bytes:
    (lo, lo_open), (hi, hi_open) = _bound(cmd[2]), _bound(cmd[3])
    if entry is None:
        return resp.ZERO
    order = ranking(_of(entry, ZSET, None).data)
    return resp.integer(max(order.below(hi, not hi_open) - order.below(lo, lo_open), 0))


def zrank(cmd: list, entry: Entry | None, now: int) -> bytes:
    if entry is None:
        return resp.NULL
    data = _of(entry, ZSET, None).data
    score = data.get(cmd[2])
    if score is None:
        return resp.NULL
    order = ranking(data)
    at = order.rank(cmd[2], score)
    return resp.integer(len(order) - 1 - at if cmd[0] == b"ZREVRANK" else at)


READS = {b"ZRANGE": (-4, zrange), b"ZREVRANGE": (-4, zrange), b"ZRANGEBYSCORE": (-4, zrange),
         b"ZREVRANGEBYSCORE": (-4, zrange), b"ZCOUNT": (4, zcount), b"ZRANK": (3, zrank), b"ZREVRANK": (3, zrank),
         b"ZRANGEBYLEX": (-4, zrangebylex), b"ZREVRANGEBYLEX": (-4, zrangebylex), b"ZLEXCOUNT": (4, zlexcount)}
