"""A list as an in-memory datalet keeps it: an immutable chunked deque, so a push costs O(pushed).

Stored bytes of a list are one record (values.py: header + a msgpack array), and a push on them
copies the whole list (listpush.py's bytes path, the one a blob store such as lmdb needs). The
memory datalet instead keeps a list as a LiveList: chunks of at most CHUNK elements on two
persistent linked lists (`front`, leftmost chunk first, takes LPUSH; `back`, rightmost chunk
first, takes RPUSH). A push makes a new LiveList that copies one edge chunk (at most CHUNK
pointers) and shares everything else with the old one, which stays valid and unchanged. So:

- rmw.apply stays a pure function (current -> after), and the whole-value machinery around it
  holds as it is: the before-image a strong controlet keeps for undo is the old LiveList itself,
  pinning one chunk of its own (`undo_bytes`), and a snapshot's view (export_now) is a list of
  references that later pushes cannot change;
- the stored size (`len`) is counted as elements are added (msgpack's bin and array headers are
  known from lengths alone), so the value limit is checked before anything is applied, O(pushed);
- the stored bytes (`stored()`, `bytes()`) are values.encode of the elements -- the canonical
  record every other path (the generic commands, listpush's bytes path) produces -- built on
  demand (a read, a snapshot, a digest) and kept with that version. Replicas holding a LiveList
  and replicas holding the record's bytes therefore export, digest and compare equal.

A LiveList also answers len(), slicing and == as the stored bytes it stands for (livebase.py), so
code that only peeks at a stored value's header (values.is_tagged, a deadline check) works on it
unchanged. Sets, hashes and sorted sets are kept the same way (livemap.py), and so is a string that
APPEND grows (livestring.py).
"""
from __future__ import annotations

from collections.abc import Iterator

import msgpack

from mlsyskit.tools.kv.redis.livebase import LiveValue
from mlsyskit.tools.kv.redis.values import _HEADER, LIST, MAGIC, CorruptValue, Entry, decode

CHUNK = 64  # elements per chunk: a push copies at most this many pointers
Cell = tuple  # (chunk: tuple[bytes, ...], rest: Cell | None) -- a persistent singly linked list


def packed_size(item: bytes) -> int:
    """Bytes msgpack takes for one bin element (use_bin_type=True, the record's encoding)."""
    n = len(item)
    return n + (2 if n < 0x100 else 3 if n < 0x10000 else 5)


def array_header_size(count: int) -> int:
    return 1 if count < 16 else 3 if count < 0x10000 else 5


class LiveList(LiveValue):
    __slots__ = ("back", "count", "deadline", "front", "packed", "_stored")

    def __init__(self, deadline: int, front: Cell | None, back: Cell | None, count: int, packed: int,
                 stored: bytes | None = None) -> None:
        self.deadline = deadline
        self.front, self.back = front, back
        self.count, self.packed = count, packed  # elements, and their msgpack bytes
        self._stored = stored

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def of(cls, deadline: int, items: list[bytes], stored: bytes | None = None) -> LiveList:
        return cls(deadline, None, None, 0, 0, stored).pushed(items, right=True, keep_stored=True)

    def pushed(self, items: list[bytes], right: bool, keep_stored: bool = False) -> LiveList:
        """A new LiveList with `items` pushed as RPUSH (right) or LPUSH does (each to the head, so
        the last ends leftmost); this one is unchanged. Costs O(len(items) + CHUNK)."""
        added = sum(packed_size(x) for x in items)
        front, back = self.front, self.back
        if right:
            back = onto_back(back, tuple(items))
        else:
            front = onto_front(front, tuple(reversed(items)))  # LPUSH a b: b ends leftmost
        return LiveList(self.deadline, front, back, self.count + len(items), self.packed + added,
                        self._stored if keep_stored else None)

    def popped(self, n: int, left: bool) -> tuple[LiveList | None, list[bytes]]:
        """(a new LiveList without its n leftmost (LPOP) or rightmost (RPOP) elements -- None when
        none are left --, those elements in pop order); this one is unchanged. O(n + CHUNK), and
        when the popped end runs out, the half of the other end's chunk cells nearest to it are
        re-linked from this end (O(count / CHUNK), paid for by the pops that drain them: a banker's
        deque, so even pops alternating between the ends cost O(1) amortised)."""
        n = min(n, self.count)
        if n == self.count:
            return None, list(self)[:n] if left else list(reversed(list(self)))[:n]
        near, far = (self.front, self.back) if left else (self.back, self.front)
        taken: list[bytes] = []
        while len(taken) < n:
            if near is None:
                near, far = split_half(far)  # everything left is at the far end: bring half of it over
            chunk, rest = near
            need = n - len(taken)
            if left:
                taken.extend(chunk[:need])
                keep = chunk[need:]
            else:
                taken.extend(reversed(chunk[-need:]))
                keep = chunk[:-need] if need < len(chunk) else ()
            near = (keep, rest) if keep else rest
        front, back = (near, far) if left else (far, near)
        return LiveList(self.deadline, front, back, self.count - n,
                        self.packed - sum(packed_size(x) for x in taken)), taken

    # -- reading -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[bytes]:
        cell = self.front
        while cell is not None:
            yield from cell[0]
            cell = cell[1]
        yield from iterate_back(self.back)

    def entry(self) -> Entry:
        return Entry(LIST, self.deadline, list(self))

    def view_entry(self) -> Entry:
        return Entry(LIST, self.deadline, ListView(self))

    def header(self) -> bytes:
        return _HEADER.pack(MAGIC, LIST, self.deadline)

    def stored(self) -> bytes:
        """The record's bytes (values.encode of the elements), built once per version."""
        if self._stored is None:
            self._stored = self.header() + msgpack.packb(list(self), use_bin_type=True)
        return self._stored

    def __len__(self) -> int:
        return _HEADER.size + array_header_size(self.count) + self.packed

    @property
    def undo_bytes(self) -> int:
        """Memory this version holds that the version after it does not: its edge chunk and cell
        (elements are shared), and its bytes if a read built them."""
        return 8 * CHUNK + 128 + (len(self._stored) if self._stored is not None else 0)


