"""The node and proxy processes of a recorded cluster (`bespokv node ID`, `bespokv proxy`, started by `up`).

Without a coordinator a process serves the record's shard map. With one it starts from the
coordinator's map (the record's until the coordinator has one), and a node that was failed over
while it was down rejoins its home shard as a replacement: it copies the shard's state as a
learner first and joins once it holds it (copy-then-join; node/agent.py); then a ControlAgent
keeps it in step with the coordinator.
"""
from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from mlsyskit.core.config import ConfigError
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.core.retry import Backoff, retry_async
from mlsyskit.tools.kv.coord.aclient import CoordUnavailable
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.frontend.server import start_node
from mlsyskit.tools.kv.node.agent import (
    COPY_FIRST_MODES,
    ControlAgent,
    become_learner,
    copy_first,
    make_backend,
)
from mlsyskit.tools.kv.node.runtime import Node
from mlsyskit.tools.kv.ops.cluster import node_datalet
from mlsyskit.tools.kv.ops.processes import load_record, read_password
from mlsyskit.tools.kv.peerauth import load_or_create_secret
from mlsyskit.tools.kv.shardmap import ShardMap


def serve_node(data_dir: Path, node_id: str | None) -> None:
    record = load_record(Path(data_dir))
    smap = ShardMap.from_dict(record["map"])
    datalet = None
    if node_id is not None:
        if smap.shard_of_node(node_id) is None:
            raise ConfigError(f"node {node_id!r} is not in the cluster under {data_dir}")
        redis = {"host": record["proxy"]["host"], "port": record["redis_ports"].get(node_id, 6379)}
        datalet = node_datalet(record["datalet"], node_id, Path(record["data_dir"]), redis)
    secret = load_or_create_secret(Path(data_dir))
    requirepass = read_password(Path(data_dir))  # from the 0600 file, never from argv
    routes = {dst: (h, int(p)) for dst, (h, p) in record.get("routes", {}).get(node_id or "", {}).items()}
    proxy = record["proxy"]
    addr = (proxy["host"], proxy["port"]) if node_id is None else (None, None)

    def make(current: ShardMap) -> Node:
        node = Node(current, node_id, datalet, secret=secret, requirepass=requirepass)
        node.routes = routes
        node.redirect = True  # a node answers -MOVED for another shard's key, as Redis Cluster's do
        return node
    coordinator = record.get("coordinator")
    if coordinator is None:
        _run(_serve(make(smap), *addr))
    else:
        _run(_serve_managed(make, smap, node_id, CoordinatorSpec.from_dict(coordinator), *addr))


async def _serve_managed(make, initial: ShardMap, node_id: str | None, spec: CoordinatorSpec,
                         host: str | None, port: int | None) -> None:
    """Under a coordinator: start from its map (the record's before it has one). A node that was
    failed over while it was down copies its shard as a learner, then joins (or, join-first:
    joins, then catches up like any restart)."""
    backend = make_backend(spec)
    home = initial.nodes.get(node_id) if node_id else None
    home_shard = initial.shard_of_node(node_id) if node_id else None
    current = await _coordinator_map(backend, spec) or initial
    learner = node_id is not None and current.shard_of_node(node_id) is None
    joined = learner and not (copy_first() and current.controlet in COPY_FIRST_MODES)
    if joined:
        current, learner = await backend.join(home_shard, node_id, home.host, home.port), False
    node = make(initial if learner else current)
    node.cluster_nodes = {**initial.nodes, **current.nodes}
    if learner:
        become_learner(node, current, home_shard, start=False)  # the start-up catch-up copies
    agent = ControlAgent(node, spec, home, home_shard, backend=backend)
    agent.announce_pending = joined
    if home is not None:  # a learner is not in its map: it listens at its home address
        host, port = home.host, home.port
    await _serve(node, host, port, agent)


async def _coordinator_map(backend, spec: CoordinatorSpec, timeout_s: float = 30.0) -> ShardMap | None:
    try:
        return await retry_async(backend.map, retriable=lambda e: isinstance(e, CoordUnavailable),
                                 deadline_s=timeout_s, backoff=Backoff(0.1, 0.5))
    except CoordUnavailable:
        raise RuntimeFailure(f"no coordinator answered at {spec.url()} within {timeout_s:g} s") from None


async def _serve(node: Node, host: str | None, port: int | None, agent: ControlAgent | None = None) -> None:
    # A node process may be a restart: it catches up from a live replica before serving
    # (a whole shard starting together settles who starts first; see controlets/stream.py).
    stop = asyncio.Event()
    lost: list[str] = []
    if node.datalet is not None:  # fail-stop when the store behind the datalet is gone (redis_store.py)
        node.datalet.on_lost = lambda why: (lost.append(f"{why}: this node cannot store"), stop.set())
    node.on_fatal = lambda why: (lost.append(why), stop.set())
    await start_node(node, host, port, catch_up=True)
    if agent is not None:
        agent.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await node.stop()
    if lost:
        raise RuntimeFailure(f"{lost[0]}; so it exits (fail-stop) to be failed over and replaced")


def _run(coro) -> None:
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)
