"""Connection-level Redis commands: AUTH, CLIENT, COMMAND, CONFIG and the refused MULTI.

Each answers truthfully or with an error, never with a placeholder: CLIENT LIST lists this
node's real connections, COMMAND COUNT counts the commands this node really has, CONFIG
GET reports the limits in force (and an empty list for parameters bespokv does not have,
as Redis does for an unknown name).

Transactions are refused, safely: WATCH answers an error (nothing is watched), MULTI answers an error and puts the connection in a
refused block in which every command is answered with an error and not run, until EXEC
(-EXECABORT) or DISCARD ends it. A client that pipelines MULTI, SET, EXEC (as redis-py's
transactions do) therefore gets errors and nothing it queued is ever applied.
"""
from __future__ import annotations

import fnmatch
import hmac
from typing import Any

from mlsyskit.tools.kv.frontend.session import Session
from mlsyskit.tools.kv.redis import resp

NOAUTH = b"-NOAUTH Authentication required.\r\n"
WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
MULTI_REFUSED = b"-ERR MULTI is not supported by bespokv: commands up to EXEC/DISCARD are refused, none runs\r\n"
IN_REFUSED_MULTI = b"-ERR refused: inside a MULTI that bespokv does not support (nothing queued runs)\r\n"
EXECABORT = b"-EXECABORT Transaction discarded: bespokv does not support MULTI/EXEC\r\n"
ALLOWED_UNAUTHENTICATED = {b"AUTH", b"HELLO", b"QUIT", b"BKV.NONCE", b"BKV.AUTH"}

# Redis's arity convention: positive = exact argument count with the name, negative = at least.
ARITY: dict[bytes, tuple[int, tuple[bytes, ...], int, int, int]] = {
    b"GET": (2, (b"readonly", b"fast"), 1, 1, 1), b"SET": (-3, (b"write",), 1, 1, 1),
    b"MSET": (-3, (b"write",), 1, -1, 2), b"MGET": (-2, (b"readonly", b"fast"), 1, -1, 1),
    b"DEL": (-2, (b"write",), 1, -1, 1), b"EXISTS": (-2, (b"readonly", b"fast"), 1, -1, 1),
    b"PING": (-1, (b"fast",), 0, 0, 0), b"ECHO": (2, (b"fast",), 0, 0, 0), b"INFO": (-1, (), 0, 0, 0),
    b"HELLO": (-1, (b"fast", b"no_auth"), 0, 0, 0), b"SELECT": (2, (b"fast",), 0, 0, 0),
    b"QUIT": (-1, (b"fast", b"no_auth"), 0, 0, 0), b"AUTH": (-2, (b"fast", b"no_auth"), 0, 0, 0),
    b"CLIENT": (-2, (), 0, 0, 0), b"COMMAND": (-1, (), 0, 0, 0), b"CONFIG": (-2, (b"admin",), 0, 0, 0),
    b"MULTI": (1, (), 0, 0, 0), b"EXEC": (1, (), 0, 0, 0), b"DISCARD": (1, (), 0, 0, 0),
    b"WATCH": (-2, (), 1, -1, 1), b"UNWATCH": (1, (), 0, 0, 0),
    b"UNLINK": (-2, (b"write", b"fast"), 1, -1, 1), b"TOUCH": (-2, (b"readonly", b"fast"), 1, -1, 1),
    b"OBJECT": (-2, (b"readonly",), 2, 2, 1), b"TIME": (1, (b"fast",), 0, 0, 0),
    b"INCR": (2, (b"write",), 1, 1, 1), b"DECR": (2, (b"write",), 1, 1, 1),
    b"INCRBY": (3, (b"write",), 1, 1, 1), b"DECRBY": (3, (b"write",), 1, 1, 1),
    b"SETNX": (3, (b"write",), 1, 1, 1),
    b"DBSIZE": (1, (b"readonly",), 0, 0, 0), b"KEYS": (2, (b"readonly",), 0, 0, 0),
    b"SCAN": (-2, (b"readonly",), 0, 0, 0), b"FLUSHALL": (-1, (b"write",), 0, 0, 0),
    b"FLUSHDB": (-1, (b"write",), 0, 0, 0),
    b"BKV.SHARDMAP": (1, (b"readonly",), 0, 0, 0), b"BKV.DIGEST": (1, (b"readonly",), 0, 0, 0),
}
_PUBLIC: list[bytes] = []


