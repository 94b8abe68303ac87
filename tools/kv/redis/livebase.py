"""What every live value (a value the memory datalet keeps as an immutable structure instead of its
record's bytes: livelist.py, livemap.py, livestring.py) answers as the stored bytes it stands for.

A subclass gives header() (the first bytes of its record, at most values' 13-byte header: enough for
every peek at a stored value's kind or deadline), stored() (the bytes, built once per version),
__len__ (their length, counted as the value was built, never by building them) and entry(), and
may give view_entry() (what a point or size read looks into: redis/live.py read_entry).
"""
from __future__ import annotations

from typing import Any

from mlsyskit.tools.kv.redis.values import _HEADER


class LiveValue:
    __slots__ = ()

    def header(self) -> bytes:
        raise NotImplementedError

    def stored(self) -> bytes:
        raise NotImplementedError

    def entry(self) -> Any:
        raise NotImplementedError

    def view_entry(self) -> Any:
        """The entry a read handler sees (live.read_entry): its data a view answering lookups, len
        and indexes from the structure (livemap.MapView, livelist.ListView); else the whole entry."""
        return self.entry()

    def __bytes__(self) -> bytes:
        return self.stored()

    def __getitem__(self, index: Any) -> Any:
        """Slices within the record's header without building the bytes (is_tagged, kind checks)."""
        if isinstance(index, slice) and index.step is None and 0 <= (index.start or 0) \
                and index.stop is not None and 0 <= index.stop <= _HEADER.size:
            head = self.header()
            if len(head) >= index.stop or len(head) == len(self):
                return head[index]
        return self.stored()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LiveValue | bytes):
            return self.stored() == (other if isinstance(other, bytes) else other.stored())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared as its bytes, never a dict key
