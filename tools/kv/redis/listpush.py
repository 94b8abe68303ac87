"""RPUSH/LPUSH (and the X forms) on a stored list's bytes, without decoding the list.

A list is stored as a record whose body is a msgpack array (values.py). A push only needs the
element count, which the array header holds: the new stored bytes are a fresh header (the count
as a 4-byte array32) and the old body with the packed elements appended (or prepended), one
memory copy instead of decoding and re-encoding every element. So a push costs the same at
10 or 10,000 elements up to that copy. The result decodes to exactly what the generic path
(datatypes._push) gives; every replica runs this same code on the same bytes, so they stay
byte-identical. Anything unusual (an absent key for an X form, an expired or non-list key, an
aa-ec versioned record) returns None and takes the generic path.
"""
from __future__ import annotations

import struct

import msgpack

from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.redis.values import _HEADER, LIST, MAGIC

PUSHES = frozenset((b"RPUSH", b"LPUSH", b"RPUSHX", b"LPUSHX"))
_COUNT16, _COUNT32 = struct.Struct(">H"), struct.Struct(">I")


def _array(stored: bytes, at: int) -> tuple[int, int] | None:
    """(element count, where the elements start) of the msgpack array header at `at`."""
    first = stored[at]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, at + 1
    if first == 0xDC:
        return _COUNT16.unpack_from(stored, at + 1)[0], at + 3
    if first == 0xDD:
        return _COUNT32.unpack_from(stored, at + 1)[0], at + 5
    return None


def push(cmd: list[bytes], current: bytes | None, now_ms: int, limit: int) -> tuple[bytes, bytes] | None:
    """(stored bytes afterwards, answer) for a push, or None: use the generic path."""
    name, items = cmd[0], cmd[2:]
    if current is None:
        if name[-1:] == b"X":
            return None
        deadline, count, body = 0, 0, b""
    else:
        if len(current) <= _HEADER.size or current[:4] != MAGIC or current[4:5] != LIST:
            return None
        deadline = _HEADER.unpack_from(current)[2]
        array = _array(current, _HEADER.size)
        if array is None or (deadline and deadline <= now_ms):
            return None
        count, start = array
        body = memoryview(current)[start:]
    total = count + len(items)
    if total >= 1 << 32:
        return None
    packed = b"".join(msgpack.packb(x, use_bin_type=True) for x in (items if name[:1] == b"R" else reversed(items)))
    head = _HEADER.pack(MAGIC, LIST, deadline) + b"\xdd" + _COUNT32.pack(total)
    stored = b"".join((head, body, packed) if name[:1] == b"R" else (head, packed, body))
    if len(stored) > limit and len(stored) > len(current or b""):
        return None  # over the limit: the generic path words the refusal
    return stored, resp.integer(total)
