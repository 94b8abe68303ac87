"""`aa-sc`: active-active, strong consistency by per-shard sequencing.

Any replica accepts reads and writes, but every operation on the shard is ordered by one
sequencer (the shard's first replica) -- a total order per shard, not a lock:

  write at X:  X -> sequencer SUBMIT; the sequencer assigns the next slot, applies it and
               broadcasts SEQ(slot) to every other replica; each applies in slot order and
               acks the origin X; X answers once all R replicas have applied it.
  read at X:   X -> sequencer READ; the sequencer answers READOK on the same FIFO link, i.e.
               after every SEQ it broadcast earlier; X then reads locally. The sequencer
               itself reads locally at once.

Why linearizable: a write is acknowledged only after every replica applied it, so a read
invoked later is ordered after it by the sequencer and, by FIFO delivery, the reader has
applied it. A write becomes visible at a replica no earlier than its slot, and a read that
saw it is ordered before any later read's READOK, which is sent after the same SEQ.
Why not lease-based locks (the paper's lock service): a paused lock holder can still write
after its lease expired. Here there is no lease; instead every message carries the
configuration epoch and the runtime drops other epochs, so a deposed sequencer's slots are
fenced off once the coordinator bumps the epoch.

Gaps: SEQ messages are applied strictly in slot order; a replica that misses one catches up
from the sequencer (stream.py) instead of skipping. READOK carries the sequencer's slot, and
a replica whose own slot differs has missed a SEQ: it fails that read with -TRYAGAIN and
catches up, so a read is never served from a replica that is behind. A write counts one
WACK per replica (a set, so no replica counts twice); writes and reads that wait past
write_timeout, or whose link to the sequencer gave up, fail with -TRYAGAIN.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    PUT,
    RMW,
    TRYAGAIN,
    Action,
    Fail,
    Forward,
    Read,
    Reply,
    Send,
    op_code,
    stored,
)
from mlsyskit.tools.kv.controlets.stream import SYNC_KINDS, OrderedStream

TIMED_OUT = f"{TRYAGAIN} not acknowledged by every replica in time; a write may still be applied"
LINK_LOST = f"{TRYAGAIN} the link to the sequencer failed; a write may still be applied"
REFUSED = f"{TRYAGAIN} the sequencer is catching up; retry"
OVERLOADED = f"{TRYAGAIN} too many operations waiting for the sequencer; retry"


class SequencedActiveActive(OrderedStream):
    name = "aa-sc"
    topology = "aa"
    consistency = "strong"
    STREAM = b"SEQ"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.sequencer = self.replicas[0]
        self.next_rid = incarnation << 32
        self.writes: dict[int, tuple[Any, set, float]] = {}  # rid -> (req, replicas that applied, deadline)
        self.reads: dict[int, tuple[Any, float]] = {}  # rid -> (req, deadline)
        self.timeouts = 0

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

    def on_client(self, req: Any) -> list[Action]:
        refused = self.refuse_if_catching_up(req)
        if refused:
            return refused
        if len(self.writes) + len(self.reads) >= self.options.max_pending:
            return [Fail(req, OVERLOADED)]
        op = req.op
        if op is RMW:  # computed where the shard's order is decided
            if not self.is_sequencer:
                return [Forward(req, self.sequencer)]
            refused = self.resolve(req)
            if refused:
                return refused
            op = req.op
        self.next_rid += 1
        rid = self.next_rid
        deadline = self.now + self.options.write_timeout
        if op is GET or op is EXISTS:
            if self.is_sequencer:
                return [Read(req)]
            self.reads[rid] = (req, deadline)
            return [Send(self.sequencer, b"READ", (rid,))]
        self.writes[rid] = (req, set(), deadline)
        fields = (rid, op_code(op), req.key, req.value if op is PUT else b"")  # FLUSH: code F
        if self.is_sequencer:
            return self._sequence(self.node_id, *fields)
        return [Send(self.sequencer, b"SUBMIT", fields)]

    def _sequence(self, origin: str, rid: Any, code: bytes, key: bytes, value: bytes) -> list[Action]:
        """Sequencer: give the write the next slot, apply it here and broadcast it."""
        self.applied += 1
        fields = (self.applied, origin, rid, code, key, value)  # one tuple: the runtime encodes it once
        out: list[Action] = [Send(n, b"SEQ", fields) for n in self.others]
        out[:0] = self._applied(origin, int(rid), code, key, value)
        return out

    def _applied(self, origin: str, rid: int, code: bytes, key: bytes, value: bytes) -> list[Action]:
        """This replica applies a sequenced write: count it toward the origin's answer."""
        if origin != self.node_id:
            return [stored(code, key, value), Send(origin, b"WACK", (rid,))]
        entry = self.writes.get(rid)
        out: list[Action] = [stored(code, key, value, entry[0] if entry else None)]
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
        return self._applied(origin, int(rid), code, key, value)

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"SEQ":
            return self.on_stream(src, fields)
        if kind == b"WACK":
            return self._count_ack(int(fields[0]), src) if src in self.replicas else []
        if kind == b"SUBMIT" and self.is_sequencer:
            if self.mode != "ready":
                return [Send(src, b"NACK", (fields[0],))]
            rid, code, key, value = fields
            return self._sequence(src, rid, code, key, value)
        if kind == b"READ" and self.is_sequencer:
            if self.mode != "ready":
                return [Send(src, b"NACK", (fields[0],))]
            return [Send(src, b"READOK", (fields[0], self.applied))]
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

    def _fail_rid(self, rid: int, message: str) -> list[Action]:
        entry = self.writes.pop(rid, None) or self.reads.pop(rid, None)
        return [Fail(entry[0], message)] if entry is not None else []

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        out: list[Action] = []
        for table in (self.writes, self.reads):
            expired = [rid for rid, entry in table.items() if entry[-1] <= now]
            for rid in expired:
                self.timeouts += 1
                out.append(Fail(table.pop(rid)[0], TIMED_OUT))
        return out + self.tick_sync(now)

    def on_link_lost(self, node: str) -> list[Action]:
        return self.fail_pending(LINK_LOST)

    def fail_pending(self, message: str) -> list[Action]:
        out: list[Action] = [Fail(e[0], message) for e in self.writes.values()]
        out += [Fail(e[0], message) for e in self.reads.values()]
        self.writes.clear()
        self.reads.clear()
        return out

    def on_apply_failed(self, req: Any) -> list[Action]:
        if req is not None:
            for rid, entry in list(self.writes.items()):
                if entry[0] is req:
                    del self.writes[rid]
            return []
        return super().on_apply_failed(req)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "role": "sequencer" if self.is_sequencer else "replica",
                "slot": self.applied, "writes_waiting": len(self.writes),
                "reads_waiting": len(self.reads), "timeouts": self.timeouts}
