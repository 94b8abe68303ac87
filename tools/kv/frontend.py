"""The RESP front end: one asyncio Protocol per client connection.

Everything a connection received in one read is parsed (hiredis) and dispatched before a
single write of all ready replies goes back, which is what makes pipelined clients cheap.
Replies leave in request order even when some complete later (a replicated write waiting
for its ack): each request holds a slot in `slots`, and only a ready prefix is flushed.
Session order: a read waits until the connection's earlier writes are answered, a write
waits until its earlier reads are answered (and anything after a waiting request waits
too), so a pipelined SET k / GET k -- or GET k / DEL k -- through a node that forwards the
two to different replicas (chain head and tail) keeps the connection's order.
Bad input never raises out of here: malformed frames -- anything but an array of bulk
strings, a length header over the limits -- close the connection after an error (as Redis
does); unknown commands, wrong arity and oversize keys/values get errors.

Resources per connection are bounded as Redis bounds them: `max_clients` connections, a
bulk header over `max_bulk_bytes` is refused before its payload is read, and a client whose
unsent replies exceed `max_output_bytes` (it does not read) is disconnected, so it cannot
take the server's memory or the other clients' latency.
"""
from __future__ import annotations

import asyncio
import itertools
import socket
from collections import deque
from typing import TYPE_CHECKING, Any

import hiredis

from mlsyskit.tools.kv import admin, resp, values
from mlsyskit.tools.kv.commands import HANDLERS
from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, FLUSH, GET, PUT, WRITES
from mlsyskit.tools.kv.nodecontrol import FENCED, LeaseExpired
from mlsyskit.tools.kv.requests import PEER_MESSAGE, Ready, Request

if TYPE_CHECKING:
    from mlsyskit.tools.kv.expiry import ActiveExpiry
    from mlsyskit.tools.kv.node import Node

WRITE_OPS = {b"MSET": PUT, b"DEL": DEL, b"FLUSHALL": FLUSH}


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
        elif self.kind == b"MSET" or self.kind == b"FLUSHALL":
            self.payload = resp.OK
        else:
            self.payload = resp.integer(sum(int(p[1:-2]) for p in self.parts))
        self.conn.slot_done(self)


_ids = itertools.count(1)


