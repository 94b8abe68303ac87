"""`ms-ec`: master-slave, eventual consistency by asynchronous primary-backup.

The master (first replica) applies a write, answers at once, and streams the write to the
slaves in commit order (numbered, over FIFO links), so every slave applies the same
sequence and converges to the master's state. Reads are served by any replica and may be
stale by the replication lag. Writes reaching a slave are forwarded to the master.
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
    Forward,
    Read,
    Reply,
    Send,
    op_code,
    value_of,
)


class AsyncPrimaryBackup(Controlet):
    name = "ms-ec"
    topology = "ms"
    consistency = "eventual"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int) -> None:
        super().__init__(node_id, replicas, epoch)
        self.master = self.replicas[0]
        self.seq = 0
        self.gaps = 0

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[:1]

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    def serves_locally(self, op: str) -> bool:
        return op is GET or op is EXISTS or len(self.replicas) == 1

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        if op is GET or op is EXISTS:
            return [Read(req)]
        if self.node_id != self.master:
            return [Forward(req, self.master)]
        self.seq += 1
        value = req.value if op is PUT else None
        out: list[Action] = [Apply(req.key, value, req), Reply(req)]
        fields = (self.seq, op_code(op), req.key, req.value or b"")
        out.extend(Send(n, b"REPL", fields) for n in self.others)
        return out

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind != b"REPL" or src != self.master:
            return []
        seq, code, key, value = int(fields[0]), fields[1], fields[2], fields[3]
        if seq != self.seq + 1:
            self.gaps += 1
        self.seq = seq
        return [Apply(key, value_of(code, value))]

    def state(self) -> dict[str, Any]:
        role = "master" if self.node_id == self.master else "slave"
        return {**super().state(), "role": role, "seq": self.seq, "gaps": self.gaps}
