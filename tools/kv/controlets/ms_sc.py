"""`ms-sc`: master-slave, strong consistency by chain replication (van Renesse & Schneider, OSDI'04).

The shard's replicas form a chain head -> ... -> tail. A write enters at the head, which
applies it, numbers it and passes it down; each node applies and forwards; the tail
acknowledges straight to the head, which then answers the client. Reads are served by the
tail, which has applied exactly the writes that were acknowledged (or are about to be), so
every read sees every acknowledged write: linearizable. Acks are cumulative because links
are FIFO: the tail acks sequence n only after every earlier write.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    PUT,
    Action,
    Apply,
    Controlet,
    Forward,
    Read,
    Reply,
    Send,
    op_code,
    value_of,
)


class ChainReplication(Controlet):
    name = "ms-sc"
    topology = "ms"
    consistency = "strong"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int) -> None:
        super().__init__(node_id, replicas, epoch)
        self.head = self.replicas[0]
        self.tail = self.replicas[-1]
        self.successor = self.replicas[self.index + 1] if node_id != self.tail else None
        self.seq = 0  # head: last number assigned; others: last number applied
        self.in_flight: deque[tuple[int, Any]] = deque()  # head: (seq, req) awaiting the tail's ack
        self.gaps = 0
        self.ack_due = 0  # tail: highest applied sequence not yet acknowledged (sent in on_quiet)

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[:1]

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[-1:]

    def serves_locally(self, op: str) -> bool:
        if op is GET or op is EXISTS:
            return self.node_id == self.tail
        return len(self.replicas) == 1

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        if op is GET or op is EXISTS:
            return [Read(req)] if self.node_id == self.tail else [Forward(req, self.tail)]
        if self.node_id != self.head:
            return [Forward(req, self.head)]
        value = req.value if op is PUT else None
        if self.successor is None:  # a chain of one
            return [Apply(req.key, value, req), Reply(req)]
        self.seq += 1
        self.in_flight.append((self.seq, req))
        return [Apply(req.key, value, req),
                Send(self.successor, b"CHAIN", (self.seq, op_code(op), req.key, req.value or b""))]

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"CHAIN":
            seq, code, key, value = int(fields[0]), fields[1], fields[2], fields[3]
            if seq != self.seq + 1:
                self.gaps += 1  # a lost link; catch-up from export/import is the coordinator's job
            self.seq = seq
            apply = Apply(key, value_of(code, value))
            if self.successor is None:  # acks are cumulative: one per drained read covers them all
                self.ack_due = seq
                return [apply]
            return [apply, Send(self.successor, b"CHAIN", (seq, code, key, value))]
        if kind == b"ACK":
            acked = int(fields[0])
            out: list[Action] = []
            while self.in_flight and self.in_flight[0][0] <= acked:
                out.append(Reply(self.in_flight.popleft()[1]))
            return out
        return []

    def on_quiet(self) -> list[Action]:
        if not self.ack_due:
            return []
        seq, self.ack_due = self.ack_due, 0
        return [Send(self.head, b"ACK", (seq,))]

    def state(self) -> dict[str, Any]:
        role = "head" if self.node_id == self.head else "tail" if self.node_id == self.tail else "middle"
        if len(self.replicas) == 1:
            role = "head+tail"
        return {**super().state(), "role": role, "seq": self.seq, "in_flight": len(self.in_flight),
                "gaps": self.gaps}
