"""String commands beyond GET/SET/INCR/APPEND, as Redis 7 answers them: GETSET, SETRANGE,
INCRBYFLOAT and SETBIT (writes, replicated as the key's new value, like INCR), and GETRANGE/SUBSTR,
GETBIT and BITCOUNT (reads, served where GET is). Same handler signatures as rmw.py/queries.py.

A write that grows a string checks the value limit (the command's max_bytes) before it builds
anything, as APPEND does: SETRANGE with a huge offset is refused without allocating it.
Arguments Redis checks only after finding the key (SETRANGE's size, INCRBYFLOAT's increment) are
answered, not raised, so a key of another kind still gets -WRONGTYPE first, as in Redis.
"""
from __future__ import annotations

from mlsyskit.tools.kv.redis import longdouble, resp, values
from mlsyskit.tools.kv.redis.datatypes import CommandError, _int
from mlsyskit.tools.kv.redis.values import STRING, Entry, string_too_large

MAX_VALUE_BYTES = resp.Limits.max_value_bytes
NOT_A_FLOAT = b"-ERR value is not a valid float\r\n"
BIT_OFFSET = "bit offset is not an integer or out of range"


def _limit(cmd: list) -> int:
    return getattr(cmd, "max_bytes", MAX_VALUE_BYTES)


def _getset(cmd: list, entry: Entry | None, now: int):
    """GETSET key value: the old string (WRONGTYPE for another kind: nothing set); the TTL goes."""
    old = values.string_of(entry)
    return Entry(STRING, 0, cmd[2]), resp.bulk(old)


def _setrange(cmd: list, entry: Entry | None, now: int):
    """SETRANGE key offset value: the string's length afterwards, zero-padded up to offset."""
    offset = _int(cmd[2])
    if offset < 0:
        raise CommandError("offset is out of range")
    piece = cmd[3]
    current = values.string_of(entry)
    if not piece:
        return entry, resp.integer(len(current or b""))  # nothing to set: an absent key stays absent
    end = offset + len(piece)
    if end > _limit(cmd):
        return entry, string_too_large(_limit(cmd))  # before anything is built or applied
    base = current or b""
    data = base[:offset].ljust(offset, b"\x00") + piece + base[end:]
    return Entry(STRING, entry.deadline if entry else 0, data), resp.integer(len(data))


def _incrbyfloat(cmd: list, entry: Entry | None, now: int):
    """INCRBYFLOAT key increment: long-double arithmetic, printed as Redis prints it (longdouble.py);
    the key keeps its TTL."""
    current = values.string_of(entry)
    base = longdouble.parse(b"0" if current is None else current)
    step = longdouble.parse(cmd[2])
    if base is None or step is None:
        return entry, NOT_A_FLOAT
    text = longdouble.human(longdouble.add(base, step))
    if text is None:
        return entry, b"-ERR increment would produce NaN or Infinity\r\n"
    return Entry(STRING, entry.deadline if entry else 0, text), resp.bulk(text)


def _bit_offset(cmd: list) -> int:
    """A bit offset: a non-negative integer whose byte is within the value limit."""
    try:
        offset = _int(cmd[2])
    except CommandError:
        raise CommandError(BIT_OFFSET) from None
    if offset < 0 or offset >> 3 >= _limit(cmd):
        raise CommandError(BIT_OFFSET)
    return offset


def _setbit(cmd: list, entry: Entry | None, now: int):
    """SETBIT key offset 0|1: the bit's old value; the string grows (zero-filled) to hold it."""
    offset = _bit_offset(cmd)
    if cmd[3] not in (b"0", b"1"):
        raise CommandError("bit is not an integer or out of range")
    data = bytearray(values.string_of(entry) or b"")
    byte, mask = offset >> 3, 1 << (7 - (offset & 7))  # bit 0 is the first byte's highest bit
    if byte >= len(data):
        data.extend(bytes(byte + 1 - len(data)))
    old = 1 if data[byte] & mask else 0
    data[byte] = data[byte] | mask if cmd[3] == b"1" else data[byte] & ~mask
    return Entry(STRING, entry.deadline if entry else 0, bytes(data)), resp.integer(old)


def getrange(cmd: list, entry: Entry | None, now: int) -> bytes:
    """GETRANGE/SUBSTR key start end: inclusive, negative from the end, clamped (Redis 7.0)."""
    start, end = _int(cmd[2]), _int(cmd[3])
    data = values.string_of(entry) or b""
    n = len(data)
    if start < 0 and end < 0 and start > end:
        return resp.bulk(b"")
    start, end = max(start + n if start < 0 else start, 0), max(end + n if end < 0 else end, 0)
    end = min(end, n - 1)
    return resp.bulk(b"" if start > end or n == 0 else data[start:end + 1])


def getbit(cmd: list, entry: Entry | None, now: int) -> bytes:
    offset = _bit_offset(cmd)
    data = values.string_of(entry) or b""
    byte = offset >> 3
    return resp.ONE if byte < len(data) and data[byte] & (1 << (7 - (offset & 7))) else resp.ZERO


def bitcount(cmd: list, entry: Entry | None, now: int) -> bytes:
    """BITCOUNT key [start end [BYTE|BIT]]: an absent key counts 0 before its arguments are read."""
    if entry is None:
        return resp.ZERO
    data = values.string_of(entry)
    if len(cmd) == 2:
        return resp.integer(int.from_bytes(data, "big").bit_count())
    if len(cmd) not in (4, 5):
        raise CommandError("syntax error")
    start, end = _int(cmd[2]), _int(cmd[3])
    if start < 0 and end < 0 and start > end:
        return resp.ZERO  # Redis 7.0 answers this before it reads BYTE|BIT
    unit = cmd[4].upper() if len(cmd) == 5 else b"BYTE"
    if unit not in (b"BYTE", b"BIT"):
        raise CommandError("syntax error")
    total = len(data) * (8 if unit == b"BIT" else 1)
    start, end = max(start + total if start < 0 else start, 0), max(end + total if end < 0 else end, 0)
    end = min(end, total - 1)
    if start > end:
        return resp.ZERO
    if unit == b"BYTE":
        return resp.integer(int.from_bytes(data[start:end + 1], "big").bit_count())
    bits = int.from_bytes(data[start >> 3:(end >> 3) + 1], "big")
    bits >>= 7 - (end & 7)  # drop the bits after `end` in its byte, then those before `start`
    return resp.integer((bits & ((1 << (end - start + 1)) - 1)).bit_count())


WRITES = {b"GETSET": (3, _getset), b"SETRANGE": (4, _setrange), b"INCRBYFLOAT": (3, _incrbyfloat),
          b"SETBIT": (4, _setbit)}
READS = {b"GETRANGE": (4, getrange), b"SUBSTR": (4, getrange), b"GETBIT": (3, getbit), b"BITCOUNT": (-2, bitcount)}
