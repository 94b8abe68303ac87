"""A sorted set's order (by score, then member bytes, as Redis orders it), which its range reads
(zranges.py: ZRANGE, ZRANGEBYSCORE, ZCOUNT, ZRANK ...) and ZPOPMIN/ZPOPMAX (datatypes.py) read.

The order is a counted B+tree of (score, member) keys (counted.py). A live sorted set keeps it as
its score index (livemap.py), updated by each write in O(log n), so these cost O(log n + k) for k
members answered; a sorted set decoded from bytes (a blob datalet, the generic path) builds it
from its members first (a sort, O(n log n) per call, as before the index). One implementation of
each command for both forms.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from mlsyskit.tools.kv.redis import counted


def _score(pair: tuple) -> float:
    return pair[0]


class Ranking:
    """One version of a sorted set's order: len, the pairs between two ranks, a member's rank and
    how many scores lie below a bound, each O(log n) (+ k pairs)."""

    __slots__ = ("root",)

    def __init__(self, root: counted.Node) -> None:
        self.root = root

    def __len__(self) -> int:
        return counted.size(self.root)

    def between(self, a: int, b: int) -> list[tuple[float, bytes]]:
        return counted.between(self.root, a, b)

    def rank(self, member: bytes, score: float) -> int:
        return counted.rank(self.root, (score, member))

    def below(self, score: float, inclusive: bool) -> int:
        """Members with a score < `score` (<= when inclusive)."""
        return counted.rank_by(self.root, score, bisect_right if inclusive else bisect_left, _score)


def ranking(data: Any) -> Ranking:
    """The order of a sorted set's members: a live value's score index as it is (O(1)), else built
    from the dict of member -> score (O(n log n))."""
    index = getattr(data, "scores", None)
    if index is not None:
        return Ranking(index)
    return Ranking(counted.build(sorted((score, member) for member, score in data.items())))


def popped(data: Any, count: int, highest: bool) -> list[tuple[float, bytes]]:
    """The `count` lowest (or highest, highest first) (score, member) pairs: ZPOPMIN/ZPOPMAX's pick."""
    order = ranking(data)
    n = len(order)
    k = min(count, n)
    if not highest:
        return order.between(0, k)
    pairs = order.between(n - k, n)
    pairs.reverse()
    return pairs
