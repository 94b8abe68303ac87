"""LSET, LTRIM, LINSERT and LREM on a live list (livelist.py) without decoding or copying it.

- LSET: the chunk holding the index is copied with the new element, and the cells between it and
  the nearer end of the list are re-linked: O(CHUNK + distance / CHUNK), O(1) near either end (Redis:
  O(N) walking its quicklist); an end with no chunks first takes half of the other end's (once).
- LTRIM: the elements outside the range are popped off both ends (LiveList.popped): O(removed),
  as in Redis.
- LINSERT: the pivot is found scanning from the left (Redis does the same), then the element goes
  into the pivot's chunk as LSET edits one: O(position + CHUNK).
- LREM: a scan of the chunks (from the end the count names), each chunk holding the element
  filtered, the rest shared: O(N) as Redis's, and no decode or encode of the record.

Each answers and leaves exactly what the generic handlers in datatypes.py do (tests compare them on
random sequences); the size limit is checked on the counted size before anything is stored (a
refused LSET/LINSERT leaves the list as it was). Anything else -- an absent, expired or non-list key,
bytes, bad arguments -- returns None and takes the generic path.
"""
from __future__ import annotations

from collections.abc import Callable

from mlsyskit.tools.kv.redis import resp, values
from mlsyskit.tools.kv.redis.datatypes import CommandError, _int, _span
from mlsyskit.tools.kv.redis.livelist import CHUNK, Cell, LiveList, packed_size, split_half

Edit = Callable[[tuple, int], tuple]  # (a chunk, an offset in it) -> the chunk edited (never empty)


def _chain(pieces: list[tuple], rest: Cell | None) -> Cell | None:
    """`rest` with the chunks `pieces` linked on top, the last of them outermost."""
    for piece in pieces:
        rest = (piece, rest)
    return rest


