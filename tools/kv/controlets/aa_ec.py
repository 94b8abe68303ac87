"""`aa-ec`: active-active, eventual consistency by versioned last-writer-wins.

Any replica accepts a write, stamps it with a version (Lamport counter, replica index),
applies it, answers at once and propagates it to the other replicas asynchronously. A
replica applies an incoming write only if its version is greater than the version it holds
for the key. Versions form a total order (ties on the counter are broken by replica index),
so once every write has reached every replica they all hold the value of the greatest
version, whatever order the writes arrived in: deterministic convergence. Deletes leave a
versioned tombstone in the version table so a late, older put cannot resurrect the key
(tombstones are kept for the life of the process; compaction needs a stable cut, which is
the coordinator's job on the roadmap). Reads are local and may be stale.
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


class LastWriterWins(Controlet):
    name = "aa-ec"
    topology = "aa"
    consistency = "eventual"

    def __init__(self, node_id: str, replicas: Sequence[str], epoch: int) -> None:
        super().__init__(node_id, replicas, epoch)
        self.counter = 0
        self.versions: dict[bytes, tuple[int, int]] = {}
        self.stale_dropped = 0

    @staticmethod
    def write_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    @staticmethod
    def read_targets(replicas: Sequence[str]) -> Sequence[str]:
        return replicas

    def serves_locally(self, op: str) -> bool:
        return op is GET or op is EXISTS  # writes always take a version

    def on_client(self, req: Any) -> list[Action]:
        op = req.op
        if op is GET or op is EXISTS:
            return [Read(req)]
        self.counter += 1
        key = req.key
        self.versions[key] = (self.counter, self.index)
        value = req.value if op is PUT else None
        out: list[Action] = [Apply(key, value, req), Reply(req)]
        fields = (self.counter, self.index, op_code(op), key, req.value or b"")
        out.extend(Send(n, b"LWW", fields) for n in self.others)
        return out

    def on_peer(self, src: str, kind: bytes, fields: Sequence[Any]) -> list[Action]:
        if kind != b"LWW":
            return []
        counter, index, code, key, value = int(fields[0]), int(fields[1]), fields[2], fields[3], fields[4]
        if counter > self.counter:
            self.counter = counter
        version = (counter, index)
        if version <= self.versions.get(key, (0, -1)):
            self.stale_dropped += 1
            return []
        self.versions[key] = version
        return [Apply(key, value_of(code, value))]

    def state(self) -> dict[str, Any]:
        return {**super().state(), "role": "replica", "counter": self.counter,
                "versions": len(self.versions), "stale_dropped": self.stale_dropped}
