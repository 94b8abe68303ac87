"""Read-modify-write commands as pure functions: strings, counters, expiry (GETEX too), and (via
strings.py, datatypes.py and collwrites.py) GETSET, SETRANGE, INCRBYFLOAT, SETBIT, lists, sets,
hashes and sorted sets.

They run where a shard's writes are ordered -- the chain head (ms-sc), the master (ms-ec),
the sequencer (aa-sc): the serialization point reads the key from its own datalet (every
earlier write of the shard is already applied there) and computes the key's new stored bytes
(values.py) and the answer. Strings and expiry are replicated by their effect (a PUT or DEL of
the whole value); collections and APPEND, whose values grow, by the command (DELTAS below: each
replica computes the same bytes from its identical state). The answer is held until the write is
acknowledged like any other, so no client sees a result that depends on a write the shard
has not committed. A command that changes nothing (SET NX on an existing key, INCR on a
non-number) still writes the key's current state back, for the same reason.
aa-ec refuses them: last-writer-wins cannot order a read against concurrent writes.

Time: each command carries the Unix-ms instant it takes effect at (`Command.now_ms`,
stamped by the front end just before it is submitted). Relative expiries (EXPIRE k 10,
SET EX) become absolute deadlines here, so the replicated bytes never depend on when a
replica applies them.
"""
from __future__ import annotations

from collections.abc import Callable

import msgpack

from mlsyskit.tools.kv.redis import collwrites, datatypes, live, resp, strings, values
from mlsyskit.tools.kv.redis.values import STRING, Entry, WrongType

INT64 = (-(2 ** 63), 2 ** 63 - 1)
NOT_AN_INTEGER = b"-ERR value is not an integer or out of range\r\n"
REAP = b"BKV.REAP"  # the active expiry sweep's delete-if-expired (peers and the sweeper only)


class RmwSyntaxError(ValueError):
    """The command's arguments are wrong (answered at once, never sent to the shard)."""


MAX_VALUE_BYTES = resp.Limits.max_value_bytes  # the default limit on a key's value (proto-max-bulk-len)


class Command(list):
    """A client command (its bytes arguments), the Unix-ms instant it takes effect at, and the
    largest value it may leave behind (the front end's max_value_bytes: a string's length, a
    collection's stored size)."""

    __slots__ = ("effect", "max_bytes", "now_ms")

    def __init__(self, parts, now_ms: int = 0, max_bytes: int = MAX_VALUE_BYTES) -> None:
        super().__init__(parts)
        self.now_ms = now_ms
        self.max_bytes = max_bytes
        self.effect: list[bytes] | None = None  # what replicas apply instead (collwrites.BY_EFFECT)


Handler = Callable[[list, Entry | None, int], tuple[Entry | None, bytes]]


def _integer(raw: bytes) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise RmwSyntaxError("value is not an integer or out of range") from None
    if not INT64[0] <= value <= INT64[1] or raw != b"%d" % value:
        raise RmwSyntaxError("value is not an integer or out of range")
    return value


