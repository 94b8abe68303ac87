"""A client connection's session state: the reply slots that keep replies in request order, the
session-order rule between a connection's reads and writes, output limits, and turning commands
into single-key or multi-key requests on the node.

Replies leave in request order even when some complete later (a replicated write waiting for its
ack): each request holds a slot in `slots`, and only a ready prefix is flushed. Session order: a
read waits until the connection's earlier writes are answered, a write waits until its earlier
reads are answered (and anything after a waiting request waits too), so a pipelined SET k / GET k
-- or GET k / DEL k -- through a node that forwards the two to different replicas (chain head and
tail) keeps the connection's order. A client whose unsent replies exceed `max_output_bytes` (it
does not read) is disconnected, so it cannot take the server's memory or the other clients' latency.
A client that pipelines faster than its requests complete is not refused: past PIPELINE_PAUSE
unanswered requests the connection stops reading (TCP pushes back, as on a slow Redis) and reads
again below half of it, so one deep pipeline cannot fill the controlet's max_pending for everyone.

The command handlers (commands, admin, keyspace) see a connection as this Session; the parsing
half (connection.py) builds on it.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import socket
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hiredis

from mlsyskit.tools.kv.controlets.base import DEL, EXISTS, FENCED, FLUSH, GET, PUT, WRITES
from mlsyskit.tools.kv.controlets.batch import has_rmw
from mlsyskit.tools.kv.node.requests import Ready, RelayBatch, Request
from mlsyskit.tools.kv.redis import resp, values

PIPELINE_PAUSE = 8192  # unanswered requests of one connection before it stops reading

if TYPE_CHECKING:
    from mlsyskit.tools.kv.frontend.expiry import ActiveExpiry
    from mlsyskit.tools.kv.node.runtime import Node

WRITE_OPS = {b"MSET": PUT, b"DEL": DEL, b"FLUSHALL": FLUSH}


class Aggregate:
    """A multi-key command (MGET, MSET, DEL k..., EXISTS k...) split into single-key requests."""

    __slots__ = ("conn", "kind", "parts", "remaining", "payload", "items")
    nil_on_wrongtype = True  # MGET answers nil for a key of another kind (requests.read_answer)

    def __init__(self, conn: Session, kind: bytes, n: int) -> None:
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


@functools.cache
def rules(limits: resp.Limits) -> tuple[Callable[[bytes], bool], Callable[[bytes, bytes], bool]]:
    """The key and SET rules under `limits`, as (key_fits, set_as_is), for the fast path and the
    handlers alike: one definition of the limits and the escape rule.

    key_fits(key): the key is within the key limit (over it: an error, see Session.bad_key).
    set_as_is(key, value): the SET may be stored as it came: key and value within the limits, and
    no escape needed (a value whose first byte could begin a record is escaped by
    values.stored_string). The fast path stores only these; commands.cmd_set stores these as they
    are and checks the rest. Closures over the limits: two lookups fewer per call on the hot path.
    """
    max_key, max_value, first = limits.max_key_bytes, limits.max_value_bytes, values.FIRST

    def key_fits(key: bytes) -> bool:
        return len(key) <= max_key

    def set_as_is(key: bytes, value: bytes) -> bool:
        return len(key) <= max_key and len(value) <= max_value and value[:1] != first

    return key_fits, set_as_is


_ids = itertools.count(1)


class Session(asyncio.Protocol):
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
        self.key_fits, self.set_as_is = rules(node.limits)
        self.reader = hiredis.Reader()
        self.slots: deque[Any] = deque()
        self.out: list[bytes] = []
        self.in_batch = False
        self.flush_due = False  # a flush is scheduled for the end of this loop turn (slot_done)
        self.transport: asyncio.Transport | None = None
        self.unacked_writes = 0
        self.unanswered_reads = 0
        self.held: deque[tuple[bool, Any]] = deque()  # (is_write, request) waiting for session order
        self.puts: list[Any] = []  # writes of the current read, admitted, for one batch (a proxy: a RelayBatch)
        self.gathering = False  # in the read loop (connection.py): a read-modify-write may join `puts`
        self.reading_paused = False  # past PIPELINE_PAUSE unanswered requests (module docstring)
        self.batched = 0  # a proxy's relayed commands beyond one per slot (RelayBatch), still unanswered

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
    def lease_refusal(self) -> bytes:
        """-TRYAGAIN fenced: the read was refused before it ran (the client refreshes and retries)."""
        self.node.stats["fenced"] += 1
        return resp.error(self.node.fenced() or f"{FENCED} {self.node.node_id} has no current lease; retry")

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
            if type(done) is RelayBatch:
                self.batched -= len(done.keys) - 1
            if done.kind in WRITE_OPS if type(done) is Aggregate else done.op in WRITES:  # (or a RelayBatch)
                self.unacked_writes -= 1
            else:
                self.unanswered_reads -= 1
            if self.held:
                self._release()
        slots = self.slots
        out = self.out
        if slots and slots[0].payload is not None:  # the ready prefix, in order
            popleft, append, size = slots.popleft, out.append, 0
            while slots and slots[0].payload is not None:
                payload = popleft().payload
                append(payload)
                size += len(payload)
            self.out_bytes += size
        if self.reading_paused and len(slots) + self.batched < PIPELINE_PAUSE // 2 and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        if self.out_bytes > self.limits.max_output_bytes:
            self.over_output_limit()
        elif not self.in_batch and not self.flush_due and out:
            # Completed outside this connection's own read (a chain ACK, a forwarded answer): one write
            # at the end of this loop turn for every reply completed in it, not one write per reply.
            self.flush_due = True
            asyncio.get_running_loop().call_soon(self._flush_due)

    def slots_done(self, reqs: list[Request]) -> None:
        """slot_done for a relayed batch (all reads or all writes) whose payloads are all set."""
        if reqs[0].op in WRITES:
            self.unacked_writes -= len(reqs)
        else:
            self.unanswered_reads -= len(reqs)
        if self.held:
            self._release()
        self.slot_done()

    def _flush_due(self) -> None:
        self.flush_due = False
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
    def submit_puts(self) -> None:
        """The writes gathered from this read (plain SETs, read-modify-writes), admitted in order: to
        the node as one batch (Node.submit_batch); at a proxy, the read's RelayBatch (Node.relay)."""
        puts = self.puts
        if type(puts[0]) is RelayBatch:
            batch = puts[0]
            puts.clear()
            self.batched += len(batch.keys) - 1  # its commands count toward PIPELINE_PAUSE, as requests do
            self.node.relay(batch)
            return
        batch = puts[:]
        puts.clear()
        self.node.submit_batch(batch)
        if has_rmw(batch):
            for r in batch:  # a read-modify-write resolved to a value with a deadline: as _start notes it
                if r.rmw is not None and r.op is PUT and r.value[:1] == values.FIRST:
                    self.expiry.note(r.key, values.deadline_of(r.value))

    def single(self, op: str, key: bytes, value: bytes | None, rmw: list[bytes] | None = None) -> None:
        """One single-key request; _admit, _begin and _start inlined (the per-request path)."""
        req = Request(op, key, value, self)
        self.slots.append(req)
        is_write = op in WRITES
        if rmw is not None:
            req.rmw = rmw
            puts = self.puts
            if is_write and self.gathering and (puts[0].op is not GET if puts else self.node.batch_rmw
                                                and not self.held and not self.unanswered_reads):
                # a pipelined read-modify-write joins this read's batch of writes (controlets/batch.py)
                rmw.now_ms = self.unix_ms()  # the instant it takes effect, as _start sets it
                self.unacked_writes += 1
                puts.append(req)
                return
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
        if not self.key_fits(key):
            self.reply(resp.error(f"key too long ({len(key)} > {self.limits.max_key_bytes} bytes)"))
            return True
        return False

    def bad_value(self, value: bytes) -> bool:
        if len(value) > self.limits.max_value_bytes:
            self.reply(resp.error(f"value too large ({len(value)} > {self.limits.max_value_bytes} bytes)"))
            return True
        return False
