"""Before-images of the numbered writes a replica applied and may still have to undo.

The strong controlets (ms-sc, aa-sc) number their writes and mark each datalet write with its
number (Apply.seq). The interpreter keeps what the key held before it (the datalet's swap), so
that a write which failed on another replica can be taken back here (Undo: newest first), and
forgets the images once the controlet says the writes are final (Commit: every replica applied
them). A bound (bytes and entries) keeps a replica that never hears a Commit from growing
without limit; an Undo that would need a forgotten image fails, and the replica catches up.
An image that is a live value (a memory datalet's list, redis/livelist.py) shares all but one
chunk with the value after it and is counted by what it holds alone (undo_bytes), not its length:
keeping it is O(1), however long the list.
"""
from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

ENTRY_OVERHEAD = 64  # bytes counted per kept image besides the key and value


def image_bytes(before) -> int:
    """What keeping a before-image costs: bytes, or a live value's own part (never its length)."""
    if before is None:
        return 0
    return len(before) if before.__class__ is bytes else before.undo_bytes
UNKNOWN = sys.maxsize  # after a reset: nothing can be undone until the controlet commits the snapshot's base


class UndoLog:
    """Entries in seq order: (seq, key, before, size) for one write, or (seq, keys, befores, size) for
    a pipeline batch's writes under one number (keep_batch: one entry, one size, for them all)."""

    def __init__(self, limit_bytes: int = 64 << 20, limit_entries: int = 1_000_000) -> None:
        self.limit_bytes, self.limit_entries = limit_bytes, limit_entries
        self.entries: deque[tuple[int, Any, Any, int]] = deque()
        self.bytes = 0
        self.images = 0  # writes whose images are kept (a batch entry counts each of its writes)
        self.final = 0  # writes numbered <= final can no longer be undone here
        self.undone = 0  # writes taken back so far (INFO, tests)

    def keep(self, seq: int, key: bytes, before: bytes | None) -> None:
        size = ENTRY_OVERHEAD + len(key) + image_bytes(before)
        self.entries.append((seq, key, before, size))
        self.bytes += size
        self.images += 1
        self._bound()

    def keep_batch(self, seq: int, keys: Sequence[bytes], befores: list[Any]) -> None:
        """The before-images of a batch's writes (keys[i] held befores[i]), all numbered seq."""
        if not befores:
            return
        size = ENTRY_OVERHEAD * len(befores) + sum(map(len, keys))
        for before in befores:
            if before is not None:
                size += len(before) if before.__class__ is bytes else before.undo_bytes
        self.entries.append((seq, keys, befores, size))
        self.bytes += size
        self.images += len(befores)
        self._bound()

    def _bound(self) -> None:
        while self.entries and (self.bytes > self.limit_bytes or self.images > self.limit_entries):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        seq, key, before, size = self.entries.popleft()
        self.bytes -= size
        self.images -= 1 if key.__class__ is bytes else len(before)
        if seq > self.final:
            self.final = seq

    def commit(self, seq: int) -> None:
        """Writes numbered <= seq are final (after a reset: the snapshot's base)."""
        entries = self.entries
        while entries and entries[0][0] <= seq:
            self._drop_oldest()
        self.final = seq if self.final == UNKNOWN else max(self.final, seq)

    def reset(self) -> None:
        """The datalet was emptied (a snapshot follows): nothing before it can be undone."""
        self.entries.clear()
        self.bytes = 0
        self.images = 0
        self.final = UNKNOWN

    def take(self, seq: int) -> list[tuple[int, bytes, bytes | None]] | None:
        """The (seq, key, before) images that undo every write numbered >= seq, newest first; None
        when one of them may be gone (committed, trimmed by the bound, or inside a snapshot)."""
        if seq <= self.final:
            return None
        out = []
        while self.entries and self.entries[-1][0] >= seq:
            s, key, before, size = self.entries.pop()
            self.bytes -= size
            if key.__class__ is bytes:
                out.append((s, key, before))
                self.images -= 1
            else:  # a batch: its writes newest first
                out.extend((s, key[i], before[i]) for i in range(len(before) - 1, -1, -1))
                self.images -= len(before)
        self.undone += len(out)
        return out

    def put_back(self, images: list[tuple[int, bytes, bytes | None]]) -> None:
        """An Undo failed part-way: keep its images (restoring one twice is harmless) for the retry."""
        for seq, key, before in reversed(images):
            self.keep(seq, key, before)
        self.undone -= len(images)
