"""The recent history of a numbered stream: a bounded log of the last messages, and a chain checksum.

A replica that is a few writes behind (a lost message, a failover, a switch, a node that copied
its state as a learner and then joined) needs only the messages after its position, not the whole
datalet. Every replica of a numbered stream (stream.py) therefore keeps the last messages it
applied or originated, (seq, fields) exactly as apply_stream takes them, bounded by bytes.

Equal numbers are not enough to hand out a tail: after an ms-ec promotion the new master continues
the numbering from its own position, so a replica that had applied the old master's later writes
holds different messages under the same numbers. Each replica therefore folds every message it
applies into a chain checksum, chain(n) = crc32 over (chain(n-1), n, fields). Two replicas with the
same chain at position p applied the same messages 1..p (up to a 32-bit collision; peers are
authenticated, so no one crafts one). A source hands out the tail after p only when its own chain
at p equals the requester's; anything else (a requester ahead of it, a different history, a
position older than the log, a replica whose state is not exactly "as of its position") gets the
whole snapshot as before.
"""
from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any
from zlib import crc32

ENTRY_OVERHEAD = 64  # bytes counted per entry beside its fields (tuple, ints, deque slot)


def as_bytes(field: Any) -> bytes:
    """A field as it crosses the wire (the origin holds ints and strs, receivers get bytes)."""
    if type(field) is bytes:
        return field
    if isinstance(field, bytes | bytearray | memoryview):
        return bytes(field)
    return str(field).encode()


def chain_step(chain: int, seq: int, fields: Sequence[Any]) -> int:
    """The checksum after applying message `seq` (fields[0] is seq) on top of `chain`.

    The lengths go first, so field boundaries cannot shift (k|ab vs ka|b). ms-sc and ms-ec messages
    (seq, code, key, value) take the short path: it is on every write of the origin and replicas."""
    if len(fields) == 4:
        code, key, value = fields[1], fields[2], fields[3]
        if type(code) is not bytes or type(key) is not bytes or type(value) is not bytes:
            code, key, value = as_bytes(code), as_bytes(key), as_bytes(value)
        h = zlib.crc32(b"%d %d %d " % (seq, len(code), len(key)), chain)
        return zlib.crc32(value, zlib.crc32(key, zlib.crc32(code, h)))
    parts = [as_bytes(f) for f in fields[1:]]
    h = zlib.crc32(b"%d %s " % (seq, b" ".join(b"%d" % len(p) for p in parts)), chain)
    for p in parts:
        h = zlib.crc32(p, h)
    return h


def fields_size(fields: Sequence[Any]) -> int:
    return sum(len(f) for f in fields[1:] if isinstance(f, bytes | str))


class StreamHistory:
    """Where this replica stands in the stream's history, and the messages that led there.

    `chain` is the checksum at position `seq`, or None when this replica's state is not known to be
    exactly the stream's state at `seq` (a fresh process, an interrupted snapshot, a failed datalet
    write). Entries run contiguously from base + 1 to seq; base_chain is the checksum at base.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.entries: deque[tuple[int, Sequence[Any], int, int]] = deque()  # (seq, fields, chain after, size)
        self.bytes = 0
        self.seq, self.chain = 0, None
        self.base, self.base_chain = 0, None

    def position(self, applied: int) -> tuple[int, int] | tuple[()]:
        """What a catch-up request carries: (seq, chain) when the state is exactly that, else ()."""
        return (applied, self.chain) if self.chain is not None and self.seq == applied else ()

    def restart(self, seq: int, chain: int | None) -> None:
        """The state is now exactly the stream's at `seq` with checksum `chain` (None: unknown)."""
        self.entries.clear()
        self.bytes = 0
        self.seq, self.chain = seq, chain
        self.base, self.base_chain = seq, chain

    def forget(self, seq: int) -> None:
        self.restart(seq, None)

    def truncate(self, seq: int) -> None:
        """Back to position `seq`: the writes after it were undone (controlets/undo.py)."""
        if seq >= self.seq:
            return
        while self.entries and self.entries[-1][0] > seq:
            self.bytes -= self.entries.pop()[3]
        if self.chain is not None and self.entries and self.entries[-1][0] == seq:
            self.seq, self.chain = seq, self.entries[-1][2]
        elif self.chain is not None and seq == self.base:
            self.seq, self.chain = seq, self.base_chain
        else:
            self.forget(seq)

    def record(self, seq: int, fields: Sequence[Any]) -> None:
        """Message `seq` was applied (or originated) here, right after seq - 1."""
        chain = self.chain
        if chain is None or seq != self.seq + 1:
            self.forget(seq)  # a message applied on an unknown state: the history is unknown too
            return
        if len(fields) == 4 and type(fields[1]) is bytes and type(fields[2]) is bytes and type(fields[3]) is bytes:
            code, key, value = fields[1], fields[2], fields[3]  # chain_step's short path, inlined: every write
            chain = crc32(value, crc32(key, crc32(code, crc32(b"%d %d %d " % (seq, len(code), len(key)), chain))))
            size = ENTRY_OVERHEAD + len(code) + len(key) + len(value)
        else:  # (a pipeline batch, controlets/batch.py, is four fields too: the short path above)
            chain, size = chain_step(chain, seq, fields), ENTRY_OVERHEAD + fields_size(fields)
        self.chain, self.seq = chain, seq
        self.entries.append((seq, fields, chain, size))
        self.bytes += size
        while self.bytes > self.limit and self.entries:
            s, _, c, sz = self.entries.popleft()
            self.bytes -= sz
            self.base, self.base_chain = s, c

    def tail_after(self, seq: int, chain: int) -> list[Sequence[Any]] | None:
        """The messages after `seq` if this history passed through (seq, chain) and still holds them."""
        if self.chain is None or seq > self.seq:
            return None  # unknown here, or the requester is ahead (it holds writes this one lacks)
        if seq == self.base:
            at, start = self.base_chain, 0
        elif self.base < seq:
            start = seq - self.base
            at = self.entries[start - 1][2]
        else:
            return None  # older than the log
        if at != chain:
            return None  # another history under the same numbers
        return [e[1] for e in islice(self.entries, start, None)]
