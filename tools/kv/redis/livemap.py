"""A set, hash or sorted set as the memory datalet keeps it: a persistent hash trie, so a write costs
O(written members x log n) instead of a copy and re-encode of the whole value.

The stored record (values.py) of these kinds is one msgpack array in the members' insertion order
(dict order: an update keeps a member's place, a removed member that comes back goes last). A
LiveMap stands for exactly those bytes and keeps:

- `root`: a hash trie of member -> (ordinal, value): nodes are 32-slot tuples indexed by 5 bits of
  the member's hash, leaves are dicts of at most LEAF members. A write copies the path to one leaf
  (about 3 tuples and one small dict at 20,000 members) and shares everything else, so the old
  version stays valid and unchanged: it is a strong controlet's undo image (O(1) to keep) and a
  snapshot's view, as a LiveList is (livelist.py);
- `order`: the members in insertion order, a counted B+tree of (ordinal, member) (counted.py): a
  new member takes the next ordinal (`logged`) and goes last, a removed one leaves it, O(log n)
  each, and the j-th member is found in O(log n) (SPOP's draw: datatypes._spop);
- the record's size, counted as members come and go (msgpack's lengths depend on sizes alone), so
  the value limit is checked before anything is applied;
- `scores` (sorted sets only): the score index, a counted B+tree of (score, member) (counted.py),
  updated with the trie in O(log n) per member written, persistent like it: ZRANGE, ZRANK,
  ZRANGEBYSCORE, ZCOUNT and ZPOPMIN/ZPOPMAX read their members off it (zorder.py).

Python's hash of bytes differs between processes: only the trie's shape depends on it, never the
order, the bytes or an answer, so replicas agree. Writes go through MapEdit, the dict-like edit
the commands' own handlers (datatypes.py) change as they would change a dict: one implementation
of each command, for both forms.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from mlsyskit.tools.kv.redis import counted
from mlsyskit.tools.kv.redis.livebase import LiveValue
from mlsyskit.tools.kv.redis.livelist import array_header_size, packed_size
from mlsyskit.tools.kv.redis.values import _HEADER, HASH, MAGIC, SET, ZSET, CorruptValue, Entry, decode

BITS, MASK = 5, 31  # a node has 32 slots, indexed by 5 bits of the hash per level
LEAF = 16  # members in a leaf before it splits into a node
DEEPEST = 60  # levels past this (all 64 bits of the hash used) never split: equal hashes share a leaf
EMPTY = (None,) * (MASK + 1)
KINDS = (SET, HASH, ZSET)
FLOAT_SIZE = 9  # msgpack's float64: a sorted set's score


def value_size(value: Any) -> int:
    """msgpack bytes of a member's value: none (set), bin (hash), float64 (sorted set)."""
    return 0 if value is None else FLOAT_SIZE if value.__class__ is float else packed_size(value)


def _find(node: tuple, h: int, key: bytes) -> tuple | None:
    shift = 0
    while True:
        child = node[(h >> shift) & MASK]
        if child is None:
            return None
        if child.__class__ is dict:
            return child.get(key)
        node, shift = child, shift + BITS


def _with(node: tuple, h: int, shift: int, key: bytes, value: Any, ordinal: int) -> tuple[tuple, tuple | None]:
    """(`node` with key -> (its ordinal, value), copying only the path to its leaf; the key's old
    slot). A key already there keeps its ordinal (its place in the order), a new one takes `ordinal`."""
    i = (h >> shift) & MASK
    child = node[i]
    old = None
    if child is None:
        new: Any = {key: (ordinal, value)}
    elif child.__class__ is dict:
        new = child.copy()
        old = new.get(key)
        new[key] = (ordinal if old is None else old[0], value)
        if len(new) > LEAF and shift + BITS <= DEEPEST:
            new = _node(new, shift + BITS)
    else:
        new, old = _with(child, h, shift + BITS, key, value, ordinal)
    out = list(node)
    out[i] = new
    return tuple(out), old


def _without(node: tuple, h: int, shift: int, key: bytes) -> tuple:
    """`node` without key (which it holds)."""
    i = (h >> shift) & MASK
    child = node[i]
    if child.__class__ is dict:
        new: Any = child.copy()
        del new[key]
        new = new or None
    else:
        new = _without(child, h, shift + BITS, key)
    out = list(node)
    out[i] = new
    return tuple(out)


