"""Pure failover planning and the fencing rule: shard maps in, shard maps (or verdicts) out.

Every plan returns a new ShardMap with the epoch bumped by one, so any node still acting on the
old map is fenced off by `admit`. The replica tuple of a shard is in role order, which gives
each mode its failover by removing the failed node and keeping the survivors' order:

    ms-sc  chain head -> ... -> tail: a failed middle is skipped, a failed tail is replaced by its
           predecessor, a failed head by its successor.
    ms-ec  replicas[0] is the master: when it fails, the surviving replica that applied the most
           (from `progress`, ties to role order) is promoted; the others follow in role order.
    aa-sc  replicas[0] is the sequencer: the failed replica leaves the set and, if it was the
           sequencer, the role moves to the next survivor.
    aa-ec  the failed replica leaves the replica set.

A shard whose replicas have all failed cannot be planned around: `ShardLost` is raised and the
map is left as it is (an operator must restore the data; nothing is silently emptied).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from enum import Enum

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

MODES = ("ms-sc", "ms-ec", "aa-sc", "aa-ec")


class ShardLost(RuntimeFailure):
    """Every replica of a shard failed: no survivor can take a role."""


class PlanError(UsageError):
    """The requested change does not fit the map (unknown node, duplicate id, unknown mode)."""


def _check_mode(shard_map: ShardMap) -> str:
    if shard_map.controlet not in MODES:
        raise PlanError(f"unknown controlet {shard_map.controlet!r}; known: {', '.join(MODES)}")
    return shard_map.controlet


def plan_failover(shard_map: ShardMap, failed: Iterable[str],
                  progress: Mapping[str, int] | None = None) -> ShardMap:
    """The next map after `failed` nodes died: they leave every shard and the node table; epoch + 1.

    `progress` (ms-ec only) is each replica's count of applied writes, used to pick the new master.
    """
    mode = _check_mode(shard_map)
    gone = set(failed)
    unknown = sorted(gone - set(shard_map.nodes))
    if unknown:
        raise PlanError(f"not in the shard map (epoch {shard_map.epoch}): {', '.join(unknown)}")
    shards = []
    for index, replicas in enumerate(shard_map.shards):
        survivors = [n for n in replicas if n not in gone]
        if not survivors:
            raise ShardLost(f"shard {index}: every replica failed ({', '.join(replicas)}); "
                            "no survivor can take over")
        if mode == "ms-ec" and replicas[0] in gone and progress:
            best = max(survivors, key=lambda n: (progress.get(n, -1), -survivors.index(n)))
            survivors.remove(best)
            survivors.insert(0, best)
        shards.append(tuple(survivors))
    nodes = {n: a for n, a in shard_map.nodes.items() if n not in gone}
    return replace(shard_map, epoch=shard_map.epoch + 1, shards=tuple(shards), nodes=nodes)


def plan_join(shard_map: ShardMap, shard: int, node: NodeAddr) -> ShardMap:
    """The next map once a replacement node has caught up: it joins shard `shard`; epoch + 1.

    It joins last in role order in every mode: the new tail of an ms-sc chain (the old tail keeps
    serving reads until the new map is in force), a replica behind the master in ms-ec, one more
    replica (never the sequencer) in aa-*.
    """
    _check_mode(shard_map)
    if not 0 <= shard < len(shard_map.shards):
        raise PlanError(f"no shard {shard}: the map has {len(shard_map.shards)}")
    if node.node_id in shard_map.nodes:
        raise PlanError(f"node id {node.node_id!r} is already in the shard map; a replacement needs a new id")
    shards = tuple(reps + (node.node_id,) if i == shard else reps for i, reps in enumerate(shard_map.shards))
    nodes = dict(shard_map.nodes)
    nodes[node.node_id] = node
    return replace(shard_map, epoch=shard_map.epoch + 1, shards=shards, nodes=nodes)


# Live switches keep the data where it is. ms-sc, ms-ec and aa-sc number one stream from replicas[0],
# so positions carry over; a switch into aa-ec aligns the replicas' unversioned state first
# (controlets/aa_ec_entry.py), a switch out of it gathers every replica's newer versions at the new
# origin first (controlets/aa_ec_exit.py). All 12 transitions among the four modes.
def plan_switch(shard_map: ShardMap, controlet: str) -> ShardMap:
    """The same replicas and data under another controlet (topology x consistency); epoch + 1."""
    current = _check_mode(shard_map)
    if controlet not in MODES:
        raise PlanError(f"unknown controlet {controlet!r}; one of {', '.join(MODES)}")
    if controlet == current:
        raise PlanError(f"the cluster already runs {controlet}")
    return replace(shard_map, epoch=shard_map.epoch + 1, controlet=controlet)


class Admit(Enum):
    """What a node does with a request stamped with a configuration epoch."""

    ACCEPT = "accept"          # same epoch, and the node is still in the map
    STALE_SENDER = "stale"     # the sender's epoch is older: reject; it must refresh its shard map
    REFRESH_SELF = "refresh"   # the sender's epoch is newer: this node must fetch the map before acting
    DEPOSED = "deposed"        # this node is not in its own (current) map: refuse everything


def admit(request_epoch: int, node_id: str, node_map: ShardMap) -> Admit:
    """The fencing rule. A deposed head or tail learns of its removal by a newer epoch (REFRESH_SELF),
    then finds itself absent from the new map (DEPOSED): it neither accepts writes nor serves reads."""
    if node_id not in node_map.nodes:
        return Admit.DEPOSED
    if request_epoch < node_map.epoch:
        return Admit.STALE_SENDER
    if request_epoch > node_map.epoch:
        return Admit.REFRESH_SELF
    return Admit.ACCEPT


def roles(shard_map: ShardMap, shard: int) -> dict[str, str]:
    """Role names of a shard's nodes, for status output and tests."""
    replicas = shard_map.shards[shard]
    mode = _check_mode(shard_map)
    if mode == "ms-sc":
        if len(replicas) == 1:
            return {replicas[0]: "head+tail"}
        named = {n: "middle" for n in replicas[1:-1]}
        return {replicas[0]: "head", **named, replicas[-1]: "tail"}
    if mode == "ms-ec":
        return {n: ("master" if i == 0 else "replica") for i, n in enumerate(replicas)}
    if mode == "aa-sc":
        return {n: ("sequencer" if i == 0 else "replica") for i, n in enumerate(replicas)}
    return {n: "replica" for n in replicas}
