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

Pipelined read-modify-writes (INCR, LPUSH, HSET ...; plain SETs among them) go as one MIXED entry,
(seq, MIXED, codes, lengths, data): one code a write, as a single write's message carries it (P a
value, D a delete, R a command replicated as its delta), and the keys and wire values back to back.
The origin resolves them in order, each seeing the writes before it (resolve_run), and every
replica applies the deltas in that order against its own state, as it does single R writes.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, NamedTuple

from mlsyskit.tools.kv.controlets.base import DEL, PUT, Apply, Reply, wire_write
from mlsyskit.tools.kv.redis import rmw

BATCH = b"B"  # the code field of a batch entry (single writes carry P, D, F or R there)
MIXED = b"M"  # a batch with read-modify-writes: a code per write (P, D or R) in its own field
_ABSENT = object()  # resolve_run: a key the batch has not written yet
_BIG = sys.byteorder == "big"
assert array("I").itemsize == 4  # noqa: S101 - the wire's 32-bit length words


class ApplyBatch(NamedTuple):
    """A batch's datalet writes, in order (node/interpreter.py applies them as one step).

    reqs: the client requests they answer (the origin's; None at a replica). seq > 0: numbered, the
    before-images are kept under it (undoable); 0: not undoable (ms-ec). ops None: every write puts
    its value; else one per write, None (its value as it is; a value None deletes) or a delta
    (rmw.Command) applied to the key's value here. A mixed batch stops at its first failed write."""

    keys: Sequence[bytes]
    values: Sequence[bytes | None]
    reqs: Sequence[Any] | None
    seq: int = 0
    ops: Sequence[Any] | None = None


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
    return _pairs(fields[2], fields[3])


def _pairs(raw_lengths: bytes, data: bytes) -> tuple[list[bytes], list[bytes]]:
    lengths = array("I")
    lengths.frombytes(raw_lengths)
    if _BIG:
        lengths.byteswap()
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
    if fields[1] == MIXED:
        return mixed_apply(fields, seq)
    keys, values = batch_pairs(fields)
    return ApplyBatch(keys, values, None, seq)


def mixed_apply(fields: Sequence[Any], seq: int) -> ApplyBatch:
    """A replica's writes for a MIXED entry: P puts its value, D deletes, R applies its delta here."""
    codes = bytes(fields[2])
    keys, wire = _pairs(fields[3], fields[4])
    if len(codes) != len(keys) or codes.translate(None, b"PDR"):
        raise ValueError(f"a malformed batch entry: codes {codes[:16]!r} for {len(keys)} writes")
    values: list[bytes | None] = []
    ops: list[Any] = []
    for code, value in zip(codes, wire, strict=True):
        if code == _R:
            values.append(None)
            ops.append(rmw.from_delta(value))
        else:
            values.append(value if code == _P else None)
            ops.append(None)
    return ApplyBatch(keys, values, None, seq, ops)


_P, _R = ord("P"), ord("R")


def resolve_run(reqs: Sequence[Any], read: Any) -> None:
    """A batch's read-modify-writes resolved in order at the origin, as single ones would be one
    after another: each reads the key as the batch's writes before it left it (plain SETs among
    them included), else the datalet (`read`). Each becomes the PUT/DEL it amounts to, its answer
    in req.reply (Controlet.resolve's rule, batch by batch)."""
    written: dict[bytes, Any] = {}
    for r in reqs:
        if r.rmw is None:  # a plain SET of the batch
            written[r.key] = r.value
            continue
        current = written.get(r.key, _ABSENT)
        after, r.reply = rmw.apply(r.rmw, read(r.key) if current is _ABSENT else current)
        r.op, r.value = (PUT, after) if after is not None else (DEL, None)
        written[r.key] = after


def mixed_entry(seq: int, reqs: Sequence[Any], apply_seq: int) -> tuple[tuple, ApplyBatch]:
    """The origin's MIXED entry for a resolved batch (resolve_run) and its own writes (their
    values as made here; no delta is applied twice)."""
    keys = [r.key for r in reqs]
    codes, wire = bytearray(), []
    for r in reqs:
        code, value = wire_write(r, r.op, rmw.delta_of(r.rmw))
        codes += code
        wire.append(value)
    fields = entry_fields(seq, keys, wire)
    return (seq, MIXED, bytes(codes), fields[2], fields[3]), \
        ApplyBatch(keys, [r.value for r in reqs], reqs, apply_seq, [None] * len(reqs))


_rmw_of = attrgetter("rmw")


def has_rmw(reqs: Sequence[Any]) -> bool:
    """A batch holds a read-modify-write: it goes as a MIXED entry, or one request at a time
    (each resolved after the one before it applied), never as single actions computed at once."""
    return any(map(_rmw_of, reqs))


def origin_batch(seq: int, reqs: Sequence[Any], apply_seq: int, read: Any) -> tuple[tuple, ApplyBatch]:
    """The origin's entry and its own writes for a batch: BATCH for plain SETs (read None), else
    MIXED (its read-modify-writes resolved here first, reading the datalet with `read`)."""
    if read is None:
        return origin_entry(seq, reqs, apply_seq)
    resolve_run(reqs, read)
    return mixed_entry(seq, reqs, apply_seq)


def origin_entry(seq: int, reqs: Sequence[Any], apply_seq: int) -> tuple[tuple, ApplyBatch]:
    """The origin's stream entry for its batch (numbered seq) and its own writes answering `reqs`
    (apply_seq: the undo number, 0 for none), sharing one list of keys and one of values."""
    keys = [r.key for r in reqs]
    values = [r.value for r in reqs]
    return entry_fields(seq, keys, values), ApplyBatch(keys, values, reqs, apply_seq)


def as_singles(actions: list) -> list:
    """A list's batch actions as the single ones they stand for, in order (for an interpreter that
    queues them one by one: a remote datalet's futures, or behind an Undo)."""
    if not any(type(a) is ApplyBatch or type(a) is ReplyBatch for a in actions):
        return actions
    out: list = []
    for a in actions:
        if type(a) is ApplyBatch:
            reqs, ops = a.reqs, a.ops
            out.extend(Apply(k, v, None if reqs is None else reqs[i], a.seq, None if ops is None else ops[i])
                       for i, (k, v) in enumerate(zip(a.keys, a.values, strict=True)))
        elif type(a) is ReplyBatch:
            out.extend(Reply(r) for r in a.reqs)
        else:
            out.append(a)
    return out