def register_arities(handlers: dict[bytes, Any]) -> None:
    """The public command table: every handler except the peer protocol (BKV.MSG/NONCE/AUTH)."""
    _PUBLIC[:] = sorted(name for name in handlers if name in ARITY)


def check_password(conn: Session, password: bytes) -> bool:
    expected = conn.node.requirepass
    if expected is None:
        conn.reply(resp.error("AUTH called without any password configured for the default user"))
        return False
    if not hmac.compare_digest(password, expected):
        conn.reply(WRONGPASS)
        return False
    conn.authed = True
    return True


def cmd_auth(conn: Session, cmd: list) -> None:
    """AUTH password | AUTH default password (the only user is `default`)."""
    if len(cmd) not in (2, 3) or (len(cmd) == 3 and cmd[1] != b"default"):
        if len(cmd) == 3:
            return conn.reply(WRONGPASS)
        return conn.reply(resp.error("wrong number of arguments for 'auth' command"))
    if check_password(conn, cmd[-1]):
        conn.reply(resp.OK)


def _client_line(c: Session) -> bytes:
    peer = c.transport.get_extra_info("peername") if c.transport is not None else None
    addr = f"{peer[0]}:{peer[1]}" if peer else "?"
    name = c.name.decode(errors="replace")
    return f"id={c.id} addr={addr} name={name} user=default kind={'peer' if c.peer else 'client'}".encode()


def cmd_client(conn: Session, cmd: list) -> None:
    sub = cmd[1].upper() if len(cmd) > 1 else b""
    if sub == b"SETNAME" and len(cmd) == 3:
        if b" " in cmd[2] or b"\n" in cmd[2]:
            return conn.reply(resp.error("Client names cannot contain spaces, newlines or special characters."))
        conn.name = cmd[2]
        return conn.reply(resp.OK)
    if sub == b"GETNAME" and len(cmd) == 2:
        return conn.reply(resp.bulk(conn.name or None))
    if sub == b"ID" and len(cmd) == 2:
        return conn.reply(resp.integer(conn.id))
    if sub == b"INFO" and len(cmd) == 2:
        return conn.reply(resp.bulk(_client_line(conn) + b"\n"))
    if sub == b"LIST" and len(cmd) == 2:
        lines = [_client_line(c) for c in sorted(conn.node.client_connections, key=lambda c: c.id)]
        return conn.reply(resp.bulk(b"".join(line + b"\n" for line in lines)))
    if sub == b"SETINFO" and len(cmd) == 4 and cmd[2].upper() in (b"LIB-NAME", b"LIB-VER"):
        conn.lib[cmd[2].upper()] = cmd[3]
        return conn.reply(resp.OK)
    what = sub[:32].decode(errors="replace")
    conn.reply(resp.error(f"CLIENT {what} is not supported by bespokv (SETNAME GETNAME ID INFO LIST SETINFO are)"))


def _command_entry(name: bytes) -> bytes:
    arity, flags, first, last, step = ARITY[name]
    return (b"*6\r\n" + resp.bulk(name.lower()) + b":%d\r\n" % arity + resp.array(list(flags))
            + b":%d\r\n:%d\r\n:%d\r\n" % (first, last, step))


