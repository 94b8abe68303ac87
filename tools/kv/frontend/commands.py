"""The commands the front end understands, one handler each (HANDLERS maps names to them).

Handlers validate arity and limits, answer what they can at once (PING, INFO, HELLO ...)
and turn data commands into single-key requests on the connection. GET and SET also have
an inlined fast path in Session.data_received; these handlers are the general path.
Connection-level commands (AUTH, CLIENT, COMMAND, CONFIG, MULTI) live in admin.py.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from mlsyskit.core import __version__
from mlsyskit.tools.kv import peerauth
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, GET, PUT, RMW
from mlsyskit.tools.kv.frontend import admin, cluster, keyspace
from mlsyskit.tools.kv.frontend.expiry import wall_ms
from mlsyskit.tools.kv.frontend.session import Session
from mlsyskit.tools.kv.node.requests import FLUSH_SHARD, PEER_AUTH, PEER_MESSAGE, PEER_NONCE, Ready
from mlsyskit.tools.kv.redis import queries, resp, resp3, rmw, values
from mlsyskit.tools.kv.shardmap import hash64


def _arity(conn: Session, cmd: list, name: str) -> None:
    conn.reply(resp.error(f"wrong number of arguments for '{name}' command"))


def cmd_get(conn: Session, cmd: list) -> None:
    if len(cmd) != 2:
        return _arity(conn, cmd, "get")
    key = cmd[1]
    if conn.bad_key(key):
        return None
    node = conn.node
    if node.fast_get is not None and not conn.slots and node.owns(key):
        # a live value as it is: get_answer reads a collection's WRONGTYPE from its header, no record built
        conn.out.append(values.get_answer(node.fast_get(key), conn.unix_ms()))
    else:
        conn.single(GET, key, None)


def cmd_set(conn: Session, cmd: list) -> None:
    if len(cmd) != 3:
        if len(cmd) > 3:
            return cmd_rmw(conn, cmd)  # SET with NX / XX / GET
        return _arity(conn, cmd, "set")
    key, value = cmd[1], cmd[2]
    if not conn.set_as_is(key, value):  # the fast path's rule (session.rules); the rest checked here
        if conn.bad_key(key) or conn.bad_value(value):
            return None
        value = values.stored_string(value)  # escaped if it would read as a record
    node = conn.node
    if node.fast_put is not None and not conn.slots and node.owns(key):
        node.fast_put(key, value)
        conn.out.append(resp.OK)
    else:
        conn.single(PUT, key, value)


def cmd_rmw(conn: Session, cmd: list) -> None:
    """Every write but plain SET/DEL (INCR, SET EX/NX, EXPIRE, LPUSH, HSET, ZADD ...): resolved
    at the shard's write point and replicated as the key's whole new value (redis/rmw.py)."""
    try:
        command = rmw.parse(cmd, max_bytes=conn.limits.max_value_bytes)
    except rmw.RmwSyntaxError as e:
        return conn.reply(resp.error(f"ERR {e}"))
    key = command[1]
    if conn.bad_key(key) or any(conn.bad_value(a) for a in command[2:]):
        return None
    conn.single(RMW, key, None, command)


def cmd_query(conn: Session, cmd: list) -> None:
    """TTL, TYPE, LRANGE, HGET, ZSCORE ...: served where GET is, from the key's stored value (redis/queries.py)."""
    name = cmd[0].upper()
    arity = queries.READS[name][0]
    if len(cmd) != arity if arity > 0 else len(cmd) < -arity:
        return _arity(conn, cmd, name.decode().lower())
    command = rmw.Command([name, *cmd[1:]])
    refused = queries.check(command)
    if refused is not None:
        return conn.reply(refused)
    _serve_read(conn, command, command[1])


def _serve_read(conn: Session, command: rmw.Command, key: bytes) -> None:
    """A read command answered where GET is served: here from a live value, or as a request."""
    if conn.bad_key(key):
        return None
    node = conn.node
    if node.fast_get is not None and not conn.slots and node.owns(key):
        answer = queries.answer(command, node.fast_get(key), conn.unix_ms())
        conn.out.append(resp3.shape(command, answer) if conn.protocol == 3 else answer)
    else:
        conn.single(GET, key, None, command)


