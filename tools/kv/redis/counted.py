"""A persistent counted B+tree of distinct sorted keys: a sorted set's score index (livemap.py) and
the ranking every sorted-set command reads (zorder.py).

A node is a leaf (a tuple of at most FAN keys, sorted) or an Inner (its children, each child's
largest key and each child's key count). An insert or a removal copies the path from the root to
one leaf (about 3 nodes of FAN entries at 20,000 keys) and shares everything else, so the old root
stays a valid, unchanged version: a strong controlet's undo image and a snapshot's view stay O(1) to
keep, as for the rest of a live value. The counts give a key's rank, the key at a rank and the keys
between two ranks in O(log n + k). The empty tree is the empty leaf ().

Keys here are (score, member) pairs: Python orders them as Redis orders a sorted set (by score, then
member bytes), and scores are never NaN (the commands refuse one).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

FAN = 64  # keys per leaf, children per inner node: an update copies about 3 x FAN pointers at 20,000 keys
EMPTY: tuple = ()


class Inner:
    __slots__ = ("highs", "kids", "size", "sizes")

    def __init__(self, highs: tuple, kids: tuple, sizes: tuple, size: int) -> None:
        self.highs, self.kids, self.sizes, self.size = highs, kids, sizes, size

    @classmethod
    def of(cls, kids: tuple) -> Inner:
        sizes = tuple(map(size, kids))
        return cls(tuple(map(high, kids)), kids, sizes, sum(sizes))


Node = tuple | Inner


def size(node: Node) -> int:
    return len(node) if node.__class__ is tuple else node.size


def high(node: Node) -> Any:
    return node[-1] if node.__class__ is tuple else node.highs[-1]


def build(keys: list) -> Node:
    """The tree of `keys` (sorted, distinct), bottom up: O(n)."""
    level: list = [tuple(keys[at:at + FAN]) for at in range(0, len(keys), FAN)] or [EMPTY]
    while len(level) > 1:
        level = [Inner.of(tuple(level[at:at + FAN])) for at in range(0, len(level), FAN)]
    return level[0]


def insert(root: Node, key: Any) -> Node:
    """A new version with `key` (absent from `root`) added; `root` is unchanged."""
    parts = _insert(root, key)
    return parts[0] if len(parts) == 1 else Inner.of(parts)


def _insert(node: Node, key: Any) -> tuple:
    if node.__class__ is tuple:
        i = bisect_left(node, key)
        new = node[:i] + (key,) + node[i:]
        return (new,) if len(new) <= FAN else (new[:len(new) // 2], new[len(new) // 2:])
    i = min(bisect_left(node.highs, key), len(node.kids) - 1)  # past every high: the last child
    parts = _insert(node.kids[i], key)
    kids = node.kids[:i] + parts + node.kids[i + 1:]
    highs = node.highs[:i] + tuple(map(high, parts)) + node.highs[i + 1:]
    sizes = node.sizes[:i] + tuple(map(size, parts)) + node.sizes[i + 1:]
    if len(kids) <= FAN:
        return (Inner(highs, kids, sizes, node.size + 1),)
    half = len(kids) // 2
    return Inner.of(kids[:half]), Inner.of(kids[half:])


def remove(root: Node, key: Any) -> Node:
    """A new version without `key` (present in `root`); `root` is unchanged. A node left with one
    child is replaced by it; an emptied child is dropped and a leaf under a quarter full is merged
    into its neighbour, so the tree stays about as deep as log of its size."""
    node = _remove(root, key)
    while node.__class__ is Inner and len(node.kids) == 1:
        node = node.kids[0]
    return node


def _remove(node: Node, key: Any) -> Node:
    if node.__class__ is tuple:
        i = bisect_left(node, key)
        if i == len(node) or node[i] != key:
            raise KeyError(key)
        return node[:i] + node[i + 1:]
    i = bisect_left(node.highs, key)
    if i == len(node.kids):
        raise KeyError(key)
    child = _remove(node.kids[i], key)
    kids = list(node.kids)
    if size(child) == 0:
        del kids[i]
        if not kids:
            return EMPTY
        return Inner.of(tuple(kids))
    kids[i] = child
    if child.__class__ is tuple and len(child) < FAN // 4 and len(kids) > 1:
        j = i + 1 if i + 1 < len(kids) else i - 1  # the neighbour: merged when both fit in one leaf
        if kids[j].__class__ is tuple and len(kids[j]) + len(child) <= FAN:
            lo = min(i, j)
            kids[lo:lo + 2] = [kids[lo] + kids[lo + 1]]
            return Inner.of(tuple(kids))
    highs, sizes = list(node.highs), list(node.sizes)
    highs[i], sizes[i] = high(child), sizes[i] - 1
    return Inner(tuple(highs), tuple(kids), tuple(sizes), node.size - 1)


def rank(root: Node, key: Any) -> int:
    """How many keys are smaller than `key`: O(log n)."""
    return rank_by(root, key, bisect_left, None)


def rank_by(root: Node, probe: Any, bisect: Callable, key: Callable | None) -> int:
    """How many keys come before the point `bisect(keys, probe, key=key)` finds (bisect_left: before
    the first key not below probe; bisect_right: before the first key above it). O(log n)."""
    before, node = 0, root
    while node.__class__ is Inner:
        i = bisect(node.highs, probe, key=key)
        if i == len(node.kids):
            return before + node.size
        before += sum(node.sizes[:i])
        node = node.kids[i]
    return before + bisect(node, probe, key=key)


def at(root: Node, index: int) -> Any:
    """The key of rank `index` (0 <= index < size): O(log n)."""
    node = root
    while node.__class__ is Inner:
        for kid, n in zip(node.kids, node.sizes, strict=True):
            if index < n:
                node = kid
                break
            index -= n
    return node[index]


def between(root: Node, a: int, b: int) -> list:
    """The keys of ranks a .. b-1 (0 <= a <= b <= size), in order: O(log n + (b - a))."""
    out: list = []
    if a < b:
        _collect(root, a, b, out)
    return out


def _collect(node: Node, a: int, b: int, out: list) -> None:
    if node.__class__ is tuple:
        out.extend(node[a:b])
        return
    start = 0
    for kid, n in zip(node.kids, node.sizes, strict=True):
        if start >= b:
            return
        if start + n > a:
            _collect(kid, max(a - start, 0), b - start, out)
        start += n


def iterate(node: Node) -> Iterator:
    if node.__class__ is tuple:
        yield from node
        return
    for kid in node.kids:
        yield from iterate(kid)

