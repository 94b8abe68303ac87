"""How a key's Redis value is stored in a datalet: plain bytes, or a tagged record.

Datalets store bytes only. A plain string without an expiry deadline is stored as itself,
so the GET/SET fast paths and every existing datalet stay byte-for-byte what they were.
Everything else -- a string with a deadline, a list, a set, a hash, a sorted set, or a
string that happens to begin with the tag -- is stored as one record:

    MAGIC (4 bytes) | kind (1 byte) | deadline (8 bytes, big-endian Unix ms, 0 = none) | body

The body is the string itself, or msgpack of the collection. aa-ec wraps whatever it stores
in one more record, kind `v`, carrying the write's version (controlets/aa_ec.py):

    MAGIC | b"v" | counter (8 bytes) | replica index (2 bytes) | b"+" live or b"-" deleted | stored bytes

Every reader here unwraps it (a deleted one reads as absent), so data written under aa-ec stays
readable after a live switch to another controlet, and bytes stored without a version (written
before a switch to aa-ec) read as version (0, 0) under aa-ec: no rewrite either way. A plain
string never begins with MAGIC (it is escaped), so the two cannot be confused.

The record is computed at the shard's write point and replicated as it is (whole-value writes),
or, for a collection, recomputed by each replica from the same command on the same bytes
(rmw.DELTAS), so every replica holds the same bytes. Deadlines are absolute wall-clock
instants, never relative: replicas that apply the record later still agree on when it
expires (the clock assumption is in docs/bespokv.md).

The memory datalet may hold a collection or an APPENDed string as a live value instead (livelist.py,
livemap.py, livestring.py): immutable structures that stand for exactly the stored bytes. decode,
deadline_of and unwrap_versioned take one as it is.
"""
from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

MAGIC = b"\x00BKV"
FIRST = MAGIC[:1]  # the fast paths look at one byte: anything else is a plain string
STRING, LIST, HASH, SET, ZSET = b"s", b"l", b"h", b"t", b"z"
_COLLECTIONS = (LIST, HASH, SET, ZSET)
TYPE_NAMES = {STRING: b"string", LIST: b"list", HASH: b"hash", SET: b"set", ZSET: b"zset"}
_HEADER = struct.Struct(">4scQ")
VERSIONED = b"v"
_VERSIONED = struct.Struct(">4scQHc")  # MAGIC, b"v", counter, replica index, live/deleted
LIVE, TOMBSTONE = b"+", b"-"
WRONGTYPE = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"


class Entry(NamedTuple):
    """A decoded value. data: bytes (string), list[bytes] (list), dict[bytes, bytes] (hash),
    dict[bytes, None] (set, in insertion order), dict[bytes, float] (sorted set)."""

    kind: bytes
    deadline: int  # Unix ms; 0: never expires
    data: Any


class WrongType(Exception):
    """The key holds another kind of value (answered -WRONGTYPE, nothing changes)."""


class CorruptValue(ValueError):
    """Stored bytes that claim to be a record but do not decode (a damaged datalet)."""


CORRUPT = b"-ERR the stored value of this key is corrupt\r\n"


def _is_live(stored: Any) -> bool:
    """A live value (livelist.py: a list the memory datalet keeps as chunks), not bytes."""
    return stored.__class__ is not bytes and not isinstance(stored, bytearray | memoryview)


def is_tagged(stored: bytes) -> bool:
    return stored[:1] == FIRST and stored[:4] == MAGIC


def wrap_versioned(counter: int, index: int, stored: bytes | None) -> bytes:
    """aa-ec's stored form of a write: its version, then the stored bytes (None: a delete)."""
    return _VERSIONED.pack(MAGIC, VERSIONED, counter, index, TOMBSTONE if stored is None else LIVE) + (stored or b"")


def unwrap_versioned(raw: bytes) -> tuple[tuple[int, int], bytes | None]:
    """(version, stored bytes or None for a delete); bytes stored without a version are (0, 0)."""
    if _is_live(raw):  # a live value (livelist.py) is never versioned
        return (0, 0), raw
    if len(raw) >= _VERSIONED.size and raw[4:5] == VERSIONED and raw[:4] == MAGIC:
        _, _, counter, index, state = _VERSIONED.unpack_from(raw)
        return (counter, index), (raw[_VERSIONED.size:] if state == LIVE else None)
    return (0, 0), raw