def cmd_command(conn: Session, cmd: list) -> None:
    sub = cmd[1].upper() if len(cmd) > 1 else b""
    if sub == b"":
        return conn.reply(b"*%d\r\n" % len(_PUBLIC) + b"".join(_command_entry(n) for n in _PUBLIC))
    if sub == b"COUNT":
        return conn.reply(resp.integer(len(_PUBLIC)))
    if sub == b"INFO":
        names = [n.upper() for n in cmd[2:]] or _PUBLIC
        return conn.reply(b"*%d\r\n" % len(names) + b"".join(
            _command_entry(n) if n in _PUBLIC else resp.NULL for n in names))
    if sub == b"DOCS":
        return conn.reply(resp.error("COMMAND DOCS: bespokv ships no command documentation"))
    conn.reply(resp.error(f"COMMAND {sub[:32].decode(errors='replace')} is not supported (COUNT INFO are)"))


def config_values(conn: Session) -> dict[bytes, bytes]:
    limits = conn.node.limits
    return {
        b"maxclients": b"%d" % limits.max_clients,
        b"proto-max-bulk-len": b"%d" % limits.max_value_bytes,  # the largest value; longer bulks get an error
        b"client-query-buffer-limit": b"%d" % limits.max_request_bytes,  # longer requests close the connection
        b"client-output-buffer-limit": b"normal %d 0 0" % limits.max_output_bytes,
        b"requirepass": conn.node.requirepass or b"",
        b"databases": b"1",
        b"save": b"",  # bespokv does not snapshot to RDB; durability is the datalet's (lmdb, redis AOF)
        b"appendonly": b"no",
    }


def cmd_config(conn: Session, cmd: list) -> None:
    """CONFIG GET pattern...: the values in force; CONFIG SET and the rest are refused."""
    if len(cmd) >= 3 and cmd[1].upper() == b"GET":
        values = config_values(conn)
        found: list[bytes] = []
        for pattern in cmd[2:]:
            for name, value in values.items():
                if fnmatch.fnmatchcase(name.decode(), pattern.decode(errors="replace").lower()) \
                        and name not in found[::2]:
                    found += (name, value)
        if conn.protocol == 3:  # RESP3 clients get a map, as Redis 7 sends them
            return conn.reply(b"%%%d\r\n" % (len(found) // 2) + b"".join(resp.bulk(x) for x in found))
        return conn.reply(resp.array(found))
    conn.reply(resp.error("CONFIG supports only GET on a bespokv node (its limits are set at start-up)"))


def cmd_multi(conn: Session, cmd: list) -> None:
    conn.in_refused_multi = True
    conn.reply(MULTI_REFUSED)


def cmd_exec(conn: Session, cmd: list) -> None:
    if conn.in_refused_multi:
        conn.in_refused_multi = False
        return conn.reply(EXECABORT)
    conn.reply(resp.error("EXEC without MULTI"))


def cmd_discard(conn: Session, cmd: list) -> None:
    if conn.in_refused_multi:
        conn.in_refused_multi = False
        return conn.reply(resp.OK)
    conn.reply(resp.error("DISCARD without MULTI"))


WATCH_REFUSED = b"-ERR WATCH is not supported by bespokv: there are no transactions (MULTI is refused), nothing is watched\r\n"


def cmd_watch(conn: Session, cmd: list) -> None:
    if len(cmd) < 2:
        return conn.reply(resp.error("wrong number of arguments for 'watch' command"))
    conn.reply(WATCH_REFUSED)


def cmd_unwatch(conn: Session, cmd: list) -> None:
    conn.reply(resp.OK)  # nothing is ever watched, so there is nothing to forget


def gate(conn: Session, name: bytes) -> bytes | None:
    """The error that stops a command before it runs on a locked or refused-MULTI connection."""
    if conn.node.requirepass is not None and not conn.authed and name not in ALLOWED_UNAUTHENTICATED:
        return NOAUTH
    if conn.in_refused_multi and name not in (b"EXEC", b"DISCARD", b"MULTI", b"QUIT"):
        return IN_REFUSED_MULTI
    return None
