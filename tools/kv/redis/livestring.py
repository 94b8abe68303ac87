"""A string that APPEND grows, as the memory datalet keeps it: a rope, so an APPEND costs O(appended).

APPEND on bytes (values.py's stored string) copies the whole string (`current + tail`), so a string
grown by APPENDs costs O(size) per command on the write point and on every replica (each applies the
command: rmw.DELTAS). A LiveString is the appended pieces on a persistent linked list (last piece on
top): an APPEND makes a new LiveString with one more cell and shares the rest, so the old version is
still valid (an undo image, a snapshot's view) at no cost. Its stored bytes (values.encode of the
string: the string itself, or a record when it has a deadline or would read as one) are joined on
demand -- a read, an export, a digest -- once per version, and the joined string then stands in for
the pieces (the next APPEND starts from it).
"""
from __future__ import annotations

from typing import Any

from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.redis.livebase import LiveValue
from mlsyskit.tools.kv.redis.values import _HEADER, FIRST, MAGIC, STRING, Entry, encode, string_too_large

LEAD = _HEADER.size + 3  # bytes of the string kept at hand: enough to answer any peek at a header


class LiveString(LiveValue):
    __slots__ = ("deadline", "lead", "pieces", "size", "_stored")

    def __init__(self, deadline: int, pieces: Any, size: int, lead: bytes) -> None:
        self.deadline = deadline
        self.pieces, self.size = pieces, size  # (piece, rest) cells, last piece on top; the string's length
        self.lead = lead  # the string's first LEAD bytes (all of it when shorter)
        self._stored: bytes | None = None

    @classmethod
    def of(cls, deadline: int, data: bytes) -> LiveString:
        return cls(deadline, (data, None), len(data), data[:LEAD])

    def appended(self, piece: bytes) -> LiveString:
        lead = self.lead if len(self.lead) >= LEAD else (self.lead + piece)[:LEAD]
        return LiveString(self.deadline, (piece, self.pieces), self.size + len(piece), lead)

    def data(self) -> bytes:
        pieces = []
        cell = self.pieces
        while cell is not None:
            pieces.append(cell[0])
            cell = cell[1]
        pieces.reverse()
        joined = b"".join(pieces)
        self.pieces = (joined, None)  # the same string, one piece: later APPENDs share it
        return joined

    def _tagged(self) -> bool:
        """Stored as a record (values.encode): a deadline, or a string that would read as one."""
        return bool(self.deadline) or self.lead[:4] == MAGIC

    def entry(self) -> Entry:
        return Entry(STRING, self.deadline, self.data())

    def header(self) -> bytes:
        return _HEADER.pack(MAGIC, STRING, self.deadline) + self.lead if self._tagged() else self.lead

    def stored(self) -> bytes:
        if self._stored is None:
            self._stored = encode(self.entry())
        return self._stored

    def __len__(self) -> int:
        return self.size + (_HEADER.size if self._tagged() else 0)

    @property
    def undo_bytes(self) -> int:
        """Memory this version holds that the version after it does not (its pieces are shared)."""
        return 128 + (len(self._stored) if self._stored is not None else 0)


def append(cmd: list[bytes], current: Any, now_ms: int, limit: int) -> tuple[Any, bytes] | None:
    """(the value afterwards, answer) for APPEND key tail, or None: take the generic path (a
    collection: WRONGTYPE; an expired key; a record the memory datalet keeps as bytes)."""
    tail = cmd[2]
    if current is None:
        base = LiveString(0, None, 0, b"")
    elif current.__class__ is bytes:
        if current[:1] == FIRST:
            return None
        base = LiveString.of(0, current)
    elif current.__class__ is LiveString and not 0 < current.deadline <= now_ms:
        base = current
    else:
        return None
    if tail and base.size + len(tail) > limit:
        return current, string_too_large(limit)  # checked first: nothing is applied anywhere
    return base.appended(tail), resp.integer(base.size + len(tail))


def promote(stored: bytes) -> bytes | LiveString:
    """A string record (one with a deadline, or an escaped string) as a LiveString; a record that
    values.encode would not write (a deadline-less record of a plain string) stays bytes."""
    if stored[4:5] != STRING or stored[:4] != MAGIC or len(stored) < _HEADER.size:
        return stored
    deadline = _HEADER.unpack_from(stored)[2]
    live = LiveString.of(deadline, stored[_HEADER.size:])
    if not live._tagged():
        return stored
    live._stored = stored
    return live