class ClientConnection(asyncio.Protocol):
    def __init__(self, node: Node, expiry: ActiveExpiry) -> None:
        self.id = next(_ids)
        self.expiry = expiry
        self.unix_ms = expiry.unix_ms  # the wall clock deadlines are read against
        self.name = b""
        self.lib: dict[bytes, bytes] = {}
        self.peer: str | None = None  # the node name, once BKV.AUTH proved the cluster secret
        self.peer_bytes = b""
        self.nonce: bytes | None = None
        self.authed = node.requirepass is None
        self.in_refused_multi = False
        self.protocol = 2  # RESP version chosen by HELLO
        self.inline = b""  # an incomplete inline command line
        self.waiting_bytes = 0  # received since the last request completed
        self.out_bytes = 0  # completed replies gathered in `out` during a read (slow path)
        self.node = node
        self.limits = node.limits
        self.reader = hiredis.Reader()
        self.slots: deque[Any] = deque()
        self.out: list[bytes] = []
        self.in_batch = False
        self.transport: asyncio.Transport | None = None
        self.unacked_writes = 0
        self.unanswered_reads = 0
        self.held: deque[tuple[bool, Any]] = deque()  # (is_write, request) waiting for session order

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node.stats["connections"] += 1
        if len(self.node.client_connections) >= self.limits.max_clients:
            self.node.stats["rejected_connections"] += 1
            transport.write(b"-ERR max number of clients reached\r\n")
            transport.close()
            self.transport = None
            return
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
        if self.transport is None:
            return  # closed (over a limit, refused): nothing more is read
        reader = self.reader
        # Inline commands (`PING\r\n`) only at a request boundary. An empty hiredis buffer is not one:
        # a read that ended right after an element of a long array leaves it empty mid-request, and
        # the next read then starts with that array's next `$` header (a peer's large GKEYS was cut
        # so and its rest parsed as inline commands: the stream desynchronised, the peer was closed).
        first = data[:1]
        if self.inline or (first != b"*" and first != b"$" and not reader.len() and self.peer is None):
            data = self._inline_commands(data)
            if not data:
                return
        reader.feed(data)
        self.in_batch = True
        count = 0
        node = self.node
        # Hot path, inlined: single-key GET/SET that this replica serves from its own datalet.
        fast_get, fast_put = node.fast_get, node.fast_put
        gated = self.in_refused_multi or not self.authed
        owns, max_key, max_value = node.owns, self.limits.max_key_bytes, self.limits.max_value_bytes
        all_mine = node.only_shard
        out, slots, ok, gets, first = self.out, self.slots, resp.OK, reader.gets, values.FIRST
        budget = self.limits.max_output_bytes - self.transport.get_write_buffer_size()
        try:
            while (cmd := gets()) is not False:
                count += 1
                if not slots and not gated and type(cmd) is list:
                    n = len(cmd)
                    if n == 2 and fast_get is not None and cmd[0] == b"GET":
                        key = cmd[1]
                        if type(key) is bytes and len(key) <= max_key and (all_mine or owns(key)):
                            try:
                                v = fast_get(key)
                            except LeaseExpired:  # deposed or paused past its lease: a retriable refusal
                                out.append(self.lease_refusal())
                                continue
                            if v is None:
                                out.append(b"$-1\r\n")
                                continue
                            if v[:1] == first:  # a record (values.py): a deadline, a type, an escape
                                out.append(values.get_answer(v, self.unix_ms()))
                                continue
                            out.append(b"$%d\r\n%b\r\n" % (len(v), v))
                            budget -= len(v)
                            if budget < 0:
                                self.over_output_limit()
                                return
                            continue
                    elif n == 3 and fast_put is not None and cmd[0] == b"SET":
                        key, value = cmd[1], cmd[2]
                        if type(key) is bytes and type(value) is bytes and len(key) <= max_key \
                                and len(value) <= max_value and value[:1] != first and (all_mine or owns(key)):
                            fast_put(key, value)
                            out.append(ok)
                            continue
                if not gated and type(cmd) is list and len(cmd) == 3 and cmd[0] == b"SET":
                    key, value = cmd[1], cmd[2]  # a SET to replicate or forward: its request at once, no dispatch
                    if type(key) is bytes and type(value) is bytes and len(key) <= max_key \
                            and len(value) <= max_value and value[:1] != first:
                        self.single(PUT, key, value)
                        if self.transport is None:
                            return
                        fast_get, fast_put = node.fast_get, node.fast_put
                        continue
                if type(cmd) is list and cmd and cmd[0] == PEER_MESSAGE and self.peer is not None:
                    node.on_peer_message(self.peer, self.peer_bytes, cmd)  # authenticated: the replication path
                    fast_get, fast_put = node.fast_get, node.fast_put  # off while the replica catches up
                    continue
                if type(cmd) is not list or not cmd or not _all_bulk(cmd):
                    self.fatal("Protocol error: expected an array of bulk strings")
                    return
                self.dispatch(cmd)
                if self.transport is None:
                    return
                fast_get, fast_put = node.fast_get, node.fast_put  # a peer message may change them
                gated = self.in_refused_multi or not self.authed
            if reader.len() > self.limits.max_request_bytes:
                self.fatal(f"Protocol error: request larger than {self.limits.max_request_bytes} bytes")
                return
            if count == 0 or reader.has_data():  # a request is incomplete: is a header absurd?
                if data[-2:] == b"\r\n" and self._oversized(data):
                    return
                if count == 0 and data[:1] == b"*" and self._too_many_args(data):
                    return
            # Bytes received since a request last completed bound what a trickled request holds
            # (hiredis keeps a partial multibulk's parsed arguments outside its buffer).
            self.waiting_bytes = 0 if count else self.waiting_bytes + len(data)
            if self.waiting_bytes > self.limits.max_request_bytes:
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

    def dispatch(self, cmd: list) -> None:
        """The general path for one command (arguments already checked to be bulk strings)."""
        name = cmd[0] if cmd[0] in HANDLERS else cmd[0].upper()
        if self.in_refused_multi or not self.authed:
            refusal = admin.gate(self, name)
            if refusal is not None:
                return self.reply(refusal)
        handler = HANDLERS.get(name)
        if handler is None:
            return self.reply(resp.error(f"unknown command '{cmd[0][:64].decode(errors='replace')}'"))
        try:
            handler(self, cmd)
        except LeaseExpired:  # a handler's local read (GET, GETRANGE...) found the lease lapsed
            self.reply(self.lease_refusal())

    def lease_refusal(self) -> bytes:
        """-TRYAGAIN fenced: the read was refused before it ran (the client refreshes and retries)."""
        self.node.stats["fenced"] += 1
        return resp.error(self.node.fenced() or f"{FENCED} {self.node.node_id} has no current lease; retry")

    def _inline_commands(self, data: bytes) -> bytes:
        """Redis's inline form (`PING\\r\\n`, as redis-cli pipes and redis-benchmark's PING_INLINE send):
        space-separated words on a line. Returns what follows them (RESP arrays) for hiredis."""
        buf = self.inline + data
        self.inline = b""
        self.in_batch = True
        try:
            while buf and buf[:1] != b"*":
                end = buf.find(b"\n")
                if end < 0:
                    if len(buf) > self.limits.max_key_bytes + self.limits.max_value_bytes:
                        self.fatal("Protocol error: too big inline request")
                        return b""
                    self.inline = buf
                    break
                words, buf = buf[:end].rstrip(b"\r").split(), buf[end + 1:]
                if words:
                    self.node.stats["commands"] += 1
                    self.dispatch(words)
                    if self.transport is None:
                        return b""
        finally:
            self.in_batch = False
        if not buf or self.inline:
            self.flush()
            return b""
        return buf

    def _too_many_args(self, data: bytes) -> bool:
        """A read that completed nothing and starts with `*n`: refuse an n over max_args."""
        end = data.find(b"\r\n", 0, 24)
        if end > 1 and data[1:end].isdigit() and int(data[1:end]) > self.limits.max_args:
            self.fatal(f"Protocol error: invalid multibulk length ({int(data[1:end])} arguments > "
                       f"{self.limits.max_args})")
            return True
        return False

    def _oversized(self, data: bytes) -> bool:
        """An incomplete request waits on the header that ends this read: refuse it if it
        announces more than the limits (hiredis would otherwise wait for, and buffer, all of it)."""
        why = resp.oversized_tail(data, self.limits.max_bulk_bytes_effective(), self.limits.max_args)
        if why is None:
            return False
        self.fatal(f"Protocol error: {why}")
        return True

    def fatal(self, message: str) -> None:
        """Malformed input: answer with an error, then close (the stream cannot be resynchronised)."""
        self.node.stats["errors"] += 1
        self.out.append(resp.error(message))
        self.in_batch = False
        self.flush()
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def over_output_limit(self) -> None:
        """The client does not read its replies: drop them and the connection (Redis does the same)."""
        self.node.stats["output_limit_closes"] += 1
        self.out.clear()
        self.slots.clear()
        self.held.clear()
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    # -- output --------------------------------------------------------------
    def reply(self, payload: bytes) -> None:
        if self.slots:
            self.slots.append(Ready(payload))
        else:
            self.out.append(payload)

    def slot_done(self, done: Any = None) -> None:
        if done is not None:
            if done.op in WRITES if type(done) is Request else done.kind in WRITE_OPS:
                self.unacked_writes -= 1
            else:
                self.unanswered_reads -= 1
            if self.held:
                self._release()
        slots = self.slots
        out = self.out
        while slots and slots[0].payload is not None:
            payload = slots.popleft().payload
            out.append(payload)
            self.out_bytes += len(payload)
        if self.out_bytes > self.limits.max_output_bytes:
            self.over_output_limit()
        elif not self.in_batch:
            self.flush()

    def flush(self) -> None:
        out = self.out
        if out:
            transport = self.transport
            if transport is not None:
                data = out[0] if len(out) == 1 else b"".join(out)
                if transport.get_write_buffer_size() + len(data) > self.limits.max_output_bytes:
                    self.over_output_limit()
                    return
                transport.write(data)
            out.clear()
        self.out_bytes = 0

    # -- requests --------------------------------------------------------------
    def single(self, op: str, key: bytes, value: bytes | None, rmw: list[bytes] | None = None) -> None:
        """One single-key request; _admit, _begin and _start inlined (the per-request path)."""
        req = Request(op, key, value, self)
        self.slots.append(req)
        is_write = op in WRITES
        if rmw is not None:
            req.rmw = rmw
            self._admit(is_write, req)
        elif self.held or (self.unanswered_reads if is_write else self.unacked_writes):
            self.held.append((is_write, req))
        else:
            if is_write:
                self.unacked_writes += 1
            else:
                self.unanswered_reads += 1
            self.node.submit(req)

    def multi(self, kind: bytes, op: str, items: list[tuple[bytes, bytes | None]]) -> None:
        agg = Aggregate(self, kind, len(items))
        agg.items = items
        self.slots.append(agg)
        self._admit(op in WRITES, agg)

    def _admit(self, is_write: bool, item: Any) -> None:
        if self.held or (self.unanswered_reads if is_write else self.unacked_writes):
            self.held.append((is_write, item))
            return
        self._begin(is_write, item)

    def _begin(self, is_write: bool, item: Any) -> None:
        if is_write:
            self.unacked_writes += 1
        else:
            self.unanswered_reads += 1
        self._start(item)

    def _release(self) -> None:
        held = self.held
        while held and not (self.unanswered_reads if held[0][0] else self.unacked_writes):
            is_write, item = held.popleft()
            self._begin(is_write, item)

    def _start(self, item: Any) -> None:
        if type(item) is Request:
            command = item.rmw
            if command is None:
                self.node.submit(item)
                return
            command.now_ms = self.unix_ms()  # the instant it takes effect: deadlines, lazy expiry
            self.node.submit(item)
            if item.op is PUT and item.value[:1] == values.FIRST:  # resolved here, with a deadline?
                self.expiry.note(item.key, values.deadline_of(item.value))
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



def _all_bulk(cmd: list) -> bool:
    """Only bulk strings may be arguments: an integer, nil or nested array is never stored."""
    for part in cmd:
        if type(part) is not bytes:
            return False
    return True
