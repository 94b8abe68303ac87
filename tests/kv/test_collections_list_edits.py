"""LSET, LTRIM, LINSERT, LREM on a live list (redis/listedit.py) and SPOP on a live set (its order
tree: redis/livemap.py) without decoding or copying the value (issue 22 item 1). Checked: every
index of lists whose elements sit in every mix of front and back chunks, against a plain list; the
bytes a write allocates at 10 vs 20,000 elements (a copy of the 2 MB value would show), never
timing; a refused write leaves the value as it was. Random sequences against the generic path are
in test_live_collections.py, against a real redis-server in test_collections_vs_redis.py."""
from __future__ import annotations

import random
import tracemalloc

from mlsyskit.tools.kv.node.undolog import image_bytes
from mlsyskit.tools.kv.redis import rmw, values
from mlsyskit.tools.kv.redis.listedit import edited_at
from mlsyskit.tools.kv.redis.livelist import LiveList
from mlsyskit.tools.kv.redis.livemap import LiveMap
from mlsyskit.tools.kv.redis.values import SET
from tests.kv.test_live_collections import MEMBERS, _generic
from tests.kv.test_live_lists import _allocated


def _mixed(rng: random.Random) -> tuple[LiveList, list[bytes]]:
    """A list pushed from both ends and popped: elements split between front and back chunks."""
    value, items = LiveList.of(0, []), []
    for _ in range(rng.randrange(1, 8)):
        new = [b"e%d" % rng.randrange(10**6) for _ in range(rng.choice([1, 5, 64, 130]))]
        right = rng.random() < 0.5
        value = value.pushed(new, right=right)
        items = items + new if right else new[::-1] + items
        if rng.random() < 0.3 and len(items) > 1:
            left, n = rng.random() < 0.5, rng.randrange(1, len(items))
            value, _ = value.popped(n, left=left)
            items = items[n:] if left else items[:len(items) - n]
    return value, items


def test_an_edit_at_any_index_changes_that_element_only_and_keeps_the_old_version() -> None:
    rng = random.Random(8)
    for _ in range(60):
        value, items = _mixed(rng)
        for i in range(len(items)):
            after = edited_at(value, i, lambda chunk, j: chunk[:j] + (b"X",) + chunk[j + 1:])
            assert list(after) == items[:i] + [b"X"] + items[i + 1:], i
        grown = edited_at(value, len(items) // 2, lambda chunk, j: chunk[:j] + (b"Y",) * 70 + chunk[j:])
        assert list(grown) == items[:len(items) // 2] + [b"Y"] * 70 + items[len(items) // 2:]  # a chunk split
        assert list(value) == items


def test_list_edits_and_spop_allocate_the_same_at_10_and_at_20000_elements() -> None:
    short = LiveList.of(0, MEMBERS[:10]).pushed([b"left"], right=False)
    long = LiveList.of(0, MEMBERS).pushed([b"left"], right=False)
    edits = [[b"LSET", b"L", b"0", b"x"], [b"LSET", b"L", b"-1", b"y"], [b"LSET", b"L", b"3", b"z"],
             [b"LTRIM", b"L", b"1", b"-1"], [b"LTRIM", b"L", b"0", b"-3"], [b"LINSERT", b"L", b"AFTER", b"left", b"n"]]
    sets = LiveMap.of(SET, 0, dict.fromkeys(MEMBERS[:10])), LiveMap.of(SET, 0, dict.fromkeys(MEMBERS))
    tracemalloc.start()
    try:
        for cmd in (rmw.Command(c, now_ms=1) for c in edits):
            costs = [_allocated(lambda v=v, c=cmd: rmw.apply(c, v)) for v in (short, long, short, long)]
            assert max(costs) < 24 * 1024, (cmd, costs)
        for cmd in (rmw.Command([b"SPOP", b"S"], now_ms=1), rmw.Command([b"SPOP", b"S", b"3"], now_ms=7)):
            costs = [_allocated(lambda v=v, c=cmd: rmw.apply(c, v)) for v in (*sets, *sets)]
            assert max(costs) < 48 * 1024, (cmd, costs)
    finally:
        tracemalloc.stop()
    for cmd in (rmw.Command(c, now_ms=1) for c in edits):
        after, answer = rmw.apply(cmd, long)
        assert type(after) is LiveList and image_bytes(after) < 24 * 1024
        assert (after.stored(), answer) == _generic(cmd, long.stored()), cmd
    cmd = rmw.Command([b"SPOP", b"S", b"3"], now_ms=7)
    after, answer = rmw.apply(cmd, sets[1])
    assert type(after) is LiveMap and after.count == len(MEMBERS) - 3
    assert (after.stored(), answer) == _generic(cmd, sets[1].stored())  # the same draw as list(set)


def test_a_refused_list_edit_leaves_the_list_as_it_was() -> None:
    value = LiveList.of(0, MEMBERS[:100])
    over = rmw.Command([b"LSET", b"L", b"5", b"v" * 200], now_ms=1, max_bytes=len(value) + 50)
    assert rmw.apply(over, value) == (value, values.collection_too_large(values.LIST, len(value) + 50))
    insert = rmw.Command([b"LINSERT", b"L", b"BEFORE", MEMBERS[7], b"v" * 60], now_ms=1, max_bytes=len(value) + 50)
    assert rmw.apply(insert, value)[0] is value and rmw.apply(insert, value)[1].startswith(b"-ERR the list would exceed")
    shrink = rmw.Command([b"LSET", b"L", b"5", b"v"], now_ms=1, max_bytes=10)  # shrinking is never refused
    assert rmw.apply(shrink, value)[1] == b"+OK\r\n"
    assert rmw.apply(rmw.Command([b"LSET", b"L", b"100", b"v"], now_ms=1), value) == (value, b"-ERR index out of range\r\n")
    assert list(value) == MEMBERS[:100]
