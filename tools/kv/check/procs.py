"""The cluster under test: one OS process per node on loopback, which the nemesis can kill
(-9), pause (SIGSTOP/SIGCONT), restart, and cut off from its peers (through fault proxies).

Node processes are the real `bespokv node` entry point reading a `cluster.json` record; when
links must be partitionable the record's `routes` make each node dial its peers through one
FaultProxy per directed replica link (Node.routes). Everything here is async so the proxies, which run
in the checker's event loop, keep relaying while the checker waits for processes.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import hiredis

from mlsyskit.core import net
from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.errors import RuntimeFailure
from mlsyskit.tools.kv.check.faultproxy import FaultProxy
from mlsyskit.tools.kv.client.call import acall, parse_info
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec, parse_coordinator
from mlsyskit.tools.kv.ops import coordproc, launcher
from mlsyskit.tools.kv.peerauth import SECRET_FILE, load_or_create_secret
from mlsyskit.tools.kv.shardmap import ShardMap, layout

HOST = "127.0.0.1"


class ProcCluster:
    """`coordinator`: None (no control plane: a dead replica waits for its restart), "embedded" or
    "zookeeper://HOST:PORT/ROOT" (nodes heartbeat, fail over and rejoin; `heartbeat` x `misses`)."""

    def __init__(self, controlet: str, datalet: str, shards: int, replicas: int, data_dir: Path,
                 partitionable: bool, clock: Clock | None = None, start_timeout: float = 30.0,
                 coordinator: str | None = None, heartbeat: float = 0.5, misses: int = 3) -> None:
        self.controlet, self.datalet = controlet, datalet
        self.shards, self.replicas = shards, replicas
        self.data_dir = Path(data_dir).resolve()
        self.partitionable = partitionable
        self.clock = clock or RealClock()
        self.start_timeout = start_timeout
        self.map: ShardMap | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.paused: set[str] = set()
        self.proxies: dict[tuple[str, str], FaultProxy] = {}  # (src, dst) -> proxy
        self.record: dict[str, Any] = {}
        self.coordinator, self.heartbeat, self.misses = coordinator, heartbeat, misses
        self.coord_spec: CoordinatorSpec | None = None
        self.coord_procs: list[subprocess.Popen] = []
        self.coord_logs: list[Path] = []  # each process's log: the leader says `leading`/`serving` there
        self.original: list[str] = []  # every node id of the first map: the nemesis' victims, healed back

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        n = self.shards * self.replicas
        self.map = layout(self.controlet, self.datalet, self.shards, self.replicas, HOST, net.free_ports(n))
        routes: dict[str, dict[str, tuple[str, int]]] = {}
        if self.partitionable:
            for reps in self.map.shards:
                for src in reps:
                    for dst in reps:
                        if src != dst:
                            addr = self.map.nodes[dst]
                            proxy = self.proxies[(src, dst)] = FaultProxy((addr.host, addr.port))
                            await proxy.start()
                            routes.setdefault(src, {})[dst] = (HOST, proxy.port)
        self.record = {"map": self.map.to_dict(), "datalet": self.datalet, "data_dir": str(self.data_dir),
                       "proxy": {"host": HOST, "port": 0}, "redis_ports": {}, "processes": [],
                       "routes": routes}
        self.original = list(self.nodes)
        self.home = dict(self.map.nodes)  # where each node listens, whichever map it is in
        if self.coordinator is not None:
            self.start_coordinator()
        self._write_record()
        for nid in self.nodes:
            self._spawn(nid)
        await self.wait_ready(self.nodes)
        if self.coord_spec is not None:
            await asyncio.to_thread(coordproc.initialize, self.coord_spec, self.map, self.clock)
            await self.settle()

    # -- the coordinator ------------------------------------------------------------
    def start_coordinator(self) -> None:
        """Start the coordinator process. Embedded: one, on a fixed free port, so a restart resumes
        from its SQLite state there. ZooKeeper: a leader and a standby waiting in the leader lock
        (a restart after a kill adds a new standby)."""
        if self.coord_spec is None:
            url = self.coordinator if self.coordinator != "embedded" else f"embedded://{HOST}:{net.free_port()}"
            self.coord_spec = parse_coordinator(url, self.heartbeat, self.misses)
            load_or_create_secret(self.data_dir)  # the coordinator's clients prove it (peerauth.py)
            self.coord_spec = replace(self.coord_spec, secret_file=str(self.data_dir / SECRET_FILE))
            self.record["coordinator"] = self.coord_spec.to_dict()
        wanted = 2 if self.coord_spec.kind == "zookeeper" and not self.coord_procs else 1
        for _ in range(wanted):
            argv = coordproc.coordinator_argv(self.coord_spec, self.data_dir / "coord")
            index = len(self.coord_procs) if self.coord_spec.kind == "zookeeper" else 0  # embedded: one log
            log = self.data_dir / "logs" / f"coordinator-{index}.log"
            self.coord_procs.append(launcher.spawn(argv, log))
            self.coord_logs.append(log)

    async def restart_coordinator(self, timeout_s: float = 30.0) -> None:
        """start_coordinator, then (embedded) wait until the new process says `serving`: a fault is healed
        only once the coordinator is back, so a run that ends right after a restart still has it back."""
        log = self.data_dir / "logs" / "coordinator-0.log"
        served_before = _serving_lines(log)
        self.start_coordinator()
        if self.coord_spec.kind != "embedded":
            return  # ZooKeeper: the restart is a standby, which serves only once it leads
        deadline = self.clock.now() + timeout_s
        while _serving_lines(log) <= served_before:
            if self.clock.now() > deadline or not self.coordinator_alive():
                raise RuntimeFailure(f"the restarted coordinator did not serve within {timeout_s:.0f} s ({log})")
            await self.clock.asleep(0.05)  # polling its log for the readiness line, with a deadline

    async def kill_coordinator(self) -> None:
        """kill -9 the leading coordinator (the live one whose log says it leads; else the first live)."""
        live = [(proc, log) for proc, log in zip(self.coord_procs, self.coord_logs, strict=True)
                if proc.poll() is None]
        leading = [(proc, log) for proc, log in live if self.coord_spec.kind == "embedded"
                   or "leading" in log.read_text(errors="replace")]
        for proc, _ in leading[-1:] or live[:1]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
                return

    def coordinator_alive(self) -> bool:
        return any(p.poll() is None for p in self.coord_procs)

    async def current_map(self) -> ShardMap:
        """The coordinator's map; the last one known while the coordinator is down (restarting)."""
        if self.coord_spec is None:
            return self.map
        try:
            found = await asyncio.to_thread(coordproc.current_map, self.coord_spec)
        except RuntimeFailure:
            return self.map
        return found or self.map

    async def settle(self, timeout: float | None = None) -> None:
        """Wait until every original node is back in the coordinator's map, at its epoch, caught up
        and holding a lease; then adopt that map (final reads and digests follow it)."""
        deadline = self.clock.now() + (timeout or self.start_timeout)
        while True:
            try:
                current = await self.current_map()
                if set(self.original) <= set(current.nodes) and await self._all_at(current):
                    self.map = current
                    return
            except (RuntimeError, OSError):
                pass  # the coordinator is restarting
            if self.clock.now() > deadline:
                raise RuntimeError(f"the cluster did not settle on one map with every node within "
                                   f"{timeout or self.start_timeout:.0f}s; see {self.data_dir}/logs")
            await self.clock.asleep(0.1)

    async def _all_at(self, current: ShardMap) -> bool:
        for nid in current.nodes:
            addr = current.nodes[nid]
            try:
                info = parse_info(await acall(addr.host, addr.port, b"INFO", timeout=0.5))
            except (OSError, TimeoutError, hiredis.ReplyError):
                return False
            lease = info.get("lease_s", "-")
            if info.get("epoch") != str(current.epoch) or info.get("catching_up", "0") != "0" \
                    or lease == "-" or float(lease) <= 0:
                return False
        return True

    @property
    def nodes(self) -> list[str]:
        return [nid for reps in self.map.shards for nid in reps]

    def shard_peers(self, node_id: str) -> list[str]:
        return list(self.map.shards[self.map.shard_of_node(node_id)])

    def _argv(self, node_id: str) -> list[str]:
        return [*launcher.ENTRY, "node", node_id, "--data-dir", str(self.data_dir)]

    def _spawn(self, node_id: str) -> None:
        self.procs[node_id] = launcher.spawn(self._argv(node_id), self.data_dir / "logs" / f"node-{node_id}.log")
        self._write_record()

    def _write_record(self) -> None:
        # Names as `bespokv up` writes them, so `bespokv down --data-dir` can clean up after a crash.
        self.record["processes"] = [{"name": f"node:{n}", "pid": p.pid} for n, p in self.procs.items()]
        (self.data_dir / "cluster.json").write_text(json.dumps(self.record, indent=2))

    def alive(self, node_id: str) -> bool:
        proc = self.procs.get(node_id)
        return proc is not None and proc.poll() is None

    async def wait_ready(self, nodes: list[str]) -> None:
        """Until every node answers and has caught up (launcher.wait_ready); fails if one exited."""
        watched = {nid: self.procs[nid] for nid in nodes}
        await asyncio.to_thread(
            launcher.wait_ready, [(nid, self.home[nid].host, self.home[nid].port) for nid in nodes],
            clock=self.clock, timeout=self.start_timeout, logs=f"{self.data_dir}/logs",
            exited=lambda: [f"node {nid} (exit {p.returncode})" for nid, p in watched.items() if p.poll() is not None])

    async def stop(self) -> None:
        """The coordinator first (stopping nodes must not look like failures), then every node
        (resumed if paused), then the fault proxies: launcher.stop's sequence."""
        await asyncio.to_thread(launcher.stop, self.coord_procs, self.clock)
        for nid in list(self.paused):
            self._signal(nid, signal.SIGCONT)
        self.paused.clear()
        await asyncio.to_thread(launcher.stop, list(self.procs.values()), self.clock)
        for proxy in self.proxies.values():
            await proxy.close()
        self.procs.clear()
        self._write_record()

    def _signal(self, node_id: str, sig: int) -> None:
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            launcher.signal_group(proc, sig)

    # -- faults ------------------------------------------------------------------
    async def kill(self, node_id: str) -> None:
        """kill -9: no shutdown code runs; a memory datalet loses everything."""
        self.paused.discard(node_id)
        self._signal(node_id, signal.SIGKILL)
        await asyncio.to_thread(self.procs[node_id].wait)

    async def terminate(self, node_id: str) -> None:
        """A clean stop (SIGTERM): the node closes its sockets and datalet."""
        self._signal(node_id, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.to_thread(self.procs[node_id].wait), 10)
        except TimeoutError:
            await self.kill(node_id)

    async def start_node(self, node_id: str) -> None:
        if not self.alive(node_id):
            self._spawn(node_id)
            await self.wait_ready([node_id])

    def pause(self, node_id: str) -> None:
        self._signal(node_id, signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: str) -> None:
        self._signal(node_id, signal.SIGCONT)
        self.paused.discard(node_id)

    async def isolate(self, node_id: str) -> None:
        """Cut every link between node_id and the other replicas of its shard, both ways."""
        if not self.partitionable:
            raise RuntimeError("this cluster was started without fault proxies (partitionable=False)")
        for (src, dst), proxy in self.proxies.items():
            if node_id in (src, dst):
                await proxy.sever()

    async def heal(self) -> None:
        """Undo every fault: reconnect links, resume paused nodes, start dead ones."""
        for proxy in self.proxies.values():
            await proxy.heal()
        for nid in list(self.paused):
            self.resume(nid)
        if self.coord_spec is not None and not self.coordinator_alive():
            await self.restart_coordinator()  # embedded: the restart the nemesis would have made
        for nid in self.original or self.nodes:
            await self.start_node(nid)
        if self.coord_spec is not None:
            await self.settle()

    # -- observation ---------------------------------------------------------------
    async def digests(self, timeout: float = 2.0) -> dict[str, tuple[int, str] | None]:
        out: dict[str, tuple[int, str] | None] = {}
        for nid in self.nodes:
            addr = self.map.nodes[nid]
            try:
                count, digest = await acall(addr.host, addr.port, b"BKV.DIGEST", timeout=timeout)
                out[nid] = (int(count), digest.decode())
            except (OSError, TimeoutError, hiredis.ReplyError, ValueError):
                out[nid] = None
        return out


def _serving_lines(log: Path) -> int:
    """How many times a coordinator writing to `log` said it was ready."""
    if not log.exists():
        return 0
    return sum(line.startswith("serving") for line in log.read_text(errors="replace").splitlines())
