"""`bespokv switch`: change a running cluster's topology and consistency without moving data.

The coordinator commits the same replicas under the new controlet as the next epoch
(failover.plan_switch, compare-and-set: a concurrent failover makes it re-plan). Every node then
rebuilds its controlet from the old one's state (Node.reconfigure): positions in the shard's one
numbered stream carry over, waiting operations fail with a retriable -TRYAGAIN, and a replica
that may lag its new upstream serves nothing until the upstream confirms its position (or it
has copied the upstream's state). The switch is acknowledged only when every node of the new
map reports the new epoch and is caught up: from then on a strong mode is linearizable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.coord.base import EpochConflict
from mlsyskit.tools.kv.coord.failover import plan_switch
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.shardmap import ShardMap

ATTEMPTS = 5


@dataclass
class SwitchResult:
    before: str
    after: str
    epoch: int
    committed_s: float  # from the request to the committed map
    settled_s: float  # from the request to every node serving under it

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class _MapStore:
    """read/compare-and-set on either backend (the embedded coordinator's client, or ZooKeeper)."""

    def __init__(self, spec: CoordinatorSpec) -> None:
        self.zk = None
        if spec.kind == "zookeeper":
            self.zk = spec.zookeeper()
        else:
            self.client = spec.embedded_client(timeout_s=2.0)

    def read(self) -> ShardMap | None:
        return self.zk.read_map() if self.zk else self.client.map()

    def cas(self, expected: int, new: ShardMap) -> ShardMap:
        return self.zk.compare_and_set(expected, new) if self.zk else self.client.cas(expected, new)

    def close(self) -> None:
        if self.zk:
            self.zk.close()
        else:
            self.client.close()


def commit_switch(spec: CoordinatorSpec, controlet: str) -> tuple[ShardMap, ShardMap]:
    """(map before, map committed); re-plans when a failover moved the epoch on meanwhile."""
    store = _MapStore(spec)
    try:
        for _ in range(ATTEMPTS):
            current = store.read()
            if current is None:
                raise RuntimeFailure("the coordinator holds no shard map yet")
            try:
                return current, store.cas(current.epoch, plan_switch(current, controlet))
            except EpochConflict:
                continue
        raise RuntimeFailure(f"the shard map kept changing; no switch committed in {ATTEMPTS} attempts")
    finally:
        store.close()


def wait_settled(new: ShardMap, clock: Clock, timeout: float, password: bytes | None = None) -> None:
    """Until every node of `new` answers at its epoch (or later) and is not catching up."""
    deadline = clock.now() + timeout
    waiting = dict(new.nodes)
    while waiting:
        for nid, addr in list(waiting.items()):
            try:
                info = parse_info(call(addr.host, addr.port, "INFO", timeout=0.5, password=password))
            except OSError:
                continue
            if int(info.get("epoch", -1)) >= new.epoch and info.get("catching_up", "0") == "0":
                del waiting[nid]
        if waiting and clock.now() > deadline:
            raise RuntimeFailure(f"switched to {new.controlet} (epoch {new.epoch}), but "
                                 f"{', '.join(sorted(waiting))} did not settle within {timeout:g} s")
        if waiting:
            clock.sleep(0.02)


def switch(spec: CoordinatorSpec, controlet: str, clock: Clock | None = None, timeout: float = 30.0,
           password: bytes | None = None) -> SwitchResult:
    clock = clock or RealClock()
    start = clock.now()
    before, new = commit_switch(spec, controlet)
    committed = clock.now()
    wait_settled(new, clock, timeout, password)
    return SwitchResult(before.controlet, new.controlet, new.epoch, round(committed - start, 4),
                        round(clock.now() - start, 4))
