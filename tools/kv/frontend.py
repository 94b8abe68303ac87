"""The RESP front end: one asyncio Protocol per client connection.

Everything a connection received in one read is parsed (hiredis) and dispatched before a
single write of all ready replies goes back, which is what makes pipelined clients cheap.
Replies leave in request order even when some complete later (a replicated write waiting
for its ack): each request holds a slot in `slots`, and only a ready prefix is flushed.
Session order: a read waits until the connection's earlier writes are answered (and
anything after a waiting read waits too), so a pipelined SET k / GET k through a node
that forwards the two to different replicas (chain head and tail) still reads its write.
Bad input never raises out of here: malformed frames close the connection after an
error (as Redis does); unknown commands, wrong arity and oversize keys/values get errors.
"""
from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

import hiredis

from mlsyskit.tools.kv import resp
from mlsyskit.tools.kv.commands import HANDLERS
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, GET, PUT, WRITES
from mlsyskit.tools.kv.node import Node, Request

WRITE_OPS = {b"MSET": PUT, b"DEL": DEL}


def _is_write(item: Any) -> bool:
    return item.op in WRITES if type(item) is Request else item.kind in WRITE_OPS


class Ready:
    """An immediate reply queued behind a slower one."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes | None) -> None:
        self.payload = payload


class Aggregate:
    """A multi-key command (MGET, MSET, DEL k..., EXISTS k...) split into single-key requests."""

    __slots__ = ("conn", "kind", "parts", "remaining", "payload", "items")

    def __init__(self, conn: ClientConnection, kind: bytes, n: int) -> None:
        self.conn, self.kind, self.remaining = conn, kind, n
        self.parts: list[bytes | None] = [None] * n
        self.payload: bytes | None = None
        self.items: list[tuple[bytes, bytes | None]] = []

    def part_done(self, req: Request) -> None:
        self.parts[req.index] = req.payload
        self.remaining -= 1
        if self.remaining:
            return
        failed = next((p for p in self.parts if p.startswith(b"-")), None)
        if failed is not None:
            self.payload = failed
        elif self.kind == b"MGET":
            self.payload = b"*%d\r\n" % len(self.parts) + b"".join(self.parts)
        elif self.kind == b"MSET":
            self.payload = resp.OK
        else:
            self.payload = resp.integer(sum(int(p[1:-2]) for p in self.parts))
        self.conn.slot_done(self)


class ClientConnection(asyncio.Protocol):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = node.limits
        self.reader = hiredis.Reader()
        self.slots: deque[Any] = deque()
        self.out: list[bytes] = []
        self.in_batch = False
        self.transport: asyncio.Transport | None = None
        self.unacked_writes = 0
        self.held: deque[tuple[bool, Any]] = deque()  # (is_write, request) waiting for session order

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node.stats["connections"] += 1
        self.node.client_connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.node.client_connections.discard(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- input ---------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        self.in_batch = True
        handlers = HANDLERS
        count = 0
        node = self.node
        # Hot path, inlined: single-key GET/SET that this replica serves from its own datalet.
        fast_get, fast_put = node.fast_get, node.fast_put
        owns, max_key, max_value = node.owns, self.limits.max_key_bytes, self.limits.max_value_bytes
        all_mine = node.only_shard
        out, slots, ok, gets = self.out, self.slots, resp.OK, reader.gets
        try:
            while (cmd := gets()) is not False:
                count += 1
                if not slots and type(cmd) is list:
                    n = len(cmd)
                    if n == 2 and fast_get is not None and cmd[0] == b"GET":
                        key = cmd[1]
                        if len(key) <= max_key and (all_mine or owns(key)):
                            v = fast_get(key)
                            out.append(b"$-1\r\n" if v is None else b"$%d\r\n%b\r\n" % (len(v), v))
                            continue
                    elif n == 3 and fast_put is not None and cmd[0] == b"SET":
                        key = cmd[1]
                        if len(key) <= max_key and len(cmd[2]) <= max_value and (all_mine or owns(key)):
                            fast_put(key, cmd[2])
                            out.append(ok)
                            continue
                if type(cmd) is not list or not cmd or type(cmd[0]) is not bytes:
                    self.fatal("Protocol error: expected an array of bulk strings")
                    return
                handler = handlers.get(cmd[0]) or handlers.get(cmd[0].upper())
                if handler is None:
                    self.reply(resp.error(f"unknown command '{cmd[0][:64].decode(errors='replace')}'"))
                else:
                    handler(self, cmd)
            if reader.len() > self.limits.max_request_bytes:
                self.fatal(f"Protocol error: request larger than {self.limits.max_request_bytes} bytes")
                return
        except hiredis.ProtocolError as e:
            self.fatal(f"Protocol error: {e}")
            return
        finally:
            node.stats["commands"] += count
            self.in_batch = False
            if node.quiet_due:  # after every message of this read: deferred peer actions (cumulative acks)
                node.quiet()
        self.flush()

    def fatal(self, message: str) -> None:
        """Malformed input: answer with an error, then close (the stream cannot be resynchronised)."""
        self.node.stats["errors"] += 1
        self.out.append(resp.error(message))
        self.in_batch = False
        self.flush()
        if self.transport is not None:
            self.transport.close()

    # -- output --------------------------------------------------------------
    def reply(self, payload: bytes) -> None:
        if self.slots:
            self.slots.append(Ready(payload))
        else:
            self.out.append(payload)

    def slot_done(self, done: Any = None) -> None:
        if done is not None and _is_write(done):
            self.unacked_writes -= 1
            self._release()
        slots = self.slots
        out = self.out
        while slots and slots[0].payload is not None:
            out.append(slots.popleft().payload)
        if not self.in_batch:
            self.flush()

    def flush(self) -> None:
        out = self.out
        if out:
            if self.transport is not None:
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    # -- requests --------------------------------------------------------------
    def single(self, op: str, key: bytes, value: bytes | None) -> None:
        req = Request(op, key, value, self)
        self.slots.append(req)
        self._admit(op in WRITES, req)

    def multi(self, kind: bytes, op: str, items: list[tuple[bytes, bytes | None]]) -> None:
        agg = Aggregate(self, kind, len(items))
        agg.items = items
        self.slots.append(agg)
        self._admit(op in WRITES, agg)

    def _admit(self, is_write: bool, item: Any) -> None:
        if self.held or (not is_write and self.unacked_writes):
            self.held.append((is_write, item))
            return
        if is_write:
            self.unacked_writes += 1
        self._start(item)

    def _release(self) -> None:
        held = self.held
        while held and (held[0][0] or not self.unacked_writes):
            is_write, item = held.popleft()
            if is_write:
                self.unacked_writes += 1
            self._start(item)

    def _start(self, item: Any) -> None:
        if type(item) is Request:
            self.node.submit(item)
            return
        op = WRITE_OPS.get(item.kind, GET if item.kind == b"MGET" else EXISTS)
        for i, (key, value) in enumerate(item.items):
            self.node.submit(Request(op, key, value, None, item, i))

    def bad_key(self, key: bytes) -> bool:
        if len(key) > self.limits.max_key_bytes:
            self.reply(resp.error(f"key too long ({len(key)} > {self.limits.max_key_bytes} bytes)"))
            return True
        return False

    def bad_value(self, value: bytes) -> bool:
        if len(value) > self.limits.max_value_bytes:
            self.reply(resp.error(f"value too large ({len(value)} > {self.limits.max_value_bytes} bytes)"))
            return True
        return False