def _node(leaf: dict, shift: int) -> tuple:
    """A node holding every member of `leaf` (a whole map at shift 0: the bulk build)."""
    buckets: dict[int, dict] = {}
    for key, slot in leaf.items():
        buckets.setdefault((hash(key) >> shift) & MASK, {})[key] = slot
    out: list[Any] = [None] * (MASK + 1)
    for i, bucket in buckets.items():
        out[i] = _node(bucket, shift + BITS) if len(bucket) > LEAF and shift + BITS <= DEEPEST else bucket
    return tuple(out)


def _leaves(node: tuple) -> Iterator[dict]:
    for child in node:
        if child.__class__ is dict:
            yield child
        elif child is not None:
            yield from _leaves(child)


class LiveMap(LiveValue):
    __slots__ = ("count", "deadline", "kind", "logged", "order", "packed", "root", "scores", "_stored")

    def __init__(self, kind: bytes, deadline: int, root: tuple, count: int, packed: int, order: Any,
                 logged: int, stored: bytes | None = None, scores: Any = None) -> None:
        self.kind, self.deadline = kind, deadline
        self.root, self.count, self.packed = root, count, packed  # members, and their msgpack bytes
        self.order, self.logged = order, logged  # insertion order, and the next member's ordinal
        self.scores = scores  # a sorted set's score index (counted.py); None for a set or a hash
        self._stored = stored

    @classmethod
    def of(cls, kind: bytes, deadline: int, data: dict, stored: bytes | None = None) -> LiveMap:
        """The live form of a dict (an entry's data: values.Entry), in its order: O(len(data)), and
        a sorted set's index O(n log n)."""
        slots = {m: (i, v) for i, (m, v) in enumerate(data.items())}
        packed = sum(packed_size(m) + value_size(v) for m, v in data.items())
        scores = counted.build(sorted((score, member) for member, score in data.items())) if kind == ZSET else None
        return cls(kind, deadline, _node(slots, 0), len(slots), packed, counted.build(list(enumerate(data))),
                   len(slots), stored, scores)

    # -- reading -------------------------------------------------------------------------------
    def get(self, key: bytes, default: Any = None) -> Any:
        slot = _find(self.root, hash(key), key)
        return default if slot is None else slot[1]

    def __contains__(self, key: bytes) -> bool:
        return _find(self.root, hash(key), key) is not None

    def items(self) -> Iterator[tuple[bytes, Any]]:
        """(member, value) in insertion order: the order tree's members, their values from the trie's
        leaves. O(n)."""
        if self.kind == SET:
            return ((m, None) for _, m in counted.iterate(self.order))
        found = {key: slot[1] for leaf in _leaves(self.root) for key, slot in leaf.items()}
        return ((m, found[m]) for _, m in counted.iterate(self.order))

    def data(self) -> dict:
        return dict(self.items())

    def entry(self) -> Entry:
        return Entry(self.kind, self.deadline, self.data())

    def view_entry(self) -> Entry:
        return Entry(self.kind, self.deadline, MapView(self))

    def header(self) -> bytes:
        return _HEADER.pack(MAGIC, self.kind, self.deadline)

    def stored(self) -> bytes:
        """The record's bytes (values.encode of the entry), built once per version."""
        if self._stored is None:
            if self.kind == SET:
                flat = [m for m, _ in self.items()]
            else:
                flat = [x for pair in self.items() for x in pair]
            self._stored = self.header() + msgpack.packb(flat, use_bin_type=True)
        return self._stored

    def __len__(self) -> int:
        return _HEADER.size + array_header_size(self.count if self.kind == SET else 2 * self.count) + self.packed

    @property
    def undo_bytes(self) -> int:
        """Memory this version holds that the version after it does not: the copied trie path (about 3
        nodes), a leaf, the order tree's path and a sorted set's index path (about 3 nodes of FAN, 3
        tuples each), and its bytes if a read built them."""
        paths = (1 if self.scores is None else 2) * 3 * 3 * 8 * counted.FAN
        return 3 * 8 * (MASK + 1) + 96 * LEAF + 256 + paths + (len(self._stored) if self._stored else 0)

    def edit(self) -> MapEdit:
        return MapEdit(self)


