"""RPUSH/LPUSH (and the X forms) without decoding the list, and LPOP/RPOP on a live one.

On a LiveList (livelist.py: how the memory datalet keeps a list, and what a push onto an absent
key makes) a push is a new LiveList sharing all but one edge chunk: O(pushed), whatever the
list's length. On a stored record's bytes (a blob datalet such as lmdb) a push only needs the
element count, which the msgpack array header holds: the new bytes are a fresh header and the old
body with the packed elements appended (or prepended), one memory copy instead of a decode and
re-encode. Either way the result's bytes are exactly values.encode of the elements (the minimal
array header, as the generic path writes it), so replicas that hold a list in different forms
export and digest equal. The size limit is checked on the size computed before anything is stored.
Anything unusual (an absent key for an X form, an expired or non-list key, an aa-ec versioned
record, a refusal to word) returns None and takes the generic path (datatypes._push).
LPOP/RPOP on a LiveList take O(popped) elements off one end (LiveList.popped); on bytes they take
the generic path.
"""
from __future__ import annotations

import struct

import msgpack

from mlsyskit.tools.kv.redis import datatypes, resp
from mlsyskit.tools.kv.redis.livelist import LiveList
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


def _array_header(count: int) -> bytes:
    """msgpack's minimal array header (what packb writes) for `count` elements."""
    if count < 16:
        return bytes((0x90 | count,))
    return b"\xdc" + _COUNT16.pack(count) if count < 0x10000 else b"\xdd" + _COUNT32.pack(count)


def push(cmd: list[bytes], current: bytes | LiveList | None, now_ms: int,
         limit: int) -> tuple[bytes | LiveList, bytes] | None:
    """(the value afterwards, answer) for a push, or None: use the generic path."""
    name, items = cmd[0], cmd[2:]
    right = name[:1] == b"R"
    if current is None or type(current) is LiveList:
        if current is None and name[-1:] == b"X" or current is not None and 0 < current.deadline <= now_ms:
            return None
        before = current if current is not None else LiveList(0, None, None, 0, 0)
        after = before.pushed(items, right)
        if len(after) > limit and len(after) > len(before):
            return None  # over the limit: the generic path words the refusal (nothing is applied)
        return after, resp.integer(after.count)
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
    packed = b"".join(msgpack.packb(x, use_bin_type=True) for x in (items if right else reversed(items)))
    head = _HEADER.pack(MAGIC, LIST, deadline) + _array_header(total)
    stored = b"".join((head, body, packed) if right else (head, packed, body))
    if len(stored) > limit and len(stored) > len(current):
        return None  # over the limit: the generic path words the refusal
    return stored, resp.integer(total)


POPS = frozenset((b"LPOP", b"RPOP"))


def pop(cmd: list[bytes], current: bytes | LiveList | None, now_ms: int,
        limit: int) -> tuple[LiveList | None, bytes] | None:
    """(the list afterwards -- None: emptied, so removed --, answer) for LPOP/RPOP key [count] on a
    live list, or None: use the generic path (absent, expired, bytes, another kind, bad arguments)."""
    if type(current) is not LiveList or 0 < current.deadline <= now_ms:
        return None
    try:
        count = datatypes.pop_count(cmd)
    except datatypes.CommandError:
        return None
    after, taken = current.popped(1 if count is None else count, cmd[0] == b"LPOP")
    if not taken and count is not None:
        after = current  # LPOP k 0: nothing changes
    return after, datatypes.popped_answer(taken, count)