class ListView:
    """One LiveList version as the list a read handler indexes (queries.py: LLEN, LINDEX, LRANGE):
    len() is its element count (O(1)); [i] walks chunks from the nearer end (O(1) at either end of a
    list pushed from that end, else O(count / CHUNK), as Redis's LINDEX walks its quicklist); [a:b]
    costs O(count / CHUNK + b - a). No element is copied but those answered."""

    __slots__ = ("live",)

    def __init__(self, live: LiveList) -> None:
        self.live = live

    def __len__(self) -> int:
        return self.live.count

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        live, n = self.live, self.live.count
        if isinstance(index, slice):
            a, b, step = index.indices(n)
            if step != 1:
                raise ValueError("a list view takes slices without a step")
            return _between(live, a, b)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(index)
        if i <= n - 1 - i:  # nearer the left end: its front chunks, else the back list from the right
            found = _walk(live.front, i, False)
            return found if found is not None else _walk(live.back, n - 1 - i, True)
        found = _walk(live.back, n - 1 - i, True)
        return found if found is not None else _walk(live.front, i, False)


def _walk(cell: Cell | None, k: int, from_right: bool) -> bytes | None:
    """The k-th element of a front list (from the left) or a back list (from the right); None when
    it holds fewer (an element is bytes, never None): the element is then in the other list."""
    while cell is not None:
        chunk = cell[0]
        if k < len(chunk):
            return chunk[-1 - k] if from_right else chunk[k]
        k -= len(chunk)
        cell = cell[1]
    return None


def _between(live: LiveList, a: int, b: int) -> list[bytes]:
    """Elements a..b-1 (0 <= a, b <= count): the chunks in order (pointers), then the span's slices."""
    chunks = []
    cell = live.front
    while cell is not None:
        chunks.append(cell[0])
        cell = cell[1]
    back = []
    cell = live.back
    while cell is not None:
        back.append(cell[0])
        cell = cell[1]
    chunks.extend(reversed(back))
    out: list[bytes] = []
    at = 0
    for chunk in chunks:
        if at >= b:
            break
        end = at + len(chunk)
        if end > a:
            out.extend(chunk[max(a - at, 0):b - at])
        at = end
    return out


def onto_back(cell: Cell | None, new: tuple) -> Cell | None:
    """The back list (rightmost chunk on top) with `new` appended on the right."""
    if cell is not None and len(cell[0]) + len(new) <= CHUNK:
        return (cell[0] + new, cell[1])
    for at in range(0, len(new), CHUNK):
        cell = (new[at:at + CHUNK], cell)
    return cell


def iterate_back(cell: Cell | None) -> Iterator:
    """The elements of a back list, leftmost first."""
    chunks = []
    while cell is not None:
        chunks.append(cell[0])
        cell = cell[1]
    for chunk in reversed(chunks):
        yield from chunk


def split_half(far: Cell) -> tuple[Cell, Cell | None]:
    """(a new near end holding the half of the far end's chunks nearest to it, the far end's rest)."""
    chunks = []
    while far is not None:
        chunks.append(far[0])  # outermost (far from the near end) first
        far = far[1]
    half = len(chunks) // 2
    rest = None
    for chunk in reversed(chunks[:half]):
        rest = (chunk, rest)
    near = None
    for chunk in chunks[half:]:
        near = (chunk, near)
    return near, rest


def onto_front(cell: Cell | None, new: tuple) -> Cell | None:
    """The front list (leftmost chunk on top) with `new` (in element order) prepended on the left."""
    if cell is not None and len(cell[0]) + len(new) <= CHUNK:
        return (new + cell[0], cell[1])
    for at in reversed(range(0, len(new), CHUNK)):
        cell = (new[at:at + CHUNK], cell)
    return cell


def promote(stored: bytes) -> bytes | LiveList:
    """A list record's bytes as a LiveList keeping those very bytes; anything else unchanged (a
    string, another kind, a damaged or non-canonical record)."""
    if stored[4:5] != LIST or stored[:4] != MAGIC:
        return stored
    try:
        entry = decode(stored)
    except CorruptValue:
        return stored
    if entry is None or entry.kind != LIST or not all(type(x) is bytes for x in entry.data):
        return stored
    live = LiveList.of(entry.deadline, entry.data, stored)
    return live if len(live) == len(stored) else stored  # only a canonical record keeps its bytes