def decode(stored: bytes | None) -> Entry | None:
    if stored is None:
        return None
    if _is_live(stored):  # its elements, no bytes built (a live string need not be tagged)
        return stored.entry()
    if not is_tagged(stored):
        return Entry(STRING, 0, stored)
    if stored[4:5] == VERSIONED:
        if len(stored) < _VERSIONED.size:
            raise CorruptValue("a versioned record shorter than its header")
        return decode(unwrap_versioned(stored)[1])
    try:
        return _decode_record(stored)
    except (ValueError, TypeError, struct.error, msgpack.UnpackException) as e:
        raise CorruptValue(f"{e}") from None


def _decode_record(stored: bytes) -> Entry:
    _, kind, deadline = _HEADER.unpack_from(stored)
    body = stored[_HEADER.size:]
    if kind == STRING:
        return Entry(STRING, deadline, body)
    items = msgpack.unpackb(body, raw=True, use_list=True, strict_map_key=False)
    if not isinstance(items, list) or not all(isinstance(x, bytes | float) for x in items):
        raise ValueError("a record's body is not a flat list")
    if kind == LIST:
        data: Any = items
    elif kind == HASH:
        data = dict(zip(items[0::2], items[1::2], strict=True))
    elif kind == SET:
        data = dict.fromkeys(items)
    elif kind == ZSET:
        data = dict(zip(items[0::2], items[1::2], strict=True))
    else:
        raise ValueError(f"unknown stored kind {kind!r}")
    return Entry(kind, deadline, data)


def encode(entry: Entry | None) -> bytes | None:
    """The stored bytes of an entry; None for an absent key (or an emptied collection)."""
    if entry is None:
        return None
    kind, deadline, data = entry
    if kind == STRING:
        if not deadline and not is_tagged(data):
            return data
        return _HEADER.pack(MAGIC, kind, deadline) + data
    if not data:
        return None  # Redis removes a key whose collection became empty
    if kind == LIST or kind == SET:
        flat = list(data)
    else:
        flat = [x for pair in data.items() for x in pair]
    return _HEADER.pack(MAGIC, kind, deadline) + msgpack.packb(flat, use_bin_type=True)


def string_too_large(limit: int) -> bytes:
    """The answer to a write that would grow a string past `limit` bytes (Redis's APPEND/SETRANGE check)."""
    return b"-ERR string exceeds maximum allowed size (proto-max-bulk-len %d)\r\n" % limit


def collection_too_large(kind: bytes, limit: int) -> bytes:
    """The answer to a write that would grow a collection's stored size past `limit` bytes."""
    return (b"-ERR the %b would exceed the maximum size of a value (proto-max-bulk-len %d bytes as stored); "
            b"nothing was changed\r\n" % (TYPE_NAMES[kind], limit))


def live(stored: bytes | None, now_ms: int) -> Entry | None:
    """The entry a client sees at `now_ms`: None when absent or past its deadline."""
    entry = decode(stored)
    if entry is None or (entry.deadline and entry.deadline <= now_ms):
        return None
    return entry


def expired(stored: bytes | None, now_ms: int) -> bool:
    return 0 < deadline_of(stored) <= now_ms


def deadline_of(stored: bytes | None) -> int:
    if stored is None or not is_tagged(stored) or len(stored) < _HEADER.size:
        return 0
    if _is_live(stored):
        return stored.deadline
    if stored[4:5] == VERSIONED:
        return deadline_of(unwrap_versioned(stored)[1]) if len(stored) >= _VERSIONED.size else 0
    return _HEADER.unpack_from(stored)[2]


def stored_string(value: bytes) -> bytes:
    """A client's SET value as stored: itself, unless it would read as a record (then escaped)."""
    return encode(Entry(STRING, 0, value)) if is_tagged(value) else value


def client_string(stored: bytes) -> bytes:
    """Inverse of stored_string (a forwarded SET carries the client's own bytes)."""
    return stored[_HEADER.size:] if is_tagged(stored) else stored


def string_of(entry: Entry | None) -> bytes | None:
    """A string value, or WrongType for a collection."""
    if entry is None:
        return None
    if entry.kind != STRING:
        raise WrongType
    return entry.data


def get_answer(stored: bytes | None, now_ms: int) -> bytes:
    """GET's RESP answer for stored bytes (tagged ones decoded; expired ones are nil)."""
    if stored is not None and _is_live(stored) and stored[:4] == MAGIC and stored[4:5] in _COLLECTIONS:  # no decode
        return b"$-1\r\n" if expired(stored, now_ms) else WRONGTYPE
    try:
        value = string_of(live(stored, now_ms))
    except WrongType:
        return WRONGTYPE
    except CorruptValue:
        return CORRUPT
    if value is None:
        return b"$-1\r\n"
    return b"$%d\r\n%b\r\n" % (len(value), value)
