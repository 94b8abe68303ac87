"""Read-modify-write commands (INCR, INCRBY, DECR, DECRBY, SETNX, SET NX/XX/GET) as pure functions.

They run where a shard's writes are ordered -- the chain head (ms-sc), the master (ms-ec),
the sequencer (aa-sc) -- and are replicated by their effect, not by the operation: the
serialization point reads the key from its own datalet (every earlier write of the shard is
already applied there), computes the new value, and the controlet replicates an ordinary
PUT or DEL. The answer (a number, OK, nil, the old value, or an error) is held until the
write is acknowledged like any other, so no client sees a result that depends on a write
the shard has not committed. A command that changes nothing (SET NX on an existing key,
INCR on a non-number) still writes the key's current state back, for the same reason.
aa-ec refuses them: last-writer-wins cannot order a read against concurrent writes.
"""
from __future__ import annotations

from mlsyskit.tools.kv import resp

INT64 = (-(2 ** 63), 2 ** 63 - 1)
NOT_AN_INTEGER = b"-ERR value is not an integer or out of range\r\n"


class RmwSyntaxError(ValueError):
    """The command's arguments are wrong (answered at once, never sent to the shard)."""


def parse(cmd: list[bytes]) -> list[bytes]:
    """Validate a read-modify-write command; returns it with the name upper-cased."""
    name = cmd[0].upper()
    n = len(cmd)
    if name in (b"INCR", b"DECR") and n != 2 or name in (b"INCRBY", b"DECRBY", b"SETNX") and n != 3:
        raise RmwSyntaxError(f"wrong number of arguments for '{name.decode().lower()}' command")
    if name in (b"INCRBY", b"DECRBY"):
        _integer(cmd[2])
    if name == b"SET":
        options = [o.upper() for o in cmd[3:]]
        for o in options:
            if o in (b"EX", b"PX", b"EXAT", b"PXAT", b"KEEPTTL"):
                raise RmwSyntaxError("SET expiry options are not supported: bespokv keys do not expire")
            if o not in (b"NX", b"XX", b"GET"):
                raise RmwSyntaxError("syntax error")
        if len(set(options)) != len(options) or {b"NX", b"XX"} <= set(options):
            raise RmwSyntaxError("syntax error")
    return [name, *cmd[1:]]


def _integer(raw: bytes) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise RmwSyntaxError("value is not an integer or out of range") from None
    if not INT64[0] <= value <= INT64[1] or raw != b"%d" % value:
        raise RmwSyntaxError("value is not an integer or out of range")
    return value


def apply(cmd: list[bytes], current: bytes | None) -> tuple[bytes | None, bytes]:
    """(the key's value afterwards -- None: absent --, the RESP answer) for one command."""
    name = cmd[0]
    if name in (b"INCR", b"DECR", b"INCRBY", b"DECRBY"):
        step = {b"INCR": 1, b"DECR": -1}.get(name) or _integer(cmd[2]) * (1 if name == b"INCRBY" else -1)
        try:
            base = 0 if current is None else _integer(current)
        except RmwSyntaxError:
            return current, NOT_AN_INTEGER
        total = base + step
        if not INT64[0] <= total <= INT64[1]:
            return current, b"-ERR increment or decrement would overflow\r\n"
        return b"%d" % total, resp.integer(total)
    if name == b"SETNX":
        return (current, resp.ZERO) if current is not None else (cmd[2], resp.ONE)
    options = {o.upper() for o in cmd[3:]}
    allowed = not (b"NX" in options and current is not None or b"XX" in options and current is None)
    after = cmd[2] if allowed else current
    if b"GET" in options:
        return after, resp.bulk(current)
    return after, resp.OK if allowed else resp.NULL


def relayed(cmd: list[bytes], value) -> bytes:
    """Re-encode another node's answer to a forwarded command (hiredis gives +OK and bulks as bytes)."""
    if value is None:
        return resp.NULL
    if isinstance(value, int):
        return resp.integer(value)
    if cmd[0] == b"SET" and b"GET" not in {o.upper() for o in cmd[3:]}:
        return resp.OK
    return resp.bulk(value)


def is_rmw(cmd: list[bytes]) -> bool:
    name = cmd[0].upper()
    return name in COMMANDS or (name == b"SET" and len(cmd) > 3)


COMMANDS = (b"INCR", b"DECR", b"INCRBY", b"DECRBY", b"SETNX")
