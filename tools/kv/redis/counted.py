"""A persistent counted B+tree of distinct sorted keys: a sorted set's score index (livemap.py) and
the ranking every sorted-set command reads (zorder.py).

A node is a leaf (a list of at most FAN keys, sorted) or an Inner (its children, each child's
largest key and each child's key count). An insert or a removal copies the path from the root to
one leaf (about 3 nodes of FAN entries at 20,000 keys) and shares everything else, so the old root
stays a valid, unchanged version: a strong controlet's undo image and a snapshot's view stay O(1) to
keep, as for the rest of a live value. The counts give a key's rank, the key at a rank and the keys
between two ranks in O(log n + k). The empty tree is an empty leaf.

Keys here are (score, member) pairs: Python orders them as Redis orders a sorted set (by score, then
member bytes), and scores are never NaN (the commands refuse one).
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

FAN = 64  # keys per leaf, children per inner node: an update copies about 3 x FAN pointers at 20,000 keys
FILL = 48  # keys per leaf (children per node) of a bulk-built tree: room for inserts before a split


class Inner:
    """kids, highs (each kid's largest key) and sizes (each kid's key count) are lists that are never
    changed once the node is made (a list copies faster than a tuple is sliced and joined)."""

    __slots__ = ("highs", "kids", "size", "sizes")

    def __init__(self, highs: list, kids: list, sizes: list, size: int) -> None:
        self.highs, self.kids, self.sizes, self.size = highs, kids, sizes, size

    @classmethod
    def of(cls, kids: list) -> Inner:
        sizes = [size(k) for k in kids]
        return cls([high(k) for k in kids], kids, sizes, sum(sizes))


Node = list | Inner  # a leaf is a sorted list of keys, never changed once made


def size(node: Node) -> int:
    return len(node) if node.__class__ is list else node.size


def high(node: Node) -> Any:
    return node[-1] if node.__class__ is list else node.highs[-1]


def build(keys: list) -> Node:
    """The tree of `keys` (sorted, distinct), bottom up: O(n)."""
    level: list = [keys[at:at + FILL] for at in range(0, len(keys), FILL)] or [[]]
    while len(level) > 1:
        level = [Inner.of(level[at:at + FILL]) for at in range(0, len(level), FILL)]
    return level[0]


def insert(root: Node, key: Any) -> Node:
    """A new version with `key` (absent from `root`) added; `root` is unchanged."""
    parts = _insert(root, key)
    return parts[0] if len(parts) == 1 else Inner.of(list(parts))


def _insert(node: Node, key: Any) -> tuple:
    if node.__class__ is list:
        new = node.copy()
        new.insert(bisect_left(node, key), key)
        return (new,) if len(new) <= FAN else (new[:len(new) // 2], new[len(new) // 2:])
    highs = node.highs
    i = bisect_left(highs, key)
    if i == len(highs):
        i -= 1  # past every high: the last child, whose high becomes the key
    parts = _insert(node.kids[i], key)
    kids = node.kids.copy()
    if len(parts) == 1:
        kids[i] = parts[0]
        if key > highs[i]:
            highs = highs.copy()
            highs[i] = key
        sizes = node.sizes.copy()
        sizes[i] += 1
        return (Inner(highs, kids, sizes, node.size + 1),)
    kids[i:i + 1] = parts
    if len(kids) <= FAN:
        highs, sizes = highs.copy(), node.sizes.copy()
        highs[i:i + 1] = [high(p) for p in parts]
        sizes[i:i + 1] = [size(p) for p in parts]
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
    if node.__class__ is list:
        i = bisect_left(node, key)
        if i == len(node) or node[i] != key:
            raise KeyError(key)
        new = node.copy()
        del new[i]
        return new
    i = bisect_left(node.highs, key)
    if i == len(node.kids):
        raise KeyError(key)
    child = _remove(node.kids[i], key)
    kids = node.kids.copy()
    if size(child) == 0:
        del kids[i]
        return Inner.of(kids) if kids else []
    kids[i] = child
    if child.__class__ is list and len(child) < FAN // 4 and len(kids) > 1:
        j = i + 1 if i + 1 < len(kids) else i - 1  # the neighbour: merged when both fit in one leaf
        if kids[j].__class__ is list and len(kids[j]) + len(child) <= FAN:
            lo = min(i, j)
            kids[lo:lo + 2] = [kids[lo] + kids[lo + 1]]
            return Inner.of(kids)
    highs, sizes = node.highs, node.sizes.copy()
    if key == highs[i]:  # the child's largest key went: its high is now its new largest
        highs = highs.copy()
        highs[i] = high(child)
    sizes[i] -= 1
    return Inner(highs, kids, sizes, node.size - 1)


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
    if node.__class__ is list:
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
    if node.__class__ is list:
        yield from node
        return
    for kid in node.kids:
        yield from iterate(kid)

