"""`ms-sc`: master-slave, strong consistency by chain replication (van Renesse & Schneider, OSDI'04).

The shard's replicas form a chain head -> ... -> tail. A write enters at the head, which
applies it, numbers it and passes it down; each node applies and forwards; the tail
acknowledges straight to the head, which then answers the client. Reads are served by the
tail, which has applied exactly the writes that were acknowledged (or are about to be), so
every read sees every acknowledged write: linearizable.

Acks are cumulative, and safe only because the tail's position is contiguous: a replica
applies number n only right after n-1 (stream.py); on any gap it stops and catches up from
a live replica instead of skipping, so "the tail applied n" implies it applied 1..n (or a
snapshot that contains them). Only the tail's acks count. A write that is not acknowledged
within write_timeout fails with -TRYAGAIN (its outcome is unknown: it may still reach the
tail); so does every waiting write when the link to the successor gives up.

Failover (a new map from the coordinator, take_over): the chain without the failed node keeps
every survivor's position. A surviving head keeps its waiting writes: they are answered when
the new tail acknowledges them (it resynchronises from its new predecessor if it missed any),
or at once when the head is now the whole chain; so an acknowledged write is on every
survivor (each replica holds a prefix of its predecessor's stream) and none is answered twice.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    RECONFIGURED,
    RMW,
    TRYAGAIN,
    Action,
    Fail,
    Forward,
    Read,
    Reply,
    Send,
    StreamFailure,
    op_code,
    stored,
    wire_write,
)
from mlsyskit.tools.kv.controlets.batch import BATCH, MIXED, ReplyBatch, batch_apply, has_rmw, origin_batch
from mlsyskit.tools.kv.controlets.stream import SYNC_KINDS, OrderedStream
from mlsyskit.tools.kv.controlets.undo import failed_message
from mlsyskit.tools.kv.redis import rmw

TIMED_OUT = f"{TRYAGAIN} write not acknowledged by the chain tail in time; it may still be applied"
LINK_LOST = f"{TRYAGAIN} the link down the chain failed; the write may still be applied"
OVERLOADED = f"{TRYAGAIN} too many writes waiting for the chain; retry"


class ChainReplication(OrderedStream):
    name = "ms-sc"
    topology = "ms"
    consistency = "strong"
    STREAM = b"CHAIN"
    POLL_ON_PROMOTION = False  # each replica holds a prefix of its predecessor's stream
    UNDO = True  # a write that fails on any replica is taken back on all (undo.py)

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.head = self.replicas[0]
        self.tail = self.replicas[-1]
        self.successor = self.replicas[self.index + 1] if node_id != self.tail else None
        self.predecessor = self.replicas[self.index - 1] if self.index else None
        self.in_flight: deque[tuple[int, Any, float]] = deque()  # head: (seq, req, deadline)
        self.ack_due = 0  # tail: highest applied sequence not yet acknowledged (sent in on_quiet)
        self.timeouts = 0

    @property
    def seq(self) -> int:
        return self.applied

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[:1]

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[-1:]

    @property
    def upstream(self) -> str | None:
        return self.predecessor

    def downstream(self) -> Sequence[str]:
        return (self.successor,) if self.successor else ()

    def sync_sources(self) -> Sequence[str]:
        if self.predecessor is None:  # the head: from the replica nearest to it
            return self.replicas[1:]
        before = self.replicas[:self.index]
        return tuple(reversed(before)) + self.replicas[self.index + 1:]

    def serves_locally(self, op: str) -> bool:
        if op is GET or op is EXISTS:
            return self.node_id == self.tail  # the runtime turns its fast path off while catching up
        return len(self.replicas) == 1

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        if op is GET or op is EXISTS:
            if self.node_id != self.tail:
                return [Forward(req, self.tail)]
            return self.refuse_if_catching_up(req) or [Read(req)]
        if self.node_id != self.head:
            return [Forward(req, self.head)]
        delta = None
        if op is RMW:
            refused = self.refuse_if_catching_up(req) or self.resolve(req)
            if refused:
                return refused
            op, delta = req.op, rmw.delta_of(req.rmw)  # a collection write goes down as its command
        code = op_code(op)
        if self.successor is None:  # a chain of one
            return [stored(code, req.key, req.value, req), Reply(req)]
        refused = self.refuse_if_catching_up(req)
        if refused:
            return refused
        if len(self.in_flight) >= self.options.max_pending:
            return [Fail(req, OVERLOADED)]
        self.applied += 1
        write = stored(code, req.key, req.value, req, self.applied)
        self.in_flight.append((self.applied, req, self.now + self.options.write_timeout))
        wire_code, wire_value = wire_write(req, op, delta)
        fields = (self.applied, wire_code, req.key, wire_value)
        self.record(fields)
        return [write, Send(self.successor, b"CHAIN", fields)]

    def on_client_batch(self, reqs: Sequence[Any]) -> list[Action] | None:
        """Writes a connection pipelined in one read: one numbered chain entry (batch.py); None: the
        runtime submits them one at a time (read-modify-writes the head cannot number together)."""
        mixed = has_rmw(reqs)
        if self.successor is None and len(self.replicas) == 1 and self.mode is self.READY_MODE \
                and not (mixed and self.read_local is None):  # a chain of one: applied and answered, as on_client
            return [origin_batch(0, reqs, 0, self.read_local if mixed else None)[1], ReplyBatch(reqs)]
        if (self.node_id != self.head or self.successor is None or self.mode is not self.READY_MODE
                or len(self.in_flight) + len(reqs) > self.options.max_pending or mixed and self.read_local is None):
            return None if mixed else [a for r in reqs for a in self.on_client(r)]  # one at a time, as ever
        self.applied += 1
        seq, deadline = self.applied, self.now + self.options.write_timeout
        self.in_flight.extend([(seq, r, deadline) for r in reqs])
        fields, apply = origin_batch(seq, reqs, seq, self.read_local if mixed else None)
        self.record(fields)
        return [apply, Send(self.successor, b"CHAIN", fields)]

    def apply_stream(self, src: str, seq: int, fields: Sequence[Any]) -> list[Action]:
        code = fields[1]
        if code == BATCH or code == MIXED:
            if self.successor is None:
                self.ack_due = seq
                return [batch_apply(fields, seq)]
            return [batch_apply(fields, seq), Send(self.successor, b"CHAIN", tuple(fields))]
        key, value = fields[2], fields[3]
        apply = stored(code, key, value, None, seq)
        if self.successor is None:  # acks are cumulative: one per drained read covers them all
            self.ack_due = seq
            return [apply]
        return [apply, Send(self.successor, b"CHAIN", (seq, code, key, value))]

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"CHAIN":
            return self.on_stream(src, fields)
        if kind == b"ACK":
            if src != self.tail or self.node_id != self.head:
                return []  # only the tail's position releases writes
            acked = int(fields[0])
            self.committed = max(self.committed, acked)  # the tail applied it: so did every replica
            in_flight, done = self.in_flight, []
            while in_flight and in_flight[0][0] <= acked:
                done.append(in_flight.popleft()[1])
            return [ReplyBatch(done)] if done else []
        if kind in SYNC_KINDS:
            return self.on_sync_message(src, kind, fields)
        return []

    def on_position(self, src: str, seq: int) -> list[Action]:
        if self.successor is None:
            self.ack_due = seq
        return []

    def on_synced(self) -> list[Action]:
        if self.successor is None and self.applied:
            self.ack_due = self.applied  # the snapshot holds every write up to here
        return super().on_synced()

    def on_quiet(self) -> list[Action]:
        if not self.ack_due or self.mode != "ready":
            return []
        seq, self.ack_due = self.ack_due, 0
        return [Send(self.head, b"ACK", (seq,))]

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        out: list[Action] = []
        while self.in_flight and self.in_flight[0][2] <= now:
            self.timeouts += 1
            out.append(Fail(self.in_flight.popleft()[1], TIMED_OUT))
        return out + self.tick_sync(now)

    def carry_pending(self, old: Any) -> list[Action]:
        if type(old) is not type(self) or old.node_id != old.head or self.node_id != self.head:
            return old.fail_pending(RECONFIGURED)
        self.in_flight, self.timeouts = old.in_flight, old.timeouts
        if self.successor is not None:
            return []
        out: list[Action] = [Reply(req) for _, req, _ in self.in_flight]  # the whole chain is this node now
        self.in_flight = deque()
        return out

    def on_link_lost(self, node: str) -> list[Action]:
        return self.fail_pending(LINK_LOST) if node == self.successor else []

    def fail_pending(self, message: str) -> list[Action]:
        out: list[Action] = [Fail(req, message) for _, req, _ in self.in_flight]
        self.in_flight.clear()
        self.ack_due = 0
        return out

    def undo_waiting(self, seq: int, reason: str, skip: Any, rids: Any = ()) -> tuple[list[Action], tuple]:
        """Writes numbered >= seq are taken back: the head fails those it holds; the tail acks none."""
        out: list[Action] = [Fail(r, failed_message(reason, s == seq)) for s, r, _ in self.in_flight
                             if s >= seq and r is not skip]
        self.in_flight = deque(e for e in self.in_flight if e[0] < seq)
        self.ack_due = min(self.ack_due, seq - 1) if self.ack_due else 0
        return out, ()

    def on_apply_failed(self, req: Any) -> list[Action]:
        if req is not None and type(req) is not StreamFailure:  # the head's own apply: answered already
            self.in_flight = deque(e for e in self.in_flight if e[1] is not req)
            return []
        return super().on_apply_failed(req)

    def state(self) -> dict[str, Any]:
        role = "head" if self.node_id == self.head else "tail" if self.node_id == self.tail else "middle"
        if len(self.replicas) == 1:
            role = "head+tail"
        return {**super().state(), "role": role, "seq": self.applied, "in_flight": len(self.in_flight),
                "timeouts": self.timeouts, "rollbacks": self.rollbacks, "era": self.era}