OBJECT_HELP = [b"OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
               b"ENCODING <key>", b"    Return how bespokv holds the value of <key>: raw, rope, chunklist,",
               b"    hashtrie, hashtrie+btree or msgpack (REFCOUNT, IDLETIME and FREQ are not kept).",
               b"HELP", b"    Print this help."]


def cmd_object(conn: Session, cmd: list) -> None:
    """OBJECT ENCODING key (served where GET is: queries.object_encoding) and OBJECT HELP. bespokv
    keeps no reference counts, access times or frequencies, so REFCOUNT, IDLETIME and FREQ are refused."""
    if len(cmd) < 2:
        return _arity(conn, cmd, "object")
    sub = cmd[1].upper()
    if sub == b"HELP" and len(cmd) == 2:
        return conn.reply(b"*%d\r\n" % len(OBJECT_HELP) + b"".join(b"+%b\r\n" % line for line in OBJECT_HELP))
    if sub in (b"ENCODING", b"REFCOUNT", b"IDLETIME", b"FREQ", b"HELP") and len(cmd) != (2 if sub == b"HELP" else 3):
        return _arity(conn, cmd, f"object|{sub.decode().lower()}")
    if sub in (b"REFCOUNT", b"IDLETIME", b"FREQ"):
        return conn.reply(resp.error(f"OBJECT {sub.decode()} is not supported by bespokv (it keeps no reference "
                                     "counts, access times or frequencies; ENCODING is)"))
    if sub != b"ENCODING":
        what = cmd[1][:32].decode(errors="replace")
        return conn.reply(resp.error(f"unknown subcommand '{what}'. Try OBJECT HELP."))
    _serve_read(conn, rmw.Command([b"OBJECT", b"ENCODING", cmd[2]]), cmd[2])


