"""A sorted set's score index (issue 22 item 1): ZRANGE/ZREVRANGE, ZRANGEBYSCORE/ZREVRANGEBYSCORE,
ZCOUNT, ZRANK/ZREVRANK and ZPOPMIN/ZPOPMAX read a live sorted set's counted B+tree (redis/counted.py,
redis/zorder.py) in O(log n + k) instead of sorting every member per call. Checked: the tree against
a sorted list over random inserts and removals (old versions unchanged); the commands against a
naive oracle written from Redis's documentation; costs structurally (bytes allocated at 10 vs
20,000 members), never by timing. The live-vs-generic comparison is in test_live_collections.py and
test_live_reads.py; the comparison with a real redis-server in test_collections_vs_redis.py."""
from __future__ import annotations

import bisect
import random
import tracemalloc

import hiredis

from mlsyskit.tools.kv.node.undolog import image_bytes
from mlsyskit.tools.kv.redis import counted, queries, rmw
from mlsyskit.tools.kv.redis.datatypes import fmt_score
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.values import ZSET
from tests.kv.test_live_collections import BIG, MEMBERS
from tests.kv.test_live_lists import _allocated
from tests.kv.test_live_reads import random_bounds, random_range_options


def _depth(node) -> int:
    return 1 if node.__class__ is list else 1 + max(map(_depth, node.kids))