class MapView:
    """One LiveMap version as the dict a read handler looks into (queries.py: HGET, SISMEMBER,
    ZSCORE, HLEN ...): get, in and len, each O(log n) or O(1), no member decoded; a sorted set's
    score index (`scores`: zorder.ranking reads it for ZRANGE, ZRANK, ZCOUNT ...) and the members in
    order (in_order: SPOP's draw)."""

    __slots__ = ("count", "order", "root", "scores")

    def __init__(self, base: LiveMap) -> None:
        self.root, self.count, self.scores, self.order = base.root, base.count, base.scores, base.order

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key: bytes) -> bool:
        return _find(self.root, hash(key), key) is not None

    def get(self, key: bytes, default: Any = None) -> Any:
        slot = _find(self.root, hash(key), key)
        return default if slot is None else slot[1]

    def in_order(self) -> InOrder:
        return InOrder(self.order)


class InOrder(Sequence):
    """The members in insertion order as a sequence (what list(a dict) gives): [j] in O(log n), so
    random.sample draws from it exactly as from that list without building it (SPOP)."""

    __slots__ = ("order",)

    def __init__(self, order: counted.Node) -> None:
        self.order = order

    def __len__(self) -> int:
        return counted.size(self.order)

    def __getitem__(self, j: int) -> bytes:  # type: ignore[override]  # random.sample takes ints only
        if not 0 <= j < counted.size(self.order):
            raise IndexError(j)
        return counted.at(self.order, j)[1]

    def __iter__(self) -> Iterator[bytes]:
        return (m for _, m in counted.iterate(self.order))


class MapEdit(MapView):
    """A dict-like edit of one LiveMap version: what datatypes' handlers read and change (get, in,
    len, [k] = v, del, update, copy). freeze() makes the new version; the base is never changed."""

    __slots__ = ("base", "logged", "packed")

    def __init__(self, base: LiveMap) -> None:
        self.base = base
        self.root, self.count, self.packed, self.scores = base.root, base.count, base.packed, base.scores
        self.order, self.logged = base.order, base.logged

    def copy(self) -> MapEdit:
        return self  # a fresh edit made for one command (the handlers copy the dict they change)

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.root, old = _with(self.root, hash(key), 0, key, value, self.logged)
        if self.scores is not None:  # a sorted set: its index moves the member to its new score
            if old is not None:
                self.scores = counted.remove(self.scores, (old[1], key))
            self.scores = counted.insert(self.scores, (value, key))
        if old is None:  # a new member goes last, as in a dict
            self.order = counted.insert(self.order, (self.logged, key))
            self.logged += 1
            self.count += 1
            self.packed += packed_size(key) + value_size(value)
        else:
            self.packed += value_size(value) - value_size(old[1])

    def __delitem__(self, key: bytes) -> None:
        h = hash(key)
        slot = _find(self.root, h, key)
        if slot is None:
            raise KeyError(key)
        self.root = _without(self.root, h, 0, key)
        self.order = counted.remove(self.order, (slot[0], key))
        if self.scores is not None:
            self.scores = counted.remove(self.scores, (slot[1], key))
        self.count -= 1
        self.packed -= packed_size(key) + value_size(slot[1])

    def update(self, other: Any) -> None:
        for key, value in (other.items() if hasattr(other, "items") else other):
            self[key] = value

    def freeze(self, deadline: int) -> LiveMap | None:
        """The version this edit made (None: the collection was emptied, and Redis removes it)."""
        base = self.base
        if self.root is base.root and deadline == base.deadline:
            return base
        if not self.count:
            return None
        return LiveMap(base.kind, deadline, self.root, self.count, self.packed, self.order, self.logged, None,
                       self.scores)


def promote(stored: bytes) -> bytes | LiveMap:
    """A set, hash or sorted-set record's bytes as a LiveMap keeping those very bytes; anything
    else unchanged (another kind, a damaged or non-canonical record)."""
    if stored[4:5] not in KINDS or stored[:4] != MAGIC:
        return stored
    try:
        entry = decode(stored)
    except CorruptValue:
        return stored
    if entry is None or entry.kind not in KINDS or not entry.data:
        return stored
    live = LiveMap.of(entry.kind, entry.deadline, entry.data, stored)
    return live if len(live) == len(stored) else stored  # only a canonical record keeps its bytes