def cmd_time(conn: Session, cmd: list) -> None:
    """TIME: the clock this node reads deadlines against, as [seconds, microseconds]."""
    if len(cmd) != 1:
        return _arity(conn, cmd, "time")
    micros = time.time_ns() // 1000 if conn.unix_ms is wall_ms else conn.unix_ms() * 1000
    conn.reply(resp.array([b"%d" % (micros // 1_000_000), b"%d" % (micros % 1_000_000)]))


def peers_only(name: bytes, handler: Any) -> Any:
    """An internal command: served on a connection that proved the cluster secret (BKV.AUTH: a node
    or the proxy), refused to every client whatever it sends or whichever password it knows."""
    refusal = b"-NOPERM %b is for authenticated replica connections\r\n" % name

    def guarded(conn: Session, cmd: list) -> None:
        if conn.peer is None:
            return conn.reply(refusal)
        handler(conn, cmd)
    return guarded


def _keys_command(op: str, name: str, kind: bytes):
    def handler(conn: Session, cmd: list) -> None:
        if len(cmd) < 2:
            return _arity(conn, cmd, name)
        if len(cmd) > conn.limits.max_args:
            return conn.reply(resp.error(f"too many arguments ({len(cmd)} > {conn.limits.max_args})"))
        if any(conn.bad_key(k) for k in cmd[1:]):
            return None
        if len(cmd) == 2 and kind != b"MGET":
            return conn.single(op, cmd[1], None)
        return conn.multi(kind, op, [(k, None) for k in cmd[1:]])
    return handler


def cmd_mset(conn: Session, cmd: list) -> None:
    if len(cmd) < 3 or len(cmd) % 2 == 0:
        return _arity(conn, cmd, "mset")
    if len(cmd) > conn.limits.max_args:
        return conn.reply(resp.error(f"too many arguments ({len(cmd)} > {conn.limits.max_args})"))
    pairs = list(zip(cmd[1::2], cmd[2::2], strict=True))
    if any(conn.bad_key(k) or conn.bad_value(v) for k, v in pairs):
        return None
    pairs = [(k, values.stored_string(v)) for k, v in pairs]
    conn.multi(b"MSET", PUT, pairs)


def cmd_ping(conn: Session, cmd: list) -> None:
    conn.reply(resp.PONG if len(cmd) == 1 else resp.bulk(cmd[1]))


def cmd_echo(conn: Session, cmd: list) -> None:
    if len(cmd) != 2:
        return _arity(conn, cmd, "echo")
    conn.reply(resp.bulk(cmd[1]))


def cmd_info(conn: Session, cmd: list) -> None:
    lines = ["# bespokv"] + [f"{k}:{v}" for k, v in conn.node.info().items()]
    conn.reply(resp.bulk(("\r\n".join(lines) + "\r\n").encode()))


def cmd_shardmap(conn: Session, cmd: list) -> None:
    conn.reply(resp.bulk(conn.node.map.to_json().encode()))


def cmd_digest(conn: Session, cmd: list) -> None:
    """BKV.DIGEST: this node's own datalet as [key count, order-independent hash of all pairs].

    Replicas of a shard that hold the same data give the same digest, whatever their roles,
    so it is the consistency check for a quiesced cluster (read-only, so clients may ask).
    """
    datalet = conn.node.datalet
    if datalet is None:
        return conn.reply(resp.error("a proxy holds no data"))
    slot = Ready(None)
    conn.slots.append(slot)

    async def compute() -> None:
        count, digest = 0, 0
        async for key, value in datalet.export_pairs():
            count += 1
            digest ^= hash64(b"%d:%b%b" % (len(key), key, value))
        slot.payload = resp.array([b"%d" % count, b"%016x" % digest])
        conn.slot_done()

    task = asyncio.get_running_loop().create_task(compute())
    conn.node.tasks.add(task)
    task.add_done_callback(conn.node.tasks.discard)


def cmd_peer(conn: Session, cmd: list) -> None:
    """BKV.MSG: one-way, so it has no reply -- except to a sender that is not an authenticated peer."""
    if conn.peer is None:
        conn.node.stats["refused_peer_messages"] += 1
        return conn.reply(b"-NOPERM peer messages need a replica connection authenticated with BKV.AUTH\r\n")
    conn.node.on_peer_message(conn.peer, conn.peer_bytes, cmd)


def cmd_nonce(conn: Session, cmd: list) -> None:
    conn.nonce = peerauth.new_nonce()
    conn.reply(resp.bulk(conn.nonce))


def cmd_peer_auth(conn: Session, cmd: list) -> None:
    """BKV.AUTH <node> <proof>: the HMAC of this connection's nonce with the cluster secret."""
    node = conn.node
    nonce, conn.nonce = conn.nonce, None  # one attempt per nonce
    if len(cmd) != 3:
        return _arity(conn, cmd, "bkv.auth")
    name = cmd[1]
    known = name in node.peer_names or name == b"proxy" or name.decode("utf-8", "replace") in node.cluster_nodes
    if not known or not peerauth.verify(node.secret, nonce, name, node.src_bytes, cmd[2]):
        node.stats["auth_failures"] += 1
        return conn.reply(b"-NOPERM peer authentication failed\r\n")
    conn.peer, conn.peer_bytes = name.decode(), name
    conn.authed = True
    conn.reply(resp.OK)


def cmd_hello(conn: Session, cmd: list) -> None:
    """HELLO [2|3] [AUTH user pass] [SETNAME name]: client libraries handshake with it.

    Every reply this server sends (simple, bulk, null bulk, integer, array) is also valid
    RESP3, so only the handshake answer itself differs between the two versions. The proxy, and
    a node started without redirects, answers every key (it forwards what it does not own):
    Redis's standalone mode. A node of `bespokv up` answers -MOVED for another shard's key
    (frontend/cluster.py), so it says mode cluster, as a Redis Cluster node does.
    """
    version = cmd[1] if len(cmd) > 1 else b"2"
    if version not in (b"2", b"3"):
        return conn.reply(b"-NOPROTO unsupported protocol version\r\n")
    rest = cmd[2:]
    while rest:
        option = rest[0].upper()
        if option == b"AUTH" and len(rest) >= 3:
            if not admin.check_password(conn, rest[2]):
                return None
            rest = rest[3:]
        elif option == b"SETNAME" and len(rest) >= 2:
            conn.name = rest[1]
            rest = rest[2:]
        else:
            return conn.reply(resp.error(f"syntax error in HELLO option {option[:32].decode(errors='replace')}"))
    if conn.node.requirepass is not None and not conn.authed:
        return conn.reply(admin.NOAUTH)
    conn.protocol = int(version)
    fields = [b"server", b"bespokv", b"version", __version__.encode(), b"proto", int(version),
              b"id", conn.id, b"mode", b"cluster" if conn.node.redirect else b"standalone", b"role", b"master", b"modules", []]
    parts = [(b"%%%d\r\n" % (len(fields) // 2)) if version == b"3" else (b"*%d\r\n" % len(fields))]
    for f in fields:
        parts.append(resp.integer(f) if isinstance(f, int) else resp.EMPTY_ARRAY if f == [] else resp.bulk(f))
    conn.reply(b"".join(parts))


def cmd_select(conn: Session, cmd: list) -> None:
    ok = len(cmd) == 2 and cmd[1] == b"0"
    conn.reply(resp.OK if ok else resp.error("only database 0 exists in a bespokv cluster"))


def cmd_quit(conn: Session, cmd: list) -> None:
    conn.reply(resp.OK)
    conn.flush()
    if conn.transport is not None:
        conn.transport.close()


HANDLERS: dict[bytes, Any] = {
    b"GET": cmd_get, b"SET": cmd_set, b"MSET": cmd_mset,
    b"DEL": _keys_command(DEL, "del", b"DEL"), b"EXISTS": _keys_command(EXISTS, "exists", b"EXISTS"),
    b"MGET": _keys_command(GET, "mget", b"MGET"),
    # UNLINK is DEL (a delete frees nothing later here), TOUCH is EXISTS (no access times are kept)
    b"UNLINK": _keys_command(DEL, "unlink", b"DEL"), b"TOUCH": _keys_command(EXISTS, "touch", b"EXISTS"),
    b"OBJECT": cmd_object, b"TIME": cmd_time,
    b"PING": cmd_ping, b"ECHO": cmd_echo, b"INFO": cmd_info, b"HELLO": cmd_hello, b"SELECT": cmd_select,
    b"QUIT": cmd_quit, b"AUTH": admin.cmd_auth, b"CLIENT": admin.cmd_client, b"COMMAND": admin.cmd_command,
    b"CONFIG": admin.cmd_config, b"MULTI": admin.cmd_multi, b"EXEC": admin.cmd_exec,
    b"DISCARD": admin.cmd_discard, b"WATCH": admin.cmd_watch, b"UNWATCH": admin.cmd_unwatch,
    b"BKV.SHARDMAP": cmd_shardmap, b"BKV.DIGEST": cmd_digest,
    PEER_MESSAGE: cmd_peer, PEER_NONCE: cmd_nonce, PEER_AUTH: cmd_peer_auth,
    **dict.fromkeys(rmw.COMMANDS, cmd_rmw), **keyspace.HANDLERS, **cluster.HANDLERS,
    **dict.fromkeys(queries.READS, cmd_query), rmw.REAP: cmd_rmw,
}
# Between nodes only: another shard's key listing, FLUSHALL's part for one shard, and the expiry
# sweep's delete-if-expired forwarded to the write point (a client has KEYS, FLUSHALL and DEL).
INTERNAL = (b"BKV.KEYS", FLUSH_SHARD, rmw.REAP)
HANDLERS.update({name: peers_only(name, HANDLERS[name]) for name in INTERNAL})
# COMMAND/COMMAND COUNT list what is in admin.ARITY: add the typed commands' Redis arities.
admin.ARITY.update({name: (arity, (b"write",), 1, 1, 1) for name, (arity, _) in rmw.WRITES.items()
                    if name not in admin.ARITY and name != rmw.REAP})
admin.ARITY.update({name: (arity, (b"readonly",), 1, 1, 1) for name, (arity, _) in queries.READS.items()})
admin.register_arities(HANDLERS)
