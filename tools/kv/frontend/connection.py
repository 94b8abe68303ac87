"""The RESP front end: one asyncio Protocol per client connection (its session state: session.py).

Everything a connection received in one read is parsed (hiredis) and dispatched before a
single write of all ready replies goes back, which is what makes pipelined clients cheap.
Bad input never raises out of here: malformed frames -- anything but an array of bulk
strings, a length header over the limits -- close the connection after an error (as Redis
does); unknown commands, wrong arity and oversize keys/values get errors.

Resources per connection are bounded as Redis bounds them: `max_clients` connections, and a
bulk header over `max_bulk_bytes` is refused before its payload is read.
"""
from __future__ import annotations

from time import monotonic

import hiredis

from mlsyskit.core.clock import RealClock
from mlsyskit.tools.kv.controlets.base import GET, PUT
from mlsyskit.tools.kv.frontend import admin
from mlsyskit.tools.kv.frontend.commands import HANDLERS, cmd_rmw
from mlsyskit.tools.kv.frontend.session import PIPELINE_PAUSE, Session
from mlsyskit.tools.kv.node.control import LeaseExpired
from mlsyskit.tools.kv.node.requests import PEER_MESSAGE, RelayBatch, Request
from mlsyskit.tools.kv.redis import resp, rmw, values

# Pipelined, these join a read's batch of writes (Session.single): commands whose handler is cmd_rmw,
# which only validates and hands the command to single (anything else must not skip the batch's submit).
RMW_NAMES = frozenset(name for name in rmw.COMMANDS if HANDLERS.get(name) is cmd_rmw)


