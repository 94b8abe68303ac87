"""One stream message per pipeline batch (issue 22 item 5): the plain SETs a client pipelined in one
read enter the ordered stream (ms-sc's chain, ms-ec's replication) as ONE numbered entry.

The front end gathers a connection's consecutive plain SETs (no options, values stored as they came)
of one read; the origin (chain head, master) numbers them together, applies them and sends one
message, (seq, BATCH, lengths, data): `data` is the batch's keys and values back to back and
`lengths` their sizes as 32-bit little-endian words, so a message of a thousand writes is four
fields to parse, frame and checksum at every hop (two large strings copied once), not two thousand.
Each replica applies the batch as one action (ApplyBatch: one interpreter step, one before-image
entry in the undo log) and the head answers its writes together (ReplyBatch).
Everything the stream guarantees is per entry and so holds per batch: the next number or a catch-up
(stream.py), the log tail and its checksum (streamlog.py), cumulative acks and write timeouts (each
request of the batch waits in the head's in_flight under the batch's number), undo (every write of
the batch keeps its before-image under that number: a datalet error on any write of the batch, at
any replica, takes the whole batch back everywhere and fails all its requests, none of which was
acknowledged). A batch is a connection's writes in its order, and a connection's writes were one
FIFO path already, so session order is unchanged.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

BATCH = b"B"  # the code field of a batch entry (single writes carry P, D, F or R there)
_BIG = sys.byteorder == "big"
assert array("I").itemsize == 4  # noqa: S101 - the wire's 32-bit length words


class ApplyBatch(NamedTuple):
    """A batch's datalet writes, in order (node/interpreter.py applies them as one step).

    reqs: the client requests they answer (the origin's; None at a replica). seq > 0: numbered, the
    before-images are kept under it (undoable); 0: not undoable (ms-ec)."""

    keys: Sequence[bytes]
    values: Sequence[bytes]
    reqs: Sequence[Any] | None
    seq: int = 0


class ReplyBatch(NamedTuple):
    """Writes acknowledged together (the chain tail's cumulative ACK): answered in one pass."""

    reqs: Sequence[Any]


def batch_fields(seq: int, reqs: Sequence[Any]) -> tuple:
    """The stream entry of a batch of plain SET requests: (seq, BATCH, lengths, data)."""
    return entry_fields(seq, [r.key for r in reqs], [r.value for r in reqs])


def entry_fields(seq: int, keys: list[bytes], values: list[bytes]) -> tuple:
    """batch_fields from the batch's keys and values: interleaved by slice assignment, sized by
    map(len): no Python-level step per write."""
    parts: list[Any] = [None] * (2 * len(keys))
    parts[::2] = keys
    parts[1::2] = values
    lengths = array("I", map(len, parts))
    if _BIG:
        lengths.byteswap()
    return seq, BATCH, lengths.tobytes(), b"".join(parts)


def batch_pairs(fields: Sequence[Any]) -> tuple[list[bytes], list[bytes]]:
    """The keys and values of a batch entry, in order (ValueError: the entry is malformed)."""
    lengths = array("I")
    lengths.frombytes(fields[2])
    if _BIG:
        lengths.byteswap()
    data = fields[3]
    if len(lengths) % 2 or sum(lengths) != len(data):
        raise ValueError(f"a malformed batch entry: {len(lengths)} lengths for {len(data)} bytes")
    keys: list[bytes] = []
    values: list[bytes] = []
    pos = 0
    it = iter(lengths)
    for klen, vlen in zip(it, it, strict=True):
        end = pos + klen
        keys.append(data[pos:end])
        pos = end + vlen
        values.append(data[end:pos])
    return keys, values


def batch_apply(fields: Sequence[Any], seq: int) -> ApplyBatch:
    """A replica's datalet writes for a batch entry, in the origin's order (seq 0: not undoable)."""
    keys, values = batch_pairs(fields)
    return ApplyBatch(keys, values, None, seq)


def origin_entry(seq: int, reqs: Sequence[Any], apply_seq: int) -> tuple[tuple, ApplyBatch]:
    """The origin's stream entry for its batch (numbered seq) and its own writes answering `reqs`
    (apply_seq: the undo number, 0 for none), sharing one list of keys and one of values."""
    keys = [r.key for r in reqs]
    values = [r.value for r in reqs]
    return entry_fields(seq, keys, values), ApplyBatch(keys, values, reqs, apply_seq)
