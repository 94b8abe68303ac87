"""The sorted-set reads by rank or score: ZRANGE (by rank or BYSCORE, REV, LIMIT), ZREVRANGE,
ZRANGEBYSCORE, ZREVRANGEBYSCORE, ZCOUNT, ZRANK and ZREVRANK, as pure read handlers (queries.py).

They read the set's order (zorder.Ranking): a live sorted set's score index, so O(log n + k) for k
members answered; bytes decoded whole build the order first (O(n log n)).
"""
from __future__ import annotations

from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.redis.datatypes import CommandError, _float, _int, _of, _span, fmt_score
from mlsyskit.tools.kv.redis.values import ZSET, Entry
from mlsyskit.tools.kv.redis.zorder import ranking

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
        self.withscores, self.rev, self.byscore = False, name.startswith(b"ZREV"), name.endswith(b"BYSCORE")
        self.offset, self.count = 0, -1
        limited, i = False, 0
        while i < len(args):
            option = args[i].upper()
            if option == b"WITHSCORES":
                self.withscores = True
            elif option == b"LIMIT" and len(args) - i - 1 >= 2:
                self.offset, self.count = _int(args[i + 1]), _int(args[i + 2])
                limited = True
                i += 2
            elif name == b"ZRANGE" and option == b"REV" and not self.rev:
                self.rev = True
            elif name == b"ZRANGE" and option == b"BYSCORE" and not self.byscore:
                self.byscore = True
            elif name == b"ZRANGE" and option == b"BYLEX" and not self.byscore:
                raise CommandError("syntax error (bespokv's ZRANGE does not take BYLEX)")
            else:
                raise CommandError("syntax error")
            i += 1
        if limited and self.count != -1 and not self.byscore:
            raise CommandError(LIMIT_NEEDS_BY)


def zrange(cmd: list, entry: Entry | None, now: int) -> bytes:
    """ZRANGE key start stop [BYSCORE] [REV] [LIMIT offset count] [WITHSCORES], ZREVRANGE key start
    stop [WITHSCORES], ZRANGEBYSCORE key min max and ZREVRANGEBYSCORE key max min [WITHSCORES]
    [LIMIT offset count]."""
    opts = _Options(cmd[0], cmd[4:])
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
         b"ZREVRANGEBYSCORE": (-4, zrange), b"ZCOUNT": (4, zcount), b"ZRANK": (3, zrank), b"ZREVRANK": (3, zrank)}