def _counter(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    name = cmd[0]
    step = {b"INCR": 1, b"DECR": -1}.get(name) or _integer(cmd[2]) * (1 if name == b"INCRBY" else -1)
    current = values.string_of(entry)
    try:
        base = 0 if current is None else _integer(current)
    except RmwSyntaxError:
        return entry, NOT_AN_INTEGER
    total = base + step
    if not INT64[0] <= total <= INT64[1]:
        return entry, b"-ERR increment or decrement would overflow\r\n"
    return Entry(STRING, entry.deadline if entry else 0, b"%d" % total), resp.integer(total)  # INCR keeps a TTL


def _setnx(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    return (entry, resp.ZERO) if entry is not None else (Entry(STRING, 0, cmd[2]), resp.ONE)


def _append(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    current = values.string_of(entry) or b""
    value = current + cmd[2]
    return Entry(STRING, entry.deadline if entry else 0, value), resp.integer(len(value))


def _deadline(unit_ms: int, raw: bytes, now: int, absolute: bool, name: str) -> int:
    amount = _integer(raw)
    deadline = amount * unit_ms if absolute else now + amount * unit_ms
    if amount <= 0 and name in ("set", "setex", "psetex", "getex") or not INT64[0] <= deadline <= INT64[1]:
        raise RmwSyntaxError(f"invalid expire time in '{name}' command")
    return deadline


SET_EXPIRY = {b"EX": (1000, False), b"PX": (1, False), b"EXAT": (1000, True), b"PXAT": (1, True)}


def _set(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    """SET k v [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]."""
    flags: set[bytes] = set()
    deadline = None
    rest = cmd[3:]
    i = 0
    while i < len(rest):
        option = rest[i].upper()
        if option in SET_EXPIRY and i + 1 < len(rest) and deadline is None and b"KEEPTTL" not in flags:
            unit, absolute = SET_EXPIRY[option]
            deadline = _deadline(unit, rest[i + 1], now, absolute, "set")
            i += 2
            continue
        if option not in (b"NX", b"XX", b"GET", b"KEEPTTL") or option in flags \
                or option == b"KEEPTTL" and deadline is not None:
            raise RmwSyntaxError("syntax error")
        flags.add(option)
        i += 1
    if {b"NX", b"XX"} <= flags:
        raise RmwSyntaxError("syntax error")
    old = values.string_of(entry) if b"GET" in flags else None  # SET GET on a list: WRONGTYPE
    allowed = not (b"NX" in flags and entry is not None or b"XX" in flags and entry is None)
    if allowed:
        keep = entry.deadline if b"KEEPTTL" in flags and entry is not None else 0
        after = Entry(STRING, deadline if deadline is not None else keep, cmd[2])
    else:
        after = entry
    if b"GET" in flags:
        return after, resp.bulk(old)
    return after, resp.OK if allowed else resp.NULL


def _setex(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    unit = 1000 if cmd[0] == b"SETEX" else 1
    deadline = _deadline(unit, cmd[2], now, False, cmd[0].decode().lower())
    return Entry(STRING, deadline, cmd[3]), resp.OK


def _expire(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    """EXPIRE/PEXPIRE/EXPIREAT/PEXPIREAT key n [NX|XX|GT|LT]: 1 when the deadline was set."""
    name = cmd[0]
    unit = 1 if name.startswith(b"P") else 1000
    deadline = _deadline(unit, cmd[2], now, name.endswith(b"AT"), name.decode().lower())
    condition = cmd[3].upper() if len(cmd) > 3 else None
    if len(cmd) > 4 or condition not in (None, b"NX", b"XX", b"GT", b"LT"):
        raise RmwSyntaxError("unsupported option" if len(cmd) <= 4 else "syntax error")
    if entry is None:
        return None, resp.ZERO
    current = entry.deadline
    if (condition == b"NX" and current or condition == b"XX" and not current
            or condition == b"GT" and (not current or deadline <= current)
            or condition == b"LT" and current and deadline >= current):
        return entry, resp.ZERO
    if deadline <= now:
        return None, resp.ONE  # a deadline in the past deletes the key, as Redis does
    return entry._replace(deadline=deadline), resp.ONE


def _persist(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    if entry is None or not entry.deadline:
        return entry, resp.ZERO
    return entry._replace(deadline=0), resp.ONE


def _getdel(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    value = values.string_of(entry)
    return (None if value is not None else entry), resp.bulk(value)


GETEX_OPTIONS = {**SET_EXPIRY, b"PERSIST": (0, False)}


def _getex(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    """GETEX key [EX s|PX ms|EXAT s|PXAT ms|PERSIST]: the string, its deadline set or removed.
    Redis's order: the options' syntax, then nil for an absent key, WRONGTYPE, the time's value."""
    chosen, amount = None, None
    i = 2
    while i < len(cmd):
        option = cmd[i].upper()
        takes_value = option in SET_EXPIRY
        if option not in GETEX_OPTIONS or chosen not in (None, option) or takes_value and i + 1 == len(cmd):
            raise RmwSyntaxError("syntax error")  # one kind of expiry (repeating it is allowed: the last wins)
        chosen, amount = option, cmd[i + 1] if takes_value else None
        i += 2 if takes_value else 1
    if entry is None:
        return None, resp.NULL
    value = values.string_of(entry)
    if chosen is None:
        return entry, resp.bulk(value)
    if chosen == b"PERSIST":
        return entry._replace(deadline=0), resp.bulk(value)
    unit, absolute = SET_EXPIRY[chosen]
    deadline = _deadline(unit, amount, now, absolute, "getex")
    return (entry._replace(deadline=deadline) if deadline > now else None), resp.bulk(value)


def _reap(cmd: list, entry: Entry | None, now: int) -> tuple[Entry | None, bytes]:
    """The sweep's delete: `entry` is already None when the key expired (live() dropped it)."""
    return entry, resp.ZERO if entry is not None else resp.ONE


WRITES: dict[bytes, tuple[int, Handler]] = {  # name: (Redis arity, handler)
    b"INCR": (2, _counter), b"DECR": (2, _counter), b"INCRBY": (3, _counter), b"DECRBY": (3, _counter),
    b"SETNX": (3, _setnx), b"APPEND": (3, _append), b"SET": (-3, _set), b"SETEX": (4, _setex),
    b"PSETEX": (4, _setex), b"EXPIRE": (-3, _expire), b"PEXPIRE": (-3, _expire), b"EXPIREAT": (-3, _expire),
    b"PEXPIREAT": (-3, _expire), b"PERSIST": (2, _persist), b"GETDEL": (2, _getdel), REAP: (2, _reap),
    b"GETEX": (-2, _getex), **strings.WRITES, **datatypes.WRITES, **collwrites.WRITES,
}
COMMANDS = tuple(name for name in WRITES if name not in (b"SET", REAP))


def _arity_ok(arity: int, n: int) -> bool:
    return n == arity if arity > 0 else n >= -arity


def parse(cmd: list[bytes], now_ms: int = 0, max_bytes: int = MAX_VALUE_BYTES) -> Command:
    """Validate a read-modify-write command (arity, then its arguments, by a dry run on an
    absent key: handlers are pure); returns it with the name upper-cased."""
    name = cmd[0].upper()
    arity, handler = WRITES[name]
    if not _arity_ok(arity, len(cmd)):
        raise RmwSyntaxError(f"wrong number of arguments for '{name.decode().lower()}' command")
    command = Command([name, *cmd[1:]], now_ms, max_bytes)
    try:
        handler(command, None, now_ms)
    except datatypes.CommandError as e:
        raise RmwSyntaxError(str(e)) from None
    return command


def apply(cmd: list[bytes], current: bytes | None) -> tuple[bytes | None, bytes]:
    """(the key's stored bytes afterwards -- None: absent --, the RESP answer) for one command."""
    after, answer = _apply(cmd, current)
    if cmd[0] in collwrites.BY_EFFECT and cmd.__class__ is Command:
        cmd.effect = collwrites.effect_of(cmd, answer)  # what replicas apply (delta_of)
    return after, answer


def _apply(cmd: list[bytes], current: bytes | None) -> tuple[bytes | None, bytes]:
    now = getattr(cmd, "now_ms", 0)
    limit = getattr(cmd, "max_bytes", MAX_VALUE_BYTES)
    fast = live.FAST.get(cmd[0])
    if fast is not None:  # a live value (the memory datalet's): O(delta) at any size (live.py)
        done = fast(cmd, current, now, limit)
        if done is not None:
            return done
    if cmd[0] == REAP and values.expired(current, now):
        return None, resp.ONE  # by its header alone: even a damaged record goes once expired
    try:
        entry = values.live(current, now)  # a key past its deadline is absent for every command
    except values.CorruptValue:
        return current, values.CORRUPT  # left as it is (DEL or SET replaces it)
    try:
        after, answer = WRITES[cmd[0]][1](cmd, entry, now)
    except WrongType:
        after, answer = entry, values.WRONGTYPE
    except (RmwSyntaxError, datatypes.CommandError) as e:
        after, answer = entry, resp.error(f"ERR {e}")
    stored = values.encode(after)
    refused = too_large(after, stored, current, limit)
    return (current, refused) if refused else (stored, answer)


def too_large(after: Entry | None, stored: bytes | None, current: bytes | None, limit: int) -> bytes | None:
    """The error for a command that would grow a key's value past `limit`, else None. Checked at
    the write point before anything is applied or replicated, so a refused command changes nothing
    on any replica (the key's current bytes are written back, as for any command that changes
    nothing). A string counts its length (Redis's proto-max-bulk-len check in APPEND/SETRANGE), a
    collection its stored size; a value that only shrinks is never refused."""
    if after is None or stored is None or (current is not None and len(stored) <= len(current)):
        return None
    if after.kind == STRING:
        return values.string_too_large(limit) if len(after.data) > limit else None
    return values.collection_too_large(after.kind, limit) if len(stored) > limit else None


# Replicated as the command (a delta), not as the key's new value: collections and APPEND, whose
# values grow. Every replica holds the same bytes before it, and apply() is deterministic in the
# command, its instant and its limit (SPOP's draw is seeded by key and instant), so each replica
# computes the same bytes the write point did, from a message the size of the command. A command
# whose result the write point computed with arithmetic replicas need not share (HINCRBYFLOAT's long
# double) goes as the write it amounted to (Command.effect: HSET of the result), as Redis replicates
# it; when it changed nothing (an error), as the key's whole value.
DELTAS = frozenset((*datatypes.WRITES, *collwrites.WRITES, b"APPEND"))


def delta_of(cmd: list[bytes] | None) -> bytes | None:
    """The wire form of a command replicated as a delta, or None (replicate its whole value)."""
    if cmd is None or cmd[0] not in DELTAS:
        return None
    parts = cmd.effect if cmd[0] in collwrites.BY_EFFECT else cmd
    return msgpack.packb([getattr(cmd, "now_ms", 0), getattr(cmd, "max_bytes", MAX_VALUE_BYTES), *parts],
                         use_bin_type=True)


def from_delta(raw: bytes) -> Command:
    now_ms, max_bytes, *parts = msgpack.unpackb(raw, raw=True)
    return Command(parts, now_ms, max_bytes)


STATUS_ANSWERS = {b"SET", b"SETEX", b"PSETEX", b"LSET", b"LTRIM", b"HMSET", b"TYPE"}  # +simple strings


def relayed(cmd: list[bytes], value) -> bytes:
    """Re-encode another node's answer to a forwarded command (hiredis gives +OK and bulks as bytes)."""
    if value is None:
        return resp.NULL
    if isinstance(value, int):
        return resp.integer(value)
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(relayed([b""], v) for v in value)
    if cmd[0] in STATUS_ANSWERS and not (cmd[0] == b"SET" and b"GET" in {o.upper() for o in cmd[3:]}):
        return b"+%b\r\n" % value
    return resp.bulk(value if isinstance(value, bytes) else str(value).encode())


def is_rmw(cmd: list[bytes]) -> bool:
    name = cmd[0].upper()
    return name in COMMANDS or (name == b"SET" and len(cmd) > 3)
