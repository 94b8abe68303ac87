"""Starting a cluster's coordinator process and handing it the first shard map (`up` and `check`).

The nodes start first, with the record's map, and register and heartbeat at once; the map is
stored in the coordinator only when every node answers (`initialize`), so a node still starting
(a Python process takes a second or more on a loaded machine) is never mistaken for a failed one.
Embedded: `python -m mlsyskit.tools.kv.coord.server` with its SQLite state under the data
directory (a restart resumes at the same epoch). ZooKeeper: `python -m ...coord.zk_main`
against the given ensemble; the map goes under its root.
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.core.net import free_port
from mlsyskit.core.retry import Backoff, retry_call
from mlsyskit.tools.kv.client.call import call, parse_info
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec, parse_coordinator
from mlsyskit.tools.kv.peerauth import SECRET_FILE, load_or_create_secret
from mlsyskit.tools.kv.shardmap import ShardMap

START_POLL_S, START_POLL_CAP_S = 0.05, 0.2  # waits between tries while a process starts (core.retry)


def coordinator_argv(spec: CoordinatorSpec, state_dir: Path, index: int = 0) -> list[str]:
    """The command line of coordinator number `index` (0 leads; others are standbys)."""
    secret = ["--secret-file", spec.secret_file] if spec.secret_file else []
    if spec.kind == "zookeeper":
        # A node's liveness is its session (timeout interval x misses): once its znode is gone the
        # session has expired, so the watcher only rides out flaps (2 checks at half the interval).
        # The node's lease assumes ZooKeeper grants the session timeout asked for: the server's
        # maxSessionTimeout (20 x tickTime) must be at least interval x misses.
        hosts = ",".join(f"{h}:{p}" for h, p in spec.addrs)
        return [sys.executable, "-m", "mlsyskit.tools.kv.coord.zk_main", "--zk", hosts, "--root", spec.root,
                "--interval", str(spec.interval_s / 2), "--misses", "2",
                "--session-timeout", str(max(spec.timeout_s, 2.0)), *secret, "-q"]
    host, port = spec.addrs[index]
    return [sys.executable, "-m", "mlsyskit.tools.kv.coord.server", "--state-dir", str(state_dir),
            "--host", host, "--port", str(port), "--interval", str(spec.interval_s),
            "--misses", str(spec.misses), *secret]


def initialize(spec: CoordinatorSpec, shard_map: ShardMap, clock: Clock | None = None,
               timeout_s: float = 30.0) -> ShardMap:
    """Store the first map (idempotent: an existing map wins), waiting for the coordinator to answer."""
    clock = clock or RealClock()
    try:  # not serving yet: Python start-up, a standby taking over
        return retry_call(lambda: _initialize_once(spec, shard_map), retriable=_is_runtime_failure,
                          deadline_s=timeout_s, backoff=Backoff(START_POLL_S, START_POLL_CAP_S), clock=clock)
    except RuntimeFailure as e:
        raise RuntimeFailure(f"the coordinator at {spec.url()} did not answer within {timeout_s:g} s: {e}") from None


def _is_runtime_failure(error: BaseException) -> bool:
    return isinstance(error, RuntimeFailure)


def _initialize_once(spec: CoordinatorSpec, shard_map: ShardMap) -> ShardMap:
    if spec.kind == "zookeeper":
        with spec.zookeeper() as coord:
            return coord.initialize(shard_map)
    client = spec.embedded_client(timeout_s=1.0)
    try:
        return client.init(shard_map)
    finally:
        client.close()


def current_map(spec: CoordinatorSpec) -> ShardMap | None:
    """The coordinator's map now (RuntimeFailure when it does not answer)."""
    if spec.kind == "zookeeper":
        with spec.zookeeper(connect_timeout_s=3.0) as coord:
            return coord.read_map()
    client = spec.embedded_client(timeout_s=1.0)
    try:
        return client.map()
    finally:
        client.close()


def spec_for_up(url: str, host: str, heartbeat: float, misses: int, data_dir: Path) -> CoordinatorSpec | None:
    """`bespokv up`'s coordinator; an embedded one starts from an empty state (`up` is a new
    configuration from the spec; the data stays) on a free port from the project's picker (outside the
    kernel's ephemeral range, where any outgoing connection could take it before the coordinator binds)."""
    if url == "none":
        return None
    if url == "embedded":
        shutil.rmtree(data_dir / "coord", ignore_errors=True)
        url = f"embedded://{host}:{free_port(host)}"
    spec = parse_coordinator(url, heartbeat, misses)
    load_or_create_secret(data_dir)  # the coordinator's clients prove the cluster secret (peerauth.py)
    return replace(spec, secret_file=str(data_dir / SECRET_FILE))


def wait_leases(endpoints: list[tuple[str, str, int]], clock: Clock, timeout: float, where: str,
                password: bytes | None = None) -> None:
    """Until every node's first heartbeat under the stored map was answered (it serves only then)."""

    deadline = clock.now() + timeout
    for name, host, port in endpoints:
        if name == "proxy":
            continue
        while True:
            try:
                lease = parse_info(call(host, port, "INFO", timeout=0.5, password=password)).get("lease_s", "-")
                if lease != "-" and float(lease) > 0:
                    break
            except OSError:
                pass
            if clock.now() > deadline:
                raise ConfigError(f"{name} holds no lease from the coordinator after {timeout:.0f}s; "
                                  f"see {where}/logs")
            clock.sleep(0.05)


def status_row(coord: CoordinatorSpec, pid: int | None) -> dict[str, Any]:
    """The coordinator's line in `bespokv status`: its epoch, leader and the nodes it holds failed."""
    row: dict[str, Any] = {"name": "coordinator", "endpoint": coord.url(), "pid": pid, "up": False,
                           "role": "coordinator"}
    try:
        current = current_map(coord)
        row.update(up=True, epoch=current.epoch if current else "-", state="leading")
        if coord.kind == "embedded":
            client = coord.embedded_client(timeout_s=1.0)
            try:
                st = client.status()
            finally:
                client.close()
            failed = st.get("failed") or []
            row["state"] = f"leader {st.get('leader')}" + (f"; failed {', '.join(failed)}" if failed else "")
    except (RuntimeFailure, OSError) as e:
        row["state"] = f"unreachable: {e}"
    return row
