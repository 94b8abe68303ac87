"""Failover driven by a backend's live list: what a leading coordinator runs every half heartbeat.

Each `step` feeds the nodes the backend reports live (ZooKeeper: ephemeral znodes) into a
FailureDetector as beats, so a node is failed over only after it has been absent for the
detector's timeout: a session flap shorter than that costs nothing. Every node in the shard map
is watched from the moment this coordinator takes over (a full grace period after a takeover).
"""
from __future__ import annotations

from mlsyskit.core.clock import Clock
from mlsyskit.core.console import log, warn
from mlsyskit.tools.kv.coord.base import Coordinator
from mlsyskit.tools.kv.coord.detector import DetectorConfig, FailureDetector
from mlsyskit.tools.kv.coord.failover import ShardLost
from mlsyskit.tools.kv.coord.orchestrator import fail_over
from mlsyskit.tools.kv.shardmap import ShardMap


class LiveListFailover:
    def __init__(self, coord: Coordinator, clock: Clock, config: DetectorConfig | None = None) -> None:
        self.coord = coord
        self.clock = clock
        self.detector = FailureDetector(config)
        self._watched: set[str] = set()
        self._applied: dict[str, int] = {}

    def takeover(self) -> None:
        """Forget what a previous term saw; give every mapped node a fresh grace period."""
        self.detector = FailureDetector(self.detector.config)
        self._watched = set()
        self._watch_new(self.coord.read_map())

    def _watch_new(self, shard_map: ShardMap | None) -> None:
        if shard_map is None:
            return
        now = self.clock.now()
        failed = set(self.detector.failed())
        for node_id in shard_map.nodes:
            # A failed node back in the map rejoined as a replacement: watched again from now.
            if node_id not in self._watched or node_id in failed:
                self._watched.add(node_id)
                self.detector.watch(node_id, now)

    def step(self) -> ShardMap | None:
        """One round: returns the new map when a failover was committed."""
        self._watch_new(self.coord.read_map())
        now = self.clock.now()
        for node_id in self.coord.live():
            self.detector.beat(node_id, now)
        self._applied.update(self.coord.applied())   # last counts, kept after a node's znode went
        failed = self.detector.expire(now)
        if not failed:
            return None
        warn(f"not live for {self.detector.config.timeout_s:g} s: {', '.join(failed)}")
        try:
            new = fail_over(self.coord, failed, self._applied)
        except ShardLost as e:
            warn(f"cannot fail over: {e}")
            return None
        if new is not None:
            log(f"failover: epoch {new.epoch}, shards {[list(s) for s in new.shards]}")
        return new
