"""A snapshot's values, reassembled when one was sent in parts (node/snapshot.py chunks by bytes).

A snapshot message carries at most CHUNK_BYTES of keys and values, so every message stays far
below a receiver's request limit whatever the values' sizes. A value larger than a chunk goes as
SNAPPART token key piece messages followed by SNAPDATA token key last-piece; the link is FIFO and
nothing else of that snapshot comes between, so the receiver joins the pieces to the first pair
of the next SNAPDATA. Pure: both snapshot receivers (stream.py, aa_ec_entry.py) use it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CHUNK_BYTES = 1 << 20  # keys + values per snapshot message (and per part of a larger value)


class ValueParts:
    """The pieces of one value received so far (SNAPPART), joined by the SNAPDATA that ends it."""

    def __init__(self) -> None:
        self.key: bytes | None = None
        self.pieces: list[bytes] = []
        self.bytes = 0  # received in parts so far (progress)

    def clear(self) -> None:
        self.key, self.pieces = None, []

    def add(self, fields: Sequence[Any]) -> None:
        """SNAPPART token key piece."""
        key, piece = bytes(fields[1]), bytes(fields[2])
        if key != self.key:
            self.key, self.pieces = key, []
        self.pieces.append(piece)
        self.bytes += len(piece)

    def pairs(self, fields: Sequence[Any]) -> list[tuple[Any, Any]]:
        """SNAPDATA token k v k v ...: its pairs, the first completed by the parts that preceded it."""
        out = [(fields[i], fields[i + 1]) for i in range(1, len(fields) - 1, 2)]
        if self.pieces and out and bytes(out[0][0]) == self.key:
            out[0] = (out[0][0], b"".join((*self.pieces, bytes(out[0][1]))))
        self.clear()
        return out