class ClientConnection(Session):
    """Parses what a client sent (RESP arrays or inline commands) and dispatches it."""

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
        owns, fits, as_is = node.owns, self.key_fits, self.set_as_is  # the handlers' rules (session.rules)
        max_key, max_value = self.limits.max_key_bytes, self.limits.max_value_bytes  # session.rules, inlined
        # A leased fast-path GET checks the lease per operation (node/control.py _leased_get, inlined:
        # two Python frames fewer per GET); the real clock's now() is time.monotonic itself.
        now = monotonic if type(node.clock) is RealClock else node.clock.now
        all_mine = node.only_shard
        out, slots, ok, gets, first = self.out, self.slots, resp.OK, reader.gets, values.FIRST
        budget = self.limits.max_output_bytes - self.transport.get_write_buffer_size()
        # Plain SETs gathered for one stream entry at a stream origin (controlets/batch.py); at a proxy,
        # plain SETs or GETs gathered in one RelayBatch, relayed as one frame (Rider.forward_relay)
        relay = node.controlet is None
        batching, puts = node.batch_puts or relay, self.puts
        self.gathering = True
        try:
            while (cmd := gets()) is not False:
                count += 1
                if not slots and fast_get is not None and not gated and type(cmd) is list and len(cmd) == 2 \
                        and cmd[0] == b"GET":
                    # A run of plain GETs this replica answers from its own datalet, served in this inner
                    # loop until another command comes (it goes on below; nothing a GET does changes the
                    # state the run depends on). A key the run does not take is answered below too.
                    peek = node.peek  # fast_get's read (a live value: its record below)
                    while True:
                        key = cmd[1]
                        if not (type(key) is bytes and len(key) <= max_key and (all_mine or owns(key))):
                            break
                        until = node.lease_until  # _leased_get's check, inlined (node/control.py)
                        if until is not None and now() >= until and not node.renewed_late():
                            out.append(self.lease_refusal())  # deposed or paused past its lease: retriable
                        elif (v := peek(key)) is None:
                            out.append(b"$-1\r\n")
                        elif v.__class__ is not bytes or v[:1] == first:  # a live value, or a record
                            # (redis/values.py: a deadline, a type, an escape); a live collection's
                            # WRONGTYPE comes from its header, no record built
                            out.append(values.get_answer(v, self.unix_ms()))
                        else:
                            out += (b"$%d\r\n" % len(v), v, b"\r\n")
                            budget -= len(v)
                            if budget < 0:
                                self.over_output_limit()
                                return
                        if (cmd := gets()) is False:
                            break
                        count += 1
                        if not (type(cmd) is list and len(cmd) == 2 and cmd[0] == b"GET"):
                            break
                    if cmd is False:
                        break
                    fast_get, fast_put = node.fast_get, node.fast_put  # (a lease refusal may renew it)
                if relay and puts and not gated and type(cmd) is list and len(cmd) == 2 and cmd[0] == b"GET" \
                        and puts[0].op is GET:
                    # a proxy's run of plain GETs into the open RelayBatch (one reply slot for the batch)
                    keys = puts[0].keys
                    while True:
                        key = cmd[1]
                        if not (type(key) is bytes and len(key) <= max_key):
                            break
                        keys.append(key)
                        if (cmd := gets()) is False:
                            break
                        count += 1
                        if not (type(cmd) is list and len(cmd) == 2 and cmd[0] == b"GET"):
                            break
                    if cmd is False:
                        break
                if puts and not gated and type(cmd) is list and len(cmd) == 3 and cmd[0] == b"SET" \
                        and puts[0].op is not GET and (relay or not (self.held or self.unanswered_reads)):
                    # a run of plain SETs into the open batch: a proxy's RelayBatch, or a stream origin's
                    # Requests (session order holds through the run: it adds writes only)
                    batch = puts[0] if relay else None
                    while True:
                        key, value = cmd[1], cmd[2]
                        if not (type(key) is bytes and type(value) is bytes and len(key) <= max_key
                                and len(value) <= max_value and value[:1] != first):  # set_as_is, inlined
                            break
                        if batch is not None:
                            batch.keys.append(key)
                            batch.values.append(value)
                        elif all_mine or owns(key):
                            item = Request(PUT, key, value, self)
                            slots.append(item)
                            puts.append(item)
                            self.unacked_writes += 1
                        else:
                            break
                        if (cmd := gets()) is False:
                            break
                        count += 1
                        if not (type(cmd) is list and len(cmd) == 3 and cmd[0] == b"SET"):
                            break
                    if cmd is False:
                        break
                if batching and not gated and type(cmd) is list and (len(cmd) == 3 or (relay and len(cmd) == 2)):
                    key = cmd[1]
                    if len(cmd) == 3:
                        value = cmd[2]
                        take = (cmd[0] == b"SET" and type(key) is bytes and type(value) is bytes and as_is(key, value)
                                and (relay or all_mine or owns(key)))
                        op = PUT
                    else:
                        value, op = None, GET
                        take = cmd[0] == b"GET" and type(key) is bytes and len(key) <= max_key
                    if take:
                        if puts and (puts[0].op is GET) is not (op is GET):  # of one kind: GETs, or writes
                            self.submit_puts()
                            if self.transport is None:
                                return
                        if relay and puts:  # a proxy: the open RelayBatch takes it (one reply slot per batch)
                            puts[0].keys.append(key)
                            if op is PUT:
                                puts[0].values.append(value)
                            continue
                        # session order: nothing of the connection waits, no read (write) before a write (read)
                        if not self.held and not (self.unanswered_reads if op is PUT else self.unacked_writes):
                            if relay:  # no request per command at a proxy: a RelayBatch opens
                                item = RelayBatch(op, self)
                                item.keys.append(key)
                                if op is PUT:
                                    item.values.append(value)
                            else:
                                item = Request(op, key, value, self)
                            slots.append(item)
                            if op is PUT:
                                self.unacked_writes += 1
                            else:
                                self.unanswered_reads += 1
                            puts.append(item)
                            continue
                # anything else goes after the requests before it; a pipelined read-modify-write instead
                # joins the open batch of writes (Session.single)
                if puts and (relay or puts[0].op is GET or type(cmd) is not list or not cmd
                             or cmd[0] not in RMW_NAMES):
                    self.submit_puts()
                    if self.transport is None:
                        return
                    fast_get, fast_put, batching = node.fast_get, node.fast_put, node.batch_puts or relay
                if not slots and not gated and type(cmd) is list:
                    if len(cmd) == 3 and fast_put is not None and cmd[0] == b"SET":
                        key, value = cmd[1], cmd[2]
                        if type(key) is bytes and type(value) is bytes and as_is(key, value) \
                                and (all_mine or owns(key)):
                            try:
                                fast_put(key, value)
                            except LeaseExpired:
                                out.append(self.lease_refusal())
                                continue
                            except Exception as e:  # noqa: BLE001 - a datalet error fails this SET, not the connection
                                node.stats["datalet_errors"] += 1
                                out.append(resp.error(f"datalet error: {e}"))
                                continue
                            out.append(ok)
                            continue
                if not gated and type(cmd) is list and 2 <= len(cmd) <= 3:
                    # a GET or SET to replicate or forward (a proxy's, a chain head's reads): its request at
                    # once, no dispatch; anything else, or a key or value over the limits, takes dispatch
                    key = cmd[1]
                    if len(cmd) == 3:
                        value = cmd[2]
                        if cmd[0] == b"SET" and type(key) is bytes and type(value) is bytes and as_is(key, value):
                            self.single(PUT, key, value)
                            if self.transport is None:
                                return
                            fast_get, fast_put = node.fast_get, node.fast_put
                            continue
                    elif cmd[0] == b"GET" and type(key) is bytes and fits(key):
                        self.single(GET, key, None)
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
            if puts:
                self.submit_puts()
                if self.transport is None:
                    return
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
            if puts:  # admitted (their slots are taken): submitted even when the read ended in an error
                self.submit_puts()
            node.stats["commands"] += count
            self.in_batch = self.gathering = False
            if node.quiet_due:  # after every message of this read: deferred peer actions (cumulative acks)
                node.quiet()
        if len(slots) + self.batched > PIPELINE_PAUSE and self.transport is not None and not self.reading_paused:
            self.reading_paused = True  # read again once half of them are answered (Session.slot_done)
            self.transport.pause_reading()
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


def _all_bulk(cmd: list) -> bool:
    """Only bulk strings may be arguments: an integer, nil or nested array is never stored."""
    for part in cmd:
        if type(part) is not bytes:
            return False
    return True
