"""The embedded coordinator backend: shard map, epoch history and membership in SQLite (core storage).

State lives in `<state_dir>/coord.db` (MetaStore, WAL): the map under ("coord", "map"), every
map ever stored in the "epochs" log, members under namespace "members". Compare-and-set runs in
one BEGIN IMMEDIATE transaction, so it is atomic across processes sharing the directory and
survives kill -9 (a restarted coordinator reads the same epoch back).

Liveness is heartbeat-based (FailureDetector on the injected clock) and held in memory by the
leading coordinator: after a restart or takeover every member gets a fresh grace period.

Leader election is a SQLite lock: the leader holds an exclusive transaction on
`<state_dir>/leader.db`; the kernel drops that lock when the process dies (even by kill -9),
so a standby polling for it takes over. One host only, as SQLite locking is.
"""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.storage import MetaStore
from mlsyskit.tools.kv.coord.base import Coordinator, EpochConflict, check_successor
from mlsyskit.tools.kv.coord.detector import DetectorConfig, FailureDetector
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

POLL_S = 0.05  # how often a standby retries the leader lock


class EmbeddedCoordinator(Coordinator):
    def __init__(self, state_dir: str | Path, *, clock: Clock | None = None,
                 detector: DetectorConfig | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.clock = clock or RealClock()
        self.store = MetaStore(self.state_dir / "coord.db", synchronous="FULL")
        self.detector = FailureDetector(detector)
        self.progress: dict[str, int] = {}   # node -> applied writes, from heartbeats (memory only)
        self._lock = threading.RLock()
        self._leader_db: sqlite3.Connection | None = None
        self._candidate: str | None = None
        now = self.clock.now()
        for node_id in self.members():
            self.detector.watch(node_id, now)

    # -- shard map ------------------------------------------------------------------------------
    def read_map(self) -> ShardMap | None:
        d = self.store.get("coord", "map", None)
        return None if d is None else ShardMap.from_dict(d)

    def initialize(self, shard_map: ShardMap) -> ShardMap:
        with self._lock, self.store.transaction():
            current = self.read_map()
            if current is not None:
                return current
            self._write(shard_map)
        for node in shard_map.nodes.values():
            self.register(node)
        return shard_map

    def compare_and_set(self, expected_epoch: int, new_map: ShardMap) -> ShardMap:
        check_successor(expected_epoch, new_map)
        with self._lock, self.store.transaction():
            current = self.read_map()
            stored = None if current is None else current.epoch
            if stored != expected_epoch:
                raise EpochConflict(expected_epoch, stored)
            self._write(new_map)
        return new_map

    def _write(self, shard_map: ShardMap) -> None:
        self.store.put("coord", "map", shard_map.to_dict())
        self.store.append("epochs", shard_map.to_dict())

    def history(self) -> list[ShardMap]:
        """Every map stored, oldest first."""
        return [ShardMap.from_dict(d) for _, d in self.store.read_log("epochs")]

    # -- membership and liveness ----------------------------------------------------------------
    def register(self, node: NodeAddr) -> None:
        with self._lock:
            self.store.put("members", node.node_id, {"host": node.host, "port": node.port})
            self.detector.watch(node.node_id, self.clock.now())

    def members(self) -> dict[str, NodeAddr]:
        return {n: NodeAddr(n, a["host"], int(a["port"])) for n, a in self.store.items("members")}

    def heartbeat(self, node_id: str, applied: int | None = None) -> bool:
        """False when the node is unknown or was deposed (failed and removed from the map: it must
        rejoin). A failed node that is still in the map (its shard could not fail over) is watched
        again. `applied` is the node's count of applied writes, used to pick an ms-ec master."""
        with self._lock:
            if self.store.get("members", node_id, None) is None:
                return False
            now = self.clock.now()
            if not self.detector.beat(node_id, now):
                current = self.read_map()
                if current is None or node_id not in current.nodes:
                    return False
                self.detector.watch(node_id, now)
            if applied is not None:
                self.progress[node_id] = applied
            return True

    def applied(self) -> dict[str, int]:
        with self._lock:
            return dict(self.progress)

    def live(self) -> list[str]:
        with self._lock:
            return self.detector.alive(self.clock.now())

    def expire(self) -> list[str]:
        """Members that just missed their heartbeats (each reported once)."""
        with self._lock:
            return self.detector.expire(self.clock.now())

    # -- leader election ------------------------------------------------------------------------
    def _try_lock(self) -> bool:
        db = sqlite3.connect(self.state_dir / "leader.db", isolation_level=None, timeout=0,
                             check_same_thread=False)
        try:
            db.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError:
            db.close()
            return False
        self._leader_db = db
        return True

    def campaign(self, candidate: str, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else self.clock.now() + timeout_s
        with self._lock:
            if self._leader_db is not None:
                return True
        while True:
            with self._lock:
                if self._try_lock():
                    self._candidate = candidate
                    self.store.put("coord", "leader", candidate)
                    now = self.clock.now()
                    for node_id in self.members():   # a fresh grace period under the new leader
                        self.detector.watch(node_id, now)
                    return True
            if deadline is not None and self.clock.now() >= deadline:
                return False
            self.clock.sleep(POLL_S)

    def is_leader(self) -> bool:
        return self._leader_db is not None

    def leader(self) -> str | None:
        return self.store.get("coord", "leader", None)

    def resign(self) -> None:
        with self._lock:
            if self._leader_db is not None:
                if self.leader() == self._candidate:
                    self.store.delete("coord", "leader")
                self._leader_db.close()   # closing drops the lock (the transaction rolls back)
                self._leader_db = None

    def close(self) -> None:
        self.resign()
        self.store.close()
