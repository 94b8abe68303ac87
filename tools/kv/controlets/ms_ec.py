"""`ms-ec`: master-slave, eventual consistency by asynchronous primary-backup.

The master (first replica) applies a write, answers at once, and streams the write to the
slaves in commit order (numbered, over FIFO links), so every slave applies the same
sequence and converges to the master's state. Reads are served by any replica and may be
stale by the replication lag. Writes reaching a slave are forwarded to the master.
A slave that misses a number (a link gave up, it restarted) does not skip it: it catches
up from the master (stream.py) and serves nothing until it has.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    GET,
    RMW,
    Action,
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
from mlsyskit.tools.kv.redis import rmw


class AsyncPrimaryBackup(OrderedStream):
    name = "ms-ec"
    topology = "ms"
    consistency = "eventual"
    STREAM = b"REPL"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int, options: Any = None,
                 incarnation: int = 0) -> None:
        super().__init__(node_id, replicas, epoch, options, incarnation)
        self.master = self.replicas[0]

    @property
    def seq(self) -> int:
        return self.applied

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas[:1]

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @property
    def upstream(self) -> str | None:
        return None if self.node_id == self.master else self.master

    def downstream(self) -> Sequence[str]:
        return self.others if self.node_id == self.master else ()

    def sync_sources(self) -> Sequence[str]:
        return self.others  # the master first for a slave; the slaves in order for the master

    def serves_locally(self, op: str) -> bool:
        return op is GET or op is EXISTS or len(self.replicas) == 1

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        if op is GET or op is EXISTS:
            return self.refuse_if_catching_up(req) or [Read(req)]
        if self.node_id != self.master:
            return [Forward(req, self.master)]
        refused = self.refuse_if_catching_up(req) or (self.resolve(req) if op is RMW else None)
        if refused:
            return refused
        delta = rmw.delta_of(req.rmw) if op is RMW else None  # a collection write goes out as its command
        op = req.op
        self.applied += 1
        out: list[Action] = [stored(op_code(op), req.key, req.value, req), Reply(req)]
        wire_code, wire_value = wire_write(req, op, delta)
        fields = (self.applied, wire_code, req.key, wire_value)
        self.record(fields)
        out.extend(Send(n, b"REPL", fields) for n in self.others)
        return out

    def on_client_batch(self, reqs: Sequence[Any]) -> list[Action] | None:
        """Writes a connection pipelined in one read: one numbered stream entry (batch.py); None: the
        runtime submits them one at a time (read-modify-writes the master cannot number together)."""
        mixed = has_rmw(reqs)
        if self.node_id != self.master or self.mode is not self.READY_MODE or mixed and self.read_local is None:
            return None if mixed else [a for r in reqs for a in self.on_client(r)]  # one at a time, as ever
        self.applied += 1
        fields, apply = origin_batch(self.applied, reqs, 0, self.read_local if mixed else None)
        self.record(fields)
        # Applied and answered together: a write that fails is answered with its error instead
        # (the interpreter skips the requests of a failed write), the others with OK.
        out: list[Action] = [apply, ReplyBatch(reqs)]
        out.extend(Send(n, b"REPL", fields) for n in self.others)
        return out

    def apply_stream(self, src: str, seq: int, fields: Sequence[Any]) -> list[Action]:
        if fields[1] == BATCH or fields[1] == MIXED:
            return [batch_apply(fields, 0)]
        return [stored(fields[1], fields[2], fields[3])]

    def on_apply_failed(self, req: Any) -> list[Action]:
        """The master's datalet refused a write that it numbered and recorded but did not send (its
        Sends were dropped): its log no longer matches its state, so a replica that finds the gap
        copies a snapshot instead of replaying a tail that holds the failed write."""
        if self.upstream is None and type(req) is StreamFailure and req.req is not None:
            self.history.forget(self.applied)
        return super().on_apply_failed(req)

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind == b"REPL":
            return self.on_stream(src, fields)
        if kind in SYNC_KINDS:
            return self.on_sync_message(src, kind, fields)
        return []

    def on_tick(self, now: float) -> list[Action]:
        self.now = now
        return self.tick_sync(now)

    def fail_pending(self, message: str) -> list[Action]:
        return []  # the master answers at once: nothing waits on peers

    def state(self) -> dict[str, Any]:
        role = "master" if self.node_id == self.master else "slave"
        return {**super().state(), "role": role, "seq": self.applied}