def test_the_counted_tree_keeps_order_counts_and_old_versions_under_random_inserts_and_removals() -> None:
    rng = random.Random(1)
    for span in (10, 300, 5000):
        root, keys = counted.build([]), []
        versions = []
        for step in range(1500):
            key = (float(rng.randrange(span // 3 + 1)), b"m%d" % rng.randrange(span))
            at = bisect.bisect_left(keys, key)
            present = at < len(keys) and keys[at] == key
            if present and rng.random() < 0.6 or len(keys) > span // 2:
                if keys:
                    key = keys[rng.randrange(len(keys))]
                    root = counted.remove(root, key)
                    keys.remove(key)
            elif not present:
                root = counted.insert(root, key)
                keys.insert(at, key)
            if step % 100 == 0:
                versions.append((root, list(keys)))
            assert counted.size(root) == len(keys)
        assert list(counted.iterate(root)) == keys
        for i in range(0, len(keys), 7):
            assert counted.at(root, i) == keys[i] and counted.rank(root, keys[i]) == i
        for a in range(0, len(keys) + 1, 11):
            for b in (a, a + 1, a + 70, len(keys)):
                assert counted.between(root, a, min(b, len(keys))) == keys[a:b]
        for score in (-1.0, 0.0, 1.0, span / 7, 1e9):
            for bis in (bisect.bisect_left, bisect.bisect_right):
                assert counted.rank_by(root, score, bis, lambda k: k[0]) == bis(keys, score, key=lambda k: k[0])
        for old, expected in versions:  # every earlier version is still what it was
            assert list(counted.iterate(old)) == expected
    big = counted.build([(float(i), b"") for i in range(20_000)])
    for i in range(0, 20_000, 3):
        big = counted.remove(big, (float(i), b""))
    assert _depth(big) <= 4 and counted.size(big) == 20_000 - 6667


def _oracle(cmd: list[bytes], data: dict[bytes, float]) -> list:
    """What Redis's documentation says the range reads answer, by brute force on a sorted list."""
    order = sorted(data.items(), key=lambda p: (p[1], p[0]))
    name, args = cmd[0], cmd[4:]
    rev, byscore, withscores, offset, count = name.startswith(b"ZREV"), name.endswith(b"BYSCORE"), False, 0, -1
    i = 0
    while i < len(args):
        option = args[i].upper()
        if option == b"LIMIT":
            offset, count = int(args[i + 1]), int(args[i + 2])
            i += 2
        rev |= option == b"REV"
        byscore |= option == b"BYSCORE"
        withscores |= option == b"WITHSCORES"
        i += 1
    if byscore:
        low, high = (cmd[3], cmd[2]) if rev else (cmd[2], cmd[3])

        def inside(score: float) -> bool:
            lo, hi = float(low.lstrip(b"(")), float(high.lstrip(b"("))
            return (score > lo if low[:1] == b"(" else score >= lo) and (score < hi if high[:1] == b"(" else score <= hi)
        chosen = [p for p in order if inside(p[1])]
        if rev:
            chosen.reverse()
        chosen = [] if offset < 0 else chosen[offset:] if count < 0 else chosen[offset:offset + count]
    else:
        if rev:
            order.reverse()
        n, start, stop = len(order), int(cmd[2]), int(cmd[3])
        start, stop = max(start + n if start < 0 else start, 0), stop + n if stop < 0 else stop
        chosen = order[start:stop + 1] if 0 <= stop and start <= stop else []
    return [x for m, s in chosen for x in ((m, fmt_score(s)) if withscores else (m,))]


def _parsed(answer: bytes) -> list:
    reader = hiredis.Reader()
    reader.feed(answer)
    return reader.gets()


def test_the_range_reads_answer_what_redis_documents_on_the_live_index() -> None:
    rng = random.Random(4)
    for trial in range(30):
        n = rng.choice([0, 1, 5, 40, 300])
        data = {b"m%d" % i: float(rng.choice([-3, 0, 1, 2.5, 4, 7, float("inf"), float("-inf")])) for i in range(n)}
        value = LiveMap.of(ZSET, 0, data) if data else None
        for _ in range(40):
            name = rng.choice([b"ZRANGE", b"ZRANGEBYSCORE", b"ZREVRANGEBYSCORE", b"ZREVRANGE", b"ZCOUNT"])
            if name == b"ZREVRANGE" or name == b"ZRANGE" and rng.random() < 0.5:
                cmd = [name, b"K", b"%d" % rng.randrange(-n - 2, n + 2), b"%d" % rng.randrange(-n - 2, n + 2)]
                cmd += [b"WITHSCORES"] if rng.random() < 0.5 else []
            else:
                bounds = [b.replace(b"x", b"1") for b in random_bounds(rng)]
                cmd = [name, b"K", *bounds, *([] if name == b"ZCOUNT" else random_range_options(rng, name))]
            got = _parsed(queries.answer(rmw.Command(cmd), value, 1))
            if name == b"ZCOUNT":
                expected = len(_oracle([b"ZRANGEBYSCORE", *cmd[1:]], data))
            else:
                expected = _oracle(cmd, data)
            assert got == expected, (trial, cmd)
        for member in list(data)[:5] + [b"absent"]:
            order = [m for m, _ in sorted(data.items(), key=lambda p: (p[1], p[0]))]
            for name, ranks in ((b"ZRANK", order), (b"ZREVRANK", order[::-1])):
                got = _parsed(queries.answer(rmw.Command([name, b"K", member]), value, 1))
                assert got == (ranks.index(member) if member in data else None)


def test_range_argument_errors_come_before_the_key_is_read() -> None:
    for cmd, error in (([b"ZRANGEBYSCORE", b"K", b"x", b"1"], b"min or max is not a float"),
                       ([b"ZRANGE", b"K", b"0", b"1", b"LIMIT", b"0", b"2"], b"LIMIT is only supported"),
                       ([b"ZRANGE", b"K", b"0", b"1", b"BYLEX"], b"min or max not valid string range item"),
                       ([b"ZRANGEBYSCORE", b"K", b"0", b"1", b"REV"], b"syntax error"),
                       ([b"ZCOUNT", b"K", b"(", b"1"], b"min or max is not a float")):
        assert error in queries.check(rmw.Command(cmd)), cmd
    assert queries.check(rmw.Command([b"ZRANGE", b"K", b"(1", b"+inf", b"BYSCORE", b"LIMIT", b"1", b"2"])) is None


RANGE_READS = [[b"ZRANGE", b"K", b"0", b"9"], [b"ZREVRANGE", b"K", b"5", b"14", b"WITHSCORES"],
               [b"ZRANGE", b"K", b"-10", b"-1"], [b"ZRANK", b"K", MEMBERS[7]], [b"ZREVRANK", b"K", MEMBERS[3]],
               [b"ZRANGEBYSCORE", b"K", b"(2", b"+inf", b"LIMIT", b"0", b"10"], [b"ZCOUNT", b"K", b"1", b"8"],
               [b"ZREVRANGEBYSCORE", b"K", b"+inf", b"-inf", b"WITHSCORES", b"LIMIT", b"2", b"5"],
               [b"ZRANGE", b"K", b"5", b"(9", b"BYSCORE", b"WITHSCORES"]]


def test_range_reads_and_pops_allocate_the_same_at_10_and_at_20000_members() -> None:
    """A sort of the 20,000 members (or a list of them) would show in the peak."""
    short = LiveMap.of(ZSET, 0, dict(list(BIG[ZSET].items())[:10]))
    long = LiveMap.of(ZSET, 0, BIG[ZSET])
    tracemalloc.start()
    try:
        for cmd in map(rmw.Command, RANGE_READS):
            costs = [_allocated(lambda v=v, c=cmd: queries.answer(c, v, 1)) for v in (short, long, short, long)]
            assert max(costs) < 8 * 1024, (cmd, costs)
        for name in (b"ZPOPMIN", b"ZPOPMAX"):
            cmd = rmw.Command([name, b"K", b"3"], now_ms=1)
            costs = [_allocated(lambda v=v, c=cmd: rmw.apply(c, v)) for v in (short, long, short, long)]
            assert max(costs) < 40 * 1024, (name, costs)
    finally:
        tracemalloc.stop()
    stored = long.stored()
    for cmd in map(rmw.Command, RANGE_READS):
        assert queries.answer(cmd, long, 1) == queries.answer(cmd, stored, 1), cmd  # the index vs a sort
    after, answer = rmw.apply(rmw.Command([b"ZPOPMAX", b"K", b"2"], now_ms=1), long)
    assert answer == b"*4\r\n$100\r\n%b\r\n$5\r\n19999\r\n$100\r\n%b\r\n$5\r\n19998\r\n" % (MEMBERS[-1], MEMBERS[-2])
    assert after.count == 19_998 and image_bytes(after) < 40 * 1024
    assert queries.answer(rmw.Command([b"ZRANK", b"K", MEMBERS[-2]]), after, 1) == b"$-1\r\n"
    assert queries.answer(rmw.Command([b"ZREVRANK", b"K", MEMBERS[0]]), after, 1) == b":19997\r\n"