def edited_at(live: LiveList, index: int, edit: Edit) -> LiveList:
    """A new LiveList whose element `index` (0 <= index < count) is in a chunk `edit` made; the
    chunks from the nearer end to it are re-linked, the rest shared. Count and size: the caller's."""
    n = live.count
    left = index <= n - 1 - index
    if (live.front if left else live.back) is None:
        # The nearer end holds no chunk (a list pushed from one end, or built from bytes): hand it the
        # half of the other end's chunks nearest to it first, as a pop does (O(n / CHUNK), once: the
        # version made keeps that layout, so later edits near this end start there).
        if left:
            front, back = split_half(live.back)
        else:
            back, front = split_half(live.front)
        live = LiveList(live.deadline, front, back, n, live.packed)
    sides = (("front", index), ("back", n - 1 - index))
    for side, k in (sides if left else sides[::-1]):
        cell = live.front if side == "front" else live.back
        passed: list[tuple] = []
        while cell is not None:
            chunk = cell[0]
            if k < len(chunk):
                new = edit(chunk, k if side == "front" else len(chunk) - 1 - k)
                pieces = [new[:len(new) // 2], new[len(new) // 2:]] if len(new) > CHUNK else [new]
                # a front list holds its leftmost chunk first, a back list its rightmost
                rebuilt = _chain(pieces[::-1] if side == "front" else pieces, cell[1])
                rebuilt = _chain(passed[::-1], rebuilt)
                front, back = (rebuilt, live.back) if side == "front" else (live.front, rebuilt)
                return LiveList(live.deadline, front, back, live.count, live.packed)
            k -= len(chunk)
            passed.append(chunk)
            cell = cell[1]
    raise IndexError(index)


def _chunks(live: LiveList) -> list[tuple]:
    """Every chunk, leftmost first: O(count / CHUNK)."""
    out, cell = [], live.front
    while cell is not None:
        out.append(cell[0])
        cell = cell[1]
    back, cell = [], live.back
    while cell is not None:
        back.append(cell[0])
        cell = cell[1]
    return out + back[::-1]


def _live_list(current: object, now_ms: int) -> LiveList | None:
    if current.__class__ is not LiveList or 0 < current.deadline <= now_ms:
        return None
    return current


def lset(cmd: list[bytes], current: object, now_ms: int, limit: int) -> tuple[object, bytes] | None:
    live = _live_list(current, now_ms)
    if live is None:
        return None
    try:
        index = _int(cmd[2])
    except CommandError:
        return None
    n = live.count
    if not -n <= index < n:
        return current, resp.error("ERR index out of range")
    i = index + n if index < 0 else index
    old: list[bytes] = []

    def put(chunk: tuple, j: int) -> tuple:
        old.append(chunk[j])
        return chunk[:j] + (cmd[3],) + chunk[j + 1:]
    after = edited_at(live, i, put)
    after.packed += packed_size(cmd[3]) - packed_size(old[0])
    if len(after) > limit and len(after) > len(live):
        return current, values.collection_too_large(values.LIST, limit)
    return after, resp.OK


def ltrim(cmd: list[bytes], current: object, now_ms: int, limit: int) -> tuple[object, bytes] | None:
    live = _live_list(current, now_ms)
    if live is None:
        return None
    try:
        start, stop = _int(cmd[2]), _int(cmd[3])
    except CommandError:
        return None
    a, b = _span(live.count, start, stop)
    if b <= a:
        return None, resp.OK  # nothing kept: Redis removes the key
    after: LiveList | None = live
    if a:
        after, _ = after.popped(a, left=True)
    if b < live.count:
        after, _ = after.popped(live.count - b, left=False)
    return after, resp.OK


def linsert(cmd: list[bytes], current: object, now_ms: int, limit: int) -> tuple[object, bytes] | None:
    live = _live_list(current, now_ms)
    where = cmd[2].upper()
    if live is None or where not in (b"BEFORE", b"AFTER"):
        return None
    pivot, at = cmd[3], 0
    for chunk in _chunks(live):
        if pivot in chunk:
            at += chunk.index(pivot)
            break
        at += len(chunk)
    else:
        return current, resp.integer(-1)
    shift = where == b"AFTER"

    def insert(chunk: tuple, j: int) -> tuple:
        return chunk[:j + shift] + (cmd[4],) + chunk[j + shift:]
    after = edited_at(live, at, insert)
    after.count += 1
    after.packed += packed_size(cmd[4])
    if len(after) > limit and len(after) > len(live):
        return current, values.collection_too_large(values.LIST, limit)
    return after, resp.integer(after.count)


def lrem(cmd: list[bytes], current: object, now_ms: int, limit: int) -> tuple[object, bytes] | None:
    live = _live_list(current, now_ms)
    if live is None:
        return None
    try:
        count = _int(cmd[2])
    except CommandError:
        return None
    target, left = cmd[3], abs(count) or live.count
    chunks = _chunks(live)
    order = range(len(chunks) - 1, -1, -1) if count < 0 else range(len(chunks))
    removed = 0
    for c in order:
        if not left:
            break
        chunk = chunks[c]
        if target not in chunk:
            continue
        kept = list(chunk)
        spots = [j for j, x in enumerate(kept) if x == target]
        for j in sorted(spots[::-1][:left] if count < 0 else spots[:left], reverse=True):
            del kept[j]
        taken = len(chunk) - len(kept)
        removed, left = removed + taken, left - taken
        chunks[c] = tuple(kept)
    if not removed:
        return current, resp.ZERO
    if removed == live.count:
        return None, resp.integer(removed)
    merged: list[tuple] = []
    for chunk in chunks:  # adjacent chunks that fit in one are joined: no list of slivers
        if merged and len(merged[-1]) + len(chunk) <= CHUNK:
            merged[-1] += chunk
        elif chunk:
            merged.append(chunk)
    after = LiveList(live.deadline, _chain(merged[::-1], None), None, live.count - removed,
                     live.packed - removed * packed_size(target))
    return after, resp.integer(removed)


EDITS = {b"LSET": lset, b"LTRIM": ltrim, b"LINSERT": linsert, b"LREM": lrem}
