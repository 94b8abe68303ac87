"""`aa-sc`: active-active, strong consistency by per-shard sequencing.

Any replica accepts reads and writes, but every operation on the shard is ordered by one
sequencer (the shard's first replica) -- a total order per shard, not a lock:

  write at X:  X -> sequencer SUBMIT; the sequencer assigns the next slot, applies it and
               broadcasts SEQ(slot) to every other replica; each applies in slot order and
               acks the origin X; X answers once all R replicas have applied it.
  read at X:   X -> sequencer READ(key); the sequencer grants it (below) with READOK on the
               same FIFO link, i.e. after every SEQ it broadcast earlier; X then reads locally.
               A read at the sequencer is granted the same way and served from its datalet.
  RMW at X:    (INCR, SETNX ...) X -> sequencer SUBMITRMW with the command; the sequencer
               computes it on its datalet, sends X the answer (RMWAT), then sequences the
               resulting PUT/DEL like a SUBMIT. X holds the request and its deadline throughout.

The read rule. Every non-sequencer replica reports its position (AT, after each drained batch
and on the clock) to the sequencer, which so knows `stable`: the highest slot every replica of
the current map has applied. The sequencer grants a read of key k only when the last slot that
wrote k (or emptied the shard) is <= stable; otherwise the read waits for the positions to
catch up (or fails with -TRYAGAIN at write_timeout). Slots applied before this controlet became
sequencer (a failover, a live switch, a catch-up) count as written: the first reads after a
promotion wait until every replica has confirmed that position.

Why linearizable. A write is acknowledged only after every replica applied it, and a read
returns only values whose slots every replica has applied, so anything a client observed -- an
acknowledgement or a value -- is held by every replica of the map. A failover removes replicas
but promotes a survivor, which therefore holds every observed slot whatever its poll of the
others' positions finds (the poll, stream.py, only keeps unobserved slots some survivor has;
dropping those is allowed: their writes were never acknowledged, their outcome is unknown).
Within one map: a read granted at the sequencer when it stands at slot s is ordered at s; the
value of k it returns (at the reader, which has applied exactly up to s by FIFO delivery and the
position check below) is that of k's last write <= s, and k's last write is stable, so no later
failover can make a later read miss it. A write acknowledged before a read is invoked has a
slot < s. Per-key linearizability is enough: the checker, like linearizability itself, is local.
Without the rule a failover could drop a slot already served (tests/kv/test_aasc_reads.py).
Cost: a read of a key written in the last round trip waits about one round trip.

Why not lease-based locks (the paper's lock service): a paused lock holder can still write
after its lease expired. Here there is no lease; instead every message carries the
configuration epoch and the runtime drops other epochs, so a deposed sequencer's slots are
fenced off once the coordinator bumps the epoch.

Gaps: SEQ messages are applied strictly in slot order; a replica that misses one catches up
(stream.py). READOK carries the sequencer's slot: a replica whose own slot differs missed a SEQ,
fails that read with -TRYAGAIN and catches up. A write counts one WACK per replica (a set).

Bounded waits: every write, RMW and read gets its deadline once, on arrival at the replica the
client talks to, and only that replica answers it: -TRYAGAIN once write_timeout has passed AND
no peer was heard for write_timeout (a long queue on a busy host still drains; a silent shard
fails), at 8x write_timeout in any case, when its link to the sequencer gave up, or when the map
changes (take_over fails what waited, it never re-queues).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    PUT,
    RMW,
    RMW_NEEDS_LOCAL,
    TRYAGAIN,
    Action,
    Controlet,
    Fail,
    Read,
    Reply,
    Send,
    StreamFailure,
    stored,
    wire_write,
)
from mlsyskit.tools.kv.controlets.stream import SYNC_KINDS, OrderedStream
from mlsyskit.tools.kv.controlets.undo import failed_message
from mlsyskit.tools.kv.redis import rmw

TIMED_OUT = f"{TRYAGAIN} not acknowledged by every replica in time; a write may still be applied"
LINK_LOST = f"{TRYAGAIN} the link to the sequencer failed; a write may still be applied"
REFUSED = f"{TRYAGAIN} the sequencer is catching up; retry"
OVERLOADED = f"{TRYAGAIN} too many operations waiting for the sequencer; retry"
NOT_STABLE = f"{TRYAGAIN} the key's last write is not yet applied by every replica; retry"


class SequencedActiveActive(OrderedStream):
    name = "aa-sc"
    topology = "aa"
    consistency = "strong"
    STREAM = b"SEQ"
    UNDO = True  # a write that fails on any replica is taken back on all (undo.py)

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.sequencer = self.replicas[0]
        self.next_rid = incarnation << 32
        self.writes: dict[int, tuple[Any, set, float]] = {}  # rid -> (req, replicas that applied, deadline)
        self.reads: dict[int, tuple[Any, float]] = {}  # rid -> (req, deadline): waiting for READOK
        self.timeouts, self.heard = 0, {}  # heard: replica -> the clock when it last spoke to us
        # The sequencer's read rule (module docstring): the others' reported positions, the last
        # slot that wrote each key not yet stable (with its slot order for pruning), the last
        # FLUSH, the position it took the role at, and the reads waiting for stability.
        self.positions_seen: dict[str, int] = {}
        self.last_write: dict[bytes, int] = {}
        self.write_order: deque[tuple[int, bytes]] = deque()
        self.flushed = 0
        self.floor = 0
        self.held: dict[int, tuple[bytes, Any, str | None, Any, float]] = {}  # id -> (key, req, src, rid, deadline)
        self.reported = -1  # a replica: the position it last reported (AT) to the sequencer
        self.prompted: dict[str, int] = {}  # the sequencer: position last sent to a lagging replica
        self.unstable: deque[tuple[int, str, Any]] = deque()  # the sequencer: (slot, origin, rid) not yet stable

    @property
    def slot(self) -> int:
        return self.applied

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @property
    def is_sequencer(self) -> bool:
        return self.node_id == self.sequencer

    @property
    def upstream(self) -> str | None:
        return None if self.is_sequencer else self.sequencer

    def downstream(self) -> Sequence[str]:
        return self.others if self.is_sequencer else ()

    def sync_sources(self) -> Sequence[str]:
        return self.others

    def serves_locally(self, op: str) -> bool:
        return len(self.replicas) == 1  # a shard of one is its own sequencer

    # -- the read rule (sequencer) -------------------------------------------------------
    @property
    def stable(self) -> int:
        """The highest slot every replica of this map has applied (as far as the sequencer knows)."""
        return min([self.applied, *(self.positions_seen.get(n, 0) for n in self.others)])

    def _stable_for(self, key: bytes, stable: int) -> bool:
        return max(self.floor, self.flushed, self.last_write.get(key, 0)) <= stable

    def _grant(self, key: bytes, req: Any, src: str | None, rid: Any) -> list[Action]:
        """A read of `key` (local: req; remote: src's rid): now if its last write is stable, else held."""
        if self._stable_for(key, self.stable):
            return [Read(req)] if src is None else [Send(src, b"READOK", (rid, self.applied))]
        self.next_rid += 1
        self.held[self.next_rid] = (key, req, src, rid, self.now + self.options.write_timeout)
        return self._prompt()

    def _prompt(self) -> list[Action]:
        """A read waits on replicas whose reported position is behind: tell each where the stream
        stands (SEQAT, once per position). FIFO: it arrives after every SEQ sent before it, so a
        replica still behind then has missed one and catches up now, not at the next beacon."""
        out: list[Action] = []
        for n in self.others:
            if self.positions_seen.get(n, 0) < self.applied and self.prompted.get(n) != self.applied:
                self.prompted[n] = self.applied
                out.append(Send(n, b"SEQAT", (self.applied,)))
        return out

    def _release(self) -> list[Action]:
        """Positions moved: forget writes every replica has, grant the held reads that are now stable."""
        stable = self.stable
        self.committed = max(self.committed, stable)  # every replica applied it: final (undo.py)
        while self.unstable and self.unstable[0][0] <= stable:
            self.unstable.popleft()
        while self.write_order and self.write_order[0][0] <= stable:
            slot, key = self.write_order.popleft()
            if self.last_write.get(key) == slot:
                del self.last_write[key]
        out: list[Action] = []  # none while not ready (undoing: the datalet may hold writes being taken back)
        for hid in [h for h, entry in self.held.items() if self.mode == "ready" and self._stable_for(entry[0], stable)]:
            _, req, src, rid, _ = self.held.pop(hid)
            out.append(Read(req) if src is None else Send(src, b"READOK", (rid, self.applied)))
        return out

    def _report(self) -> list[Action]:
        """A replica tells the sequencer its position when it moved (batched: once per drained read)."""
        if self.is_sequencer or not self.ready or self.applied == self.reported:
            return []
        self.reported = self.applied
        return [Send(self.sequencer, b"AT", (self.applied,))]

    def take_over(self, old: Controlet) -> list[Action]:
        out = super().take_over(old)
        self.floor = self.applied  # what was applied before this map: confirmed by every replica first
        return out

    def on_synced(self) -> list[Action]:
        self.floor = self.applied  # a snapshot's keys have no known slots
        return super().on_synced() + self._report()

    def on_position(self, src: str, seq: int) -> list[Action]:
        """The sequencer says where it stands (a beacon, a prompt, a restarted sequencer that caught
        up and knows no positions): report ours again even if it did not move."""
        self.reported = -1
        return self._report()

    # -- client operations -----------------------------------------------------------------
    def on_client(self, req: Any) -> list[Action]:
        refused = self.refuse_if_catching_up(req)
        if refused:
            return refused
        if len(self.writes) + len(self.reads) + len(self.held) >= self.options.max_pending:
            return [Fail(req, OVERLOADED)]
        op = req.op
        delta = None
        if op is RMW:  # computed where the shard's order is decided
            if self.is_sequencer:
                refused = self.resolve(req)
                if refused:
                    return refused
                op, delta = req.op, rmw.delta_of(req.rmw)  # a collection write goes out as its command
            elif self.read_local is None:
                return [Fail(req, RMW_NEEDS_LOCAL)]
        self.next_rid += 1
        rid = self.next_rid
        deadline = self.now + self.options.write_timeout  # set once, here, whatever happens next
        if op is GET or op is EXISTS:
            if self.is_sequencer:
                return self._grant(req.key, req, None, None)
            self.reads[rid] = (req, deadline)
            return [Send(self.sequencer, b"READ", (rid, req.key))]
        self.writes[rid] = (req, set(), deadline)
        if op is RMW:  # at a replica: the sequencer computes it, this replica keeps the deadline
            return [Send(self.sequencer, b"SUBMITRMW", (rid, req.key, getattr(req.rmw, "now_ms", 0),
                                                         getattr(req.rmw, "max_bytes", rmw.MAX_VALUE_BYTES), *req.rmw))]
        code, value = wire_write(req, op, delta)  # FLUSH: code F
        fields = (rid, code, req.key, value if op is PUT or delta is not None else b"")
        if self.is_sequencer:
            return self._sequence(self.node_id, *fields)
        return [Send(self.sequencer, b"SUBMIT", fields)]

    def _sequence(self, origin: str, rid: Any, code: bytes, key: bytes, value: bytes) -> list[Action]:
        """Sequencer: give the write the next slot, apply it here and broadcast it."""
        self.applied += 1
        if code == b"F":
            self.flushed = self.applied
        else:
            self.last_write[key] = self.applied
            self.write_order.append((self.applied, key))
        fields = (self.applied, origin, rid, code, key, value)  # one tuple: the runtime encodes it once
        self.record(fields)  # kept for catch-up by log tail (streamlog.py)
        self.unstable.append((self.applied, origin, rid))
        out: list[Action] = [Send(n, b"SEQ", fields) for n in self.others]
        out[:0] = self._applied(origin, int(rid), code, key, value, self.applied)
        return out

    def _sequence_rmw(self, origin: str, fields: Sequence[Any]) -> list[Action]:
        """Sequencer: compute a replica's read-modify-write here, answer it to the origin, sequence it."""
        rid, key, now_ms, max_bytes = fields[0], fields[1], int(fields[2]), int(fields[3])
        command = rmw.Command(list(fields[4:]), now_ms, max_bytes)
        after, answer = rmw.apply(command, self.read_local(key))
        delta = rmw.delta_of(command)  # every replica computes a collection write from its command
        code, value = (b"R", delta) if delta is not None else (b"P", after) if after is not None else (b"D", b"")
        return [Send(origin, b"RMWAT", (rid, answer))] + self._sequence(origin, rid, code, key, value)

    def _applied(self, origin: str, rid: int, code: bytes, key: bytes, value: bytes, slot: int) -> list[Action]:
        """This replica applies a sequenced write: count it toward the origin's answer."""
        if origin != self.node_id:
            return [stored(code, key, value, None, slot), Send(origin, b"WACK", (rid,))]
        entry = self.writes.get(rid)
        out: list[Action] = [stored(code, key, value, entry[0] if entry else None, slot)]
        return out + self._count_ack(rid, self.node_id)

    def _count_ack(self, rid: int, replica: str) -> list[Action]:
        entry = self.writes.get(rid)
        if entry is None:
            return []
        entry[1].add(replica)
        if len(entry[1]) < len(self.replicas):
            return []
        del self.writes[rid]
        return [Reply(entry[0])]

    def apply_stream(self, src: str, seq: int, fields: Sequence[Any]) -> list[Action]:
        _, origin, rid, code, key, value = fields
        origin = origin.decode() if isinstance(origin, bytes) else origin
        return self._applied(origin, int(rid), code, key, value, seq)

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        self.heard[src] = self.now
        if kind == b"SEQ":
            return self.on_stream(src, fields)
        if kind == b"WACK":
            return self._count_ack(int(fields[0]), src) if src in self.replicas else []
        if kind == b"AT":
            if not self.is_sequencer or src not in self.others:
                return []
            self.positions_seen[src] = int(fields[0])
            return self._release()
        if kind in (b"SUBMIT", b"SUBMITRMW", b"READ") and self.is_sequencer:
            if self.mode != "ready" or (kind == b"SUBMITRMW" and self.read_local is None):
                return [Send(src, b"NACK", (fields[0],))]
            if kind == b"SUBMIT":
                rid, code, key, value = fields
                return self._sequence(src, rid, code, key, value)
            if kind == b"SUBMITRMW":
                return self._sequence_rmw(src, fields)
            if len(self.held) >= self.options.max_pending:
                return [Send(src, b"NACK", (fields[0],))]
            return self._grant(fields[1], None, src, fields[0])
        if kind == b"RMWAT" and src == self.sequencer:
            entry = self.writes.get(int(fields[0]))
            if entry is not None:
                entry[0].reply = bytes(fields[1])  # answered once every replica applied the write
            return []
        if kind == b"READOK" and src == self.sequencer:
            entry = self.reads.pop(int(fields[0]), None)
            if entry is None:
                return []
            if self.mode != "ready" or int(fields[1]) != self.applied:
                self.gaps += self.mode == "ready"  # behind the sequencer: catch up, never serve
                return [Fail(entry[0], REFUSED)] + (self.begin_sync() if self.mode == "ready" else [])
            return [Read(entry[0])]
        if kind == b"NACK" and src == self.sequencer:
            return self._fail_rid(int(fields[0]), REFUSED)
        if kind in SYNC_KINDS:
            return self.on_sync_message(src, kind, fields)
        return []

    def on_quiet(self) -> list[Action]:
        return self._report()

    def _fail_rid(self, rid: int, message: str) -> list[Action]:
        entry = self.writes.pop(rid, None) or self.reads.pop(rid, None)
        return [Fail(entry[0], message)] if entry is not None else []

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        out: list[Action] = []
        wait = self.options.write_timeout  # a write waits on every replica, a read on the sequencer
        silent = [any(now - self.heard.get(r, -wait) >= wait for r in names) for names in (self.others, [self.sequencer])]
        def expired(deadline: float, quiet: bool) -> bool:  # bounded waits (module docstring)
            return deadline <= now and (quiet or deadline + 7 * wait <= now)
        for table, quiet in ((self.writes, silent[0]), (self.reads, silent[1])):
            for rid in [rid for rid, entry in table.items() if expired(entry[-1], quiet)]:
                self.timeouts += 1
                out.append(Fail(table.pop(rid)[0], TIMED_OUT))
        for hid in [h for h, entry in self.held.items() if expired(entry[-1], silent[0])]:
            _, req, src, _, _ = self.held.pop(hid)
            if src is None:  # a remote read is failed by its own replica, on its own deadline
                self.timeouts += 1
                out.append(Fail(req, NOT_STABLE))
        return out + self.tick_sync(now) + self._report()

    def on_link_lost(self, node: str) -> list[Action]:
        if node == self.sequencer:
            self.reported = -1  # the last AT may be lost with the link
        return self.fail_pending(LINK_LOST)

    def fail_pending(self, message: str) -> list[Action]:
        out: list[Action] = [Fail(e[0], message) for e in self.writes.values()]
        out += [Fail(e[0], message) for e in self.reads.values()]
        out += [Fail(e[1], message) for e in self.held.values() if e[2] is None]
        self.writes.clear()
        self.reads.clear()
        self.held.clear()
        return out

    def undo_waiting(self, seq: int, reason: str, skip: Any, rids: Any = ()) -> tuple[list[Action], tuple]:
        """Slots >= seq are taken back: the sequencer names their (origin, rid) in the ROLLBACK and
        forgets their reads' bookkeeping (reads wait until every replica confirms seq - 1 again);
        every replica fails the named writes it holds."""
        carried, self.reported = tuple(rids), -1  # a replica's position moved back: report it again
        if self.is_sequencer:
            carried = tuple(x for s, o, r in self.unstable if s >= seq for x in (o, r))
            self.unstable = deque(e for e in self.unstable if e[0] < seq)
            self.write_order = deque(e for e in self.write_order if e[0] < seq)
            self.last_write = {k: s for k, s in self.last_write.items() if s < seq}
            self.positions_seen = {n: min(p, seq - 1) for n, p in self.positions_seen.items()}
            self.floor = max(self.floor, seq - 1)
        mine = (self.node_id, self.node_id.encode())
        held = [(i, self.writes.pop(int(carried[i + 1]), None)) for i in range(0, len(carried) - 1, 2)
                if carried[i] in mine]
        return [Fail(e[0], failed_message(reason, i == 0)) for i, e in held if e and e[0] is not skip], carried

    def on_apply_failed(self, req: Any) -> list[Action]:
        own = req.req if type(req) is StreamFailure else req  # a client write, answered with the error
        for rid in [rid for rid, entry in self.writes.items() if own is not None and entry[0] is own]:
            del self.writes[rid]
        return [] if own is req and req is not None else super().on_apply_failed(req)

    def state(self) -> dict[str, Any]:
        out = {**super().state(), "role": "sequencer" if self.is_sequencer else "replica",
               "rollbacks": self.rollbacks, "slot": self.applied, "writes_waiting": len(self.writes),
               "reads_waiting": len(self.reads) + len(self.held), "timeouts": self.timeouts}
        return {**out, "stable": self.stable} if self.is_sequencer else out
