"""The one Coordinator interface: shard map + epoch (compare-and-set), membership, liveness, leader election.

Both backends (embedded SQLite, ZooKeeper) keep the same rule for configuration changes: a new
map is written only if the stored epoch is still `expected_epoch` and the new map's epoch is
exactly one more, so two coordinators racing on the same failure cannot both win, and every
change is visible to nodes as an epoch bump (see failover.admit).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from mlsyskit.core.errors import RuntimeFailure, UsageError
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap


class EpochConflict(RuntimeFailure):
    """The stored epoch moved on (someone else changed the map): re-read and re-plan."""

    def __init__(self, expected: int, current: int | None) -> None:
        super().__init__(f"shard map changed: expected epoch {expected}, stored epoch {current}")
        self.expected = expected
        self.current = current


class NotLeader(RuntimeFailure):
    """A change was asked of a coordinator that does not hold leadership."""


def check_successor(expected_epoch: int, new_map: ShardMap) -> None:
    if new_map.epoch != expected_epoch + 1:
        raise UsageError(f"a new shard map must have epoch {expected_epoch + 1}, got {new_map.epoch}")


class Coordinator(ABC):
    """Cluster metadata and liveness. Implementations are thread-safe for one process's use."""

    # -- shard map ------------------------------------------------------------------------------
    @abstractmethod
    def read_map(self) -> ShardMap | None:
        """The current shard map, or None before the cluster was initialised."""

    @abstractmethod
    def initialize(self, shard_map: ShardMap) -> ShardMap:
        """Store the first map if there is none; returns the stored map either way (idempotent)."""

    @abstractmethod
    def compare_and_set(self, expected_epoch: int, new_map: ShardMap) -> ShardMap:
        """Replace the map at `expected_epoch` with `new_map` (epoch + 1); EpochConflict otherwise."""

    # -- membership and liveness ----------------------------------------------------------------
    @abstractmethod
    def register(self, node: NodeAddr) -> None:
        """Add or update a member (persistent) and mark it live."""

    @abstractmethod
    def members(self) -> dict[str, NodeAddr]:
        """Every registered node, live or not."""

    @abstractmethod
    def heartbeat(self, node_id: str, applied: int | None = None) -> bool:
        """The node is alive (only a check where liveness is a session, as in ZooKeeper); `applied`
        is its count of applied writes. False: the node is unknown or deposed and must rejoin."""

    @abstractmethod
    def applied(self) -> dict[str, int]:
        """The last `applied` count each node reported (picks the ms-ec master on failover)."""

    @abstractmethod
    def live(self) -> list[str]:
        """Registered nodes currently considered alive, sorted."""

    # -- leader election (standby coordinators) -------------------------------------------------
    @abstractmethod
    def campaign(self, candidate: str, timeout_s: float | None) -> bool:
        """Block until this coordinator leads (True) or `timeout_s` passes (False; None waits forever)."""

    @abstractmethod
    def is_leader(self) -> bool: ...

    @abstractmethod
    def leader(self) -> str | None:
        """The current leader's candidate name, if any is known."""

    @abstractmethod
    def close(self) -> None:
        """Give up leadership and release every resource."""

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
