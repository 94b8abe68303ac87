"""Starting a cluster's coordinator process and handing it the first shard map (`up` and `check`).

The nodes start first, with the record's map, and register and heartbeat at once; the map is
stored in the coordinator only when every node answers (`initialize`), so a node still starting
(a Python process takes a second or more on a loaded machine) is never mistaken for a failed one.
Embedded: `python -m mlsyskit.tools.kv.coord.server` with its SQLite state under the data
directory (a restart resumes at the same epoch). ZooKeeper: `python -m ...coord.zk_main`
against the given ensemble; the map goes under its root.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.controlplane import CoordinatorSpec
from mlsyskit.tools.kv.coord.client import CoordClient
from mlsyskit.tools.kv.shardmap import ShardMap


def coordinator_argv(spec: CoordinatorSpec, state_dir: Path, index: int = 0) -> list[str]:
    """The command line of coordinator number `index` (0 leads; others are standbys)."""
    if spec.kind == "zookeeper":
        hosts = ",".join(f"{h}:{p}" for h, p in spec.addrs)
        return [sys.executable, "-m", "mlsyskit.tools.kv.coord.zk_main", "--zk", hosts, "--root", spec.root,
                "--interval", str(spec.interval_s / 2), "--misses", str(2 * spec.misses),
                "--session-timeout", str(max(spec.timeout_s, 2.0)), "-q"]
    host, port = spec.addrs[index]
    return [sys.executable, "-m", "mlsyskit.tools.kv.coord.server", "--state-dir", str(state_dir),
            "--host", host, "--port", str(port), "--interval", str(spec.interval_s),
            "--misses", str(spec.misses)]


def spawn(argv: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def initialize(spec: CoordinatorSpec, shard_map: ShardMap, clock: Clock | None = None,
               timeout_s: float = 30.0) -> ShardMap:
    """Store the first map (idempotent: an existing map wins), waiting for the coordinator to answer."""
    clock = clock or RealClock()
    deadline = clock.now() + timeout_s
    last: Exception | None = None
    while clock.now() < deadline:
        try:
            return _initialize_once(spec, shard_map)
        except RuntimeFailure as e:  # not serving yet (Python start-up, a standby taking over)
            last = e
            clock.sleep(0.05)
    raise RuntimeFailure(f"the coordinator at {spec.url()} did not answer within {timeout_s:g} s: {last}")


def _initialize_once(spec: CoordinatorSpec, shard_map: ShardMap) -> ShardMap:
    if spec.kind == "zookeeper":
        from mlsyskit.tools.kv.coord.zk import ZkCoordinator

        hosts = ",".join(f"{h}:{p}" for h, p in spec.addrs)
        with ZkCoordinator(hosts, spec.root) as coord:
            return coord.initialize(shard_map)
    client = CoordClient(list(spec.addrs), timeout_s=1.0)
    try:
        return client.init(shard_map)
    finally:
        client.close()


def current_map(spec: CoordinatorSpec) -> ShardMap | None:
    """The coordinator's map now (RuntimeFailure when it does not answer)."""
    if spec.kind == "zookeeper":
        from mlsyskit.tools.kv.coord.zk import ZkCoordinator

        hosts = ",".join(f"{h}:{p}" for h, p in spec.addrs)
        with ZkCoordinator(hosts, spec.root, connect_timeout_s=3.0) as coord:
            return coord.read_map()
    client = CoordClient(list(spec.addrs), timeout_s=1.0)
    try:
        return client.map()
    finally:
        client.close()
