"""Turning detected failures and finished catch-ups into committed shard maps, on any Coordinator backend.

Read the map, plan (failover.py, pure), compare-and-set; on EpochConflict someone else moved the
map on, so re-read and re-plan (a failure the other change already handled is then a no-op).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlsyskit.tools.kv.coord.base import Coordinator, EpochConflict
from mlsyskit.tools.kv.coord.failover import plan_failover, plan_join
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

ATTEMPTS = 5


def fail_over(coord: Coordinator, failed: Iterable[str],
              progress: Mapping[str, int] | None = None) -> ShardMap | None:
    """Commit the map without `failed`; None if none of them is in the current map (nothing to do).
    Raises ShardLost when a shard would have no replica left (the map is not changed)."""
    wanted = set(failed)
    for _ in range(ATTEMPTS):
        current = coord.read_map()
        if current is None:
            return None
        in_map = sorted(wanted & set(current.nodes))
        if not in_map:
            return None
        try:
            return coord.compare_and_set(current.epoch, plan_failover(current, in_map, progress))
        except EpochConflict:
            continue
    raise EpochConflict(-1, None)


def join(coord: Coordinator, shard: int, node: NodeAddr) -> ShardMap:
    """Commit the map with a caught-up replacement `node` added to `shard`."""
    for _ in range(ATTEMPTS):
        current = coord.read_map()
        if current is None:
            raise EpochConflict(0, None)
        try:
            new = coord.compare_and_set(current.epoch, plan_join(current, shard, node))
        except EpochConflict:
            continue
        coord.register(node)
        return new
    raise EpochConflict(-1, None)
