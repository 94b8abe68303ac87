"""Sharding: consistent hashing with virtual nodes, and the cluster's shard map.

Keys hash with blake2b (stable across processes and runs, unlike Python's hash()) onto a
ring of 64-bit points; each shard owns `vnodes` points, and a key belongs to the shard of
the first point at or after its hash. Adding a shard moves only about 1/S of the keys.

The shard map is plain data (JSON on the wire and on disk): the configuration epoch, the
controlet and datalet names, each shard's replicas in role order, and each node's address.
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field

from mlsyskit.core.config import ConfigError, require


def hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Maps keys to shard indices with `vnodes` virtual points per shard."""

    def __init__(self, shards: int, vnodes: int = 128) -> None:
        require(shards >= 1, f"a ring needs at least one shard, got {shards}")
        require(vnodes >= 1, f"vnodes must be at least 1, got {vnodes}")
        points = sorted((hash64(b"shard-%d#%d" % (s, v)), s) for s in range(shards) for v in range(vnodes))
        self.shards = shards
        self._hashes = [h for h, _ in points]
        self._owners = [s for _, s in points]

    def shard_for(self, key: bytes) -> int:
        if self.shards == 1:
            return 0
        i = bisect.bisect_left(self._hashes, hash64(key))
        return self._owners[i if i < len(self._owners) else 0]


@dataclass(frozen=True)
class NodeAddr:
    node_id: str
    host: str
    port: int


@dataclass(frozen=True)
class ShardMap:
    """Who holds what: shards -> replica node ids (role order), node ids -> addresses."""

    epoch: int
    controlet: str
    datalet: str
    shards: tuple[tuple[str, ...], ...]
    nodes: dict[str, NodeAddr] = field(hash=False)
    vnodes: int = 128

    def __post_init__(self) -> None:
        require(self.epoch >= 0, "epoch must be non-negative")
        require(len(self.shards) >= 1, "a shard map needs at least one shard")
        for replicas in self.shards:
            require(len(replicas) >= 1, "every shard needs at least one replica")
            for n in replicas:
                require(n in self.nodes, f"replica {n!r} has no address in the shard map")
        object.__setattr__(self, "_ring", HashRing(len(self.shards), self.vnodes))
        object.__setattr__(self, "_shard_of_node",
                           {n: s for s, reps in enumerate(self.shards) for n in reps})

    @property
    def ring(self) -> HashRing:
        return self._ring  # type: ignore[attr-defined]

    def shard_for(self, key: bytes) -> int:
        return self._ring.shard_for(key)  # type: ignore[attr-defined]

    def shard_of_node(self, node_id: str) -> int | None:
        return self._shard_of_node.get(node_id)  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "controlet": self.controlet, "datalet": self.datalet,
                "vnodes": self.vnodes, "shards": [list(r) for r in self.shards],
                "nodes": {n: {"host": a.host, "port": a.port} for n, a in self.nodes.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> ShardMap:
        try:
            nodes = {n: NodeAddr(n, a["host"], int(a["port"])) for n, a in d["nodes"].items()}
            return cls(epoch=int(d["epoch"]), controlet=str(d["controlet"]), datalet=str(d["datalet"]),
                       shards=tuple(tuple(r) for r in d["shards"]), nodes=nodes,
                       vnodes=int(d.get("vnodes", 128)))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"malformed shard map: {e!r}") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> ShardMap:
        return cls.from_dict(json.loads(text))


def layout(controlet: str, datalet: str, shards: int, replicas: int, host: str, ports: list[int],
           epoch: int = 1, vnodes: int = 128) -> ShardMap:
    """The standard layout: node `s{i}r{j}` is replica j of shard i, on ports[i * replicas + j]."""
    require(shards >= 1 and replicas >= 1, "shards and replicas must be at least 1")
    require(len(ports) == shards * replicas, f"need {shards * replicas} ports, got {len(ports)}")
    ids = [[f"s{s}r{r}" for r in range(replicas)] for s in range(shards)]
    nodes = {n: NodeAddr(n, host, ports[s * replicas + r])
             for s in range(shards) for r, n in enumerate(ids[s])}
    return ShardMap(epoch=epoch, controlet=controlet, datalet=datalet,
                    shards=tuple(tuple(r) for r in ids), nodes=nodes, vnodes=vnodes)
