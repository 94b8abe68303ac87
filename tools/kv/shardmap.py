"""Sharding by Redis Cluster hash slots, and the cluster's shard map.

A key's slot is CRC16 (XMODEM, as Redis Cluster computes it) of the key mod 16384, or of the part
between the first `{` and the next `}` when that part is not empty (a hash tag: `{user1}.a` and
`{user1}.b` share a slot and so a shard). Each shard owns one or more contiguous slot ranges; by
default the 16384 slots are split into equal contiguous ranges in shard order, which is what
`CLUSTER SLOTS` reports (frontend/cluster.py), so a Redis Cluster client and a node agree on the
owner of every key. bespokv never moves slots between shards (the shard count is fixed for a
cluster's life), so the ranges change only with a map that says so; no `ASK` redirect ever arises.
(Before issue 22 keys were placed on a blake2b ring: a multi-shard cluster's data written by such
a version is found on other shards now and must be reloaded.)

The shard map is plain data (JSON on the wire and on disk): the configuration epoch, the
controlet and datalet names, each shard's replicas in role order, each shard's slot ranges and
each node's address.
"""
from __future__ import annotations

import hashlib
import json
from binascii import crc_hqx
from dataclasses import dataclass, field

from mlsyskit.core.config import ConfigError, require

SLOTS = 16384
# How long the proxy, a forwarding node and the smart client hold a request whose shard is getting a
# new write point (node/ridethrough.py, client/mapfollow.py): a kill -9 is detected within 5 s
# (8 missed heartbeats of 0.5 s), then the new map is committed, fetched and taken over.
RIDE_THROUGH_S = 10.0
SlotRanges = tuple[tuple[int, int], ...]  # inclusive (first, last) slot ranges of one shard


def hash64(data: bytes) -> int:
    """A stable 64-bit hash (blake2b; Python's hash() changes per process): digests, buckets, RNG seeds."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_slot(key: bytes) -> int:
    """Redis Cluster's slot of a key: CRC16-XMODEM of the key (or of its non-empty {hash tag}) mod 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc_hqx(key, 0) & (SLOTS - 1)


def even_slots(shards: int) -> tuple[SlotRanges, ...]:
    """The 16384 slots in `shards` contiguous ranges of equal size (+-1), in shard order: the split
    `redis-cli --cluster create` makes for as many masters (0-5460, 5461-10922, 10923-16383 for 3)."""
    require(1 <= shards <= 255, f"need 1..255 shards, got {shards}")
    per, first, out = SLOTS / shards, 0, []
    for i in range(shards):
        last = SLOTS - 1 if i == shards - 1 else max(first, int(i * per + per - 1 + 0.5))
        out.append(((first, last),))
        first = last + 1
    return tuple(out)


def slot_owners(slots: tuple[SlotRanges, ...]) -> bytes:
    """slot -> shard index as one byte per slot; every slot must be owned exactly once."""
    require(len(slots) <= 255, "at most 255 shards")
    owner = bytearray(b"\xff" * SLOTS)
    for shard, ranges in enumerate(slots):
        for first, last in ranges:
            require(0 <= first <= last < SLOTS, f"slot range {first}-{last} is not within 0-{SLOTS - 1}")
            if owner[first:last + 1].count(0xFF) != last + 1 - first:
                raise ConfigError(f"slot range {first}-{last} of shard {shard} overlaps another shard's")
            owner[first:last + 1] = bytes([shard]) * (last + 1 - first)
    missing = owner.find(b"\xff")
    require(missing < 0, f"slot {missing} belongs to no shard")
    return bytes(owner)


@dataclass(frozen=True)
class NodeAddr:
    node_id: str
    host: str
    port: int


@dataclass(frozen=True)
class ShardMap:
    """Who holds what: shards -> replica node ids (role order) and slot ranges, node ids -> addresses."""

    epoch: int
    controlet: str
    datalet: str
    shards: tuple[tuple[str, ...], ...]
    nodes: dict[str, NodeAddr] = field(hash=False)
    slots: tuple[SlotRanges, ...] | None = None  # None: even_slots(len(shards))

    def __post_init__(self) -> None:
        require(self.epoch >= 0, "epoch must be non-negative")
        require(len(self.shards) >= 1, "a shard map needs at least one shard")
        for replicas in self.shards:
            require(len(replicas) >= 1, "every shard needs at least one replica")
            for n in replicas:
                require(n in self.nodes, f"replica {n!r} has no address in the shard map")
        if self.slots is None:
            object.__setattr__(self, "slots", even_slots(len(self.shards)))
        require(len(self.slots) == len(self.shards), f"{len(self.slots)} slot lists for {len(self.shards)} shards")
        object.__setattr__(self, "_owner", slot_owners(self.slots))
        object.__setattr__(self, "_shard_of_node",
                           {n: s for s, reps in enumerate(self.shards) for n in reps})

    def shard_for(self, key: bytes) -> int:
        return self._owner[key_slot(key)]  # type: ignore[attr-defined]

    def shard_of_slot(self, slot: int) -> int:
        return self._owner[slot]  # type: ignore[attr-defined]

    def shard_of_node(self, node_id: str) -> int | None:
        return self._shard_of_node.get(node_id)  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "controlet": self.controlet, "datalet": self.datalet,
                "shards": [list(r) for r in self.shards], "slots": [[list(r) for r in s] for s in self.slots],
                "nodes": {n: {"host": a.host, "port": a.port} for n, a in self.nodes.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> ShardMap:
        try:
            nodes = {n: NodeAddr(n, a["host"], int(a["port"])) for n, a in d["nodes"].items()}
            slots = d.get("slots")
            return cls(epoch=int(d["epoch"]), controlet=str(d["controlet"]), datalet=str(d["datalet"]),
                       shards=tuple(tuple(r) for r in d["shards"]), nodes=nodes,
                       slots=None if slots is None else tuple(tuple((int(a), int(b)) for a, b in s) for s in slots))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"malformed shard map: {e!r}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> ShardMap:
        return cls.from_dict(json.loads(text))


def layout(controlet: str, datalet: str, shards: int, replicas: int, host: str, ports: list[int],
           epoch: int = 1) -> ShardMap:
    """The standard layout: node `s{i}r{j}` is replica j of shard i, on ports[i * replicas + j]."""
    require(shards >= 1 and replicas >= 1, "shards and replicas must be at least 1")
    require(len(ports) == shards * replicas, f"need {shards * replicas} ports, got {len(ports)}")
    ids = [[f"s{s}r{r}" for r in range(replicas)] for s in range(shards)]
    nodes = {n: NodeAddr(n, host, ports[s * replicas + r])
             for s in range(shards) for r, n in enumerate(ids[s])}
    return ShardMap(epoch=epoch, controlet=controlet, datalet=datalet,
                    shards=tuple(tuple(r) for r in ids), nodes=nodes)
