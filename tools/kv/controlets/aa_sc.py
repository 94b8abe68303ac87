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
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    PUT,
    Action,
    Apply,
    Controlet,
    Read,
    Reply,
    Send,
    op_code,
    value_of,
)


class SequencedActiveActive(Controlet):
    name = "aa-sc"
    topology = "aa"
    consistency = "strong"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int) -> None:
        super().__init__(node_id, replicas, epoch)
        self.sequencer = self.replicas[0]
        self.slot = 0  # sequencer: last slot assigned; others: last slot applied
        self.next_rid = 0
        self.writes: dict[int, list] = {}  # rid -> [req, acks still needed]
        self.reads: dict[int, Any] = {}
        self.gaps = 0

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @property
    def is_sequencer(self) -> bool:
        return self.node_id == self.sequencer

    def serves_locally(self, op: str) -> bool:
        return len(self.replicas) == 1  # a shard of one is its own sequencer

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        self.next_rid += 1
        rid = self.next_rid
        if op is GET or op is EXISTS:
            if self.is_sequencer:
                return [Read(req)]
            self.reads[rid] = req
            return [Send(self.sequencer, b"READ", (rid,))]
        self.writes[rid] = [req, len(self.replicas)]
        fields = (rid, op_code(op), req.key, req.value if op is PUT else b"")
        if self.is_sequencer:
            return self._sequence(self.node_id, *fields)
        return [Send(self.sequencer, b"SUBMIT", fields)]

    def _sequence(self, origin: str, rid: Any, code: bytes, key: bytes, value: bytes) -> list[Action]:
        """Sequencer: give the write the next slot, apply it here and broadcast it."""
        self.slot += 1
        fields = (self.slot, origin, rid, code, key, value)  # one tuple: the runtime encodes it once
        out: list[Action] = [Send(n, b"SEQ", fields) for n in self.others]
        out[:0] = self._applied(origin, int(rid), key, value_of(code, value))
        return out

    def _applied(self, origin: str, rid: int, key: bytes, value: bytes | None) -> list[Action]:
        """This replica applies a sequenced write: count it toward the origin's answer."""
        if origin != self.node_id:
            return [Apply(key, value), Send(origin, b"WACK", (rid,))]
        entry = self.writes.get(rid)
        out: list[Action] = [Apply(key, value, entry[0] if entry else None)]
        return out + self._count_ack(rid)

    def _count_ack(self, rid: int) -> list[Action]:
        entry = self.writes.get(rid)
        if entry is None:
            return []
        entry[1] -= 1
        if entry[1] > 0:
            return []
        del self.writes[rid]
        return [Reply(entry[0])]

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"SUBMIT" and self.is_sequencer:
            rid, code, key, value = fields
            return self._sequence(src, rid, code, key, value)
        if kind == b"SEQ" and src == self.sequencer:
            slot, origin, rid, code, key, value = fields
            slot = int(slot)
            if slot != self.slot + 1:
                self.gaps += 1
            self.slot = slot
            origin = origin.decode() if isinstance(origin, bytes) else origin
            return self._applied(origin, int(rid), key, value_of(code, value))
        if kind == b"WACK":
            return self._count_ack(int(fields[0]))
        if kind == b"READ" and self.is_sequencer:
            return [Send(src, b"READOK", (fields[0],))]
        if kind == b"READOK":
            req = self.reads.pop(int(fields[0]), None)
            return [Read(req)] if req is not None else []
        return []

    def state(self) -> dict[str, Any]:
        return {**super().state(), "role": "sequencer" if self.is_sequencer else "replica",
                "slot": self.slot, "writes_waiting": len(self.writes), "reads_waiting": len(self.reads),
                "gaps": self.gaps}
