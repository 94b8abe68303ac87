"""A node's side of the control plane: register, heartbeat, follow the shard map, hold a lease, rejoin.

    embedded://HOST:PORT[,HOST:PORT...]     the embedded coordinator (leader first, then standbys)
    zookeeper://HOST:PORT[,HOST:PORT...]/ROOT   ZooKeeper (liveness = this node's own session)

Every `interval_s` the agent heartbeats with the node's applied-write count (the coordinator
promotes the most advanced ms-ec replica with it). The reply carries the map's epoch; a newer
epoch (or a peer message stamped with one: `refresh_soon`) makes the node fetch the map and
reconfigure (Node.reconfigure). A node that finds itself absent from the map was deposed: it
rejoins its home shard as a replacement, copy-then-join: it first copies a snapshot of its home
shard as a learner outside the map (controlets/learner.py), and asks to join only once it holds
it; after the join it takes only the log tail after the snapshot's position (or a snapshot when the
log no longer reaches back). BESPOKV_JOIN_FIRST=1 restores the old order (join, then copy) for
comparison (scripts/bench_kv_faults.py --recovery --join-first); aa-ec always joins first.

The lease is what keeps a deposed tail from serving stale reads. A heartbeat sent at t and
answered "known, same epoch" proves the coordinator heard from this node no earlier than t, and
the coordinator fails a node over only after `timeout_s` of silence, so until t + timeout_s no
new map can exclude it. The node serves clients only until t + timeout_s - margin_s; a node
that was paused, partitioned from the coordinator or deposed stops serving by itself, before
any new configuration can act without it (one machine's clock; margin for scheduling delay).
A lease is granted only from an answer that says "known", at the epoch of the node's own current
map, to a registered member that is neither deposed nor copying as a learner, for a beat sent
after the node last (re)registered (`grant`); an answer that fails any of these renews nothing,
and a newer map is the agent's to follow. With the embedded coordinator the beats come from their
own thread (beat.py), so a long event-loop turn neither starves them nor lets the lease lapse:
the thread publishes its newest answer, and the loop applies `grant` to it whenever it finds the
lease lapsed (control.py), on the loop, against the map it is about to serve under. A starved
loop keeps the lease its beats earned; a node whose beats go unanswered (coordinator unreachable,
node removed) has no newer answer to take, so its lease still ends at t + timeout_s - margin_s
of its last answered beat. timeout_s is floored (coord/detector.py).
"""
from __future__ import annotations

import asyncio
import os
import secrets
import traceback
from typing import TYPE_CHECKING, Any

from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.core.console import log, warn
from mlsyskit.tools.kv.controlets import controlet_class
from mlsyskit.tools.kv.controlets.learner import Learner
from mlsyskit.tools.kv.coord.aclient import AsyncCoordClient, CoordRefused, CoordUnavailable
from mlsyskit.tools.kv.coord.spec import CoordinatorSpec
from mlsyskit.tools.kv.node.beat import HeartbeatThread
from mlsyskit.tools.kv.shardmap import NodeAddr, ShardMap

if TYPE_CHECKING:
    from mlsyskit.tools.kv.node.runtime import Node


class ZkBackend:
    """The same calls as AsyncCoordClient, on ZooKeeper (kazoo is blocking: run in a thread)."""

    def __init__(self, spec: CoordinatorSpec) -> None:
        # The session is this node's liveness: it expires after timeout_s without contact.
        self.coord = spec.zookeeper(session_timeout_s=spec.timeout_s)

    async def _call(self, fn: Any, *args: Any) -> Any:
        from mlsyskit.tools.kv.coord.zk import KazooException, SessionStillLive

        try:
            return await asyncio.to_thread(fn, *args)
        except KazooException as e:
            raise CoordUnavailable(repr(e)) from None
        except SessionStillLive as e:  # our previous process's session, not yet expired: retry
            raise CoordUnavailable(str(e)) from None

    async def map(self) -> ShardMap | None:
        return await self._call(self.coord.read_map)

    async def register(self, node: str, host: str, port: int) -> None:
        await self._call(self.coord.register, NodeAddr(node, host, port))

    async def heartbeat(self, node: str, applied: int | None) -> tuple[bool, int | None]:
        known = await self._call(self.coord.heartbeat, node, applied)
        current = await self.map()
        return known, None if current is None else current.epoch

    async def join(self, shard: int, node: str, host: str, port: int) -> ShardMap:
        from mlsyskit.tools.kv.coord.failover import PlanError
        from mlsyskit.tools.kv.coord.orchestrator import join

        try:
            return await self._call(join, self.coord, shard, NodeAddr(node, host, port))
        except PlanError as e:
            raise CoordRefused(str(e)) from None

    async def close(self) -> None:
        await asyncio.to_thread(self.coord.close)


COPY_FIRST_MODES = ("ms-sc", "ms-ec", "aa-sc")  # the numbered streams: a learner's position means something


def copy_first() -> bool:
    return os.environ.get("BESPOKV_JOIN_FIRST", "") != "1"


def become_learner(node: Node, current: ShardMap, shard: int, start: bool = True) -> None:
    """Put a node that is absent from `current` to copying shard `shard`'s state as a learner.

    The node takes `current` as its map (so its messages carry the current epoch and the shard's
    members accept them), refuses every client (no lease: it is not in the map), and runs a
    Learner controlet that copies a snapshot from the shard's members, ms-sc's tail first (the
    replica it will follow), else replicas[0]. `start` False: the node is not open yet; its
    start-up catch-up (Node.catch_up) begins the copy.
    """
    members = current.shards[shard]
    sources = tuple(reversed(members)) if current.controlet == "ms-sc" else members
    learner = Learner(node.node_id, members, sources, current.epoch, node.options,
                      incarnation=secrets.randbits(30))
    learner.now = node.clock.now()
    node.map, node.epoch_bytes = current, str(current.epoch).encode()
    node.peer_names = {n.encode(): n for n in current.nodes}
    node.cluster_nodes.update(current.nodes)
    node.controlet_cls = controlet_class(current.controlet)
    node.shard, node.only_shard, node.deposed = shard, len(current.shards) == 1, False
    if node.lease_until is not None:
        node.lease_until = float("-inf")
    node.controlet = learner
    node._fast_ready = None
    node._refresh_fast_paths()
    if start:
        node.execute(learner.on_start())


def make_backend(spec: CoordinatorSpec) -> Any:
    if spec.kind == "zookeeper":
        return ZkBackend(spec)
    return AsyncCoordClient(list(spec.addrs), timeout_s=min(1.0, spec.interval_s * 2), secret=spec.secret())


class ControlAgent:
    """Runs beside a Node in its event loop (one task); the node calls `refresh_soon` on newer epochs."""

    def __init__(self, node: Node, spec: CoordinatorSpec, home: NodeAddr | None, home_shard: int | None,
                 clock: Clock | None = None, backend: Any = None) -> None:
        self.node, self.spec = node, spec
        self.home, self.home_shard = home, home_shard  # this node's address and the shard it rejoins
        self.clock = clock or RealClock()
        self.backend = backend or make_backend(spec)
        self.margin_s = min(spec.interval_s / 2, 0.25)
        self.wake = asyncio.Event()
        self.registered = False
        self.task: asyncio.Task | None = None
        self.stats = {"heartbeats": 0, "heartbeat_failures": 0, "unexpected_errors": 0, "maps": 0, "rejoins": 0,
                      "learner_starts": 0}
        self.announce_pending = False  # joined before the node ran (nodeproc): announce at the first step
        self.beater: HeartbeatThread | None = None  # beats off the event loop (embedded coordinator)
        self.last_beat: tuple[float, bool, int | None] | None = None  # the thread's latest answer
        self.valid_from = float("-inf")  # answers to beats sent before the latest registration grant nothing
        node.agent = self
        if node.node_id is not None:  # no lease until the first heartbeat is answered
            node.lease_until = float("-inf")
            node._fast_ready = None
            node._refresh_fast_paths()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self.run())
        node, spec = self.node, self.spec
        if node.node_id is not None and isinstance(self.backend, AsyncCoordClient):  # embedded, not a test's fake
            client = spec.embedded_client(timeout_s=min(1.0, spec.interval_s * 2))
            self.beater = HeartbeatThread(client, node.node_id, spec.interval_s, node.applied, self.answered,
                                          loop, self.clock)
            self.beater.start()

    async def stop(self) -> None:
        if self.beater is not None:
            self.beater.stop()
        if self.task is not None:
            self.task.cancel()
        close = getattr(self.backend, "close", None)
        if close is not None:
            await close()

    def refresh_soon(self) -> None:
        self.wake.set()

    async def run(self) -> None:
        # Nothing may end this loop but cancellation: a node whose agent died would hold no lease,
        # refuse every client and never rejoin, silently (a task's exception is only reported when
        # the task is collected, and the agent keeps it).
        hurried = False
        while True:
            again = False
            try:
                again = await self.step()
            except (CoordUnavailable, CoordRefused) as e:
                self.stats["heartbeat_failures"] += 1
                if self.stats["heartbeat_failures"] % 20 == 1:
                    warn(f"control plane: {e}")
            except Exception as e:  # noqa: BLE001 - logged, then retried next round
                self.stats["heartbeat_failures"] += 1
                self.stats["unexpected_errors"] += 1
                if self.stats["unexpected_errors"] % 20 == 1:
                    warn(f"control plane step failed: {type(e).__name__}: {e}; retrying\n"
                         + "".join(traceback.format_exception(e)).rstrip())
            self.wake.clear()
            if again and not hurried:  # just joined: heartbeat at once for a lease, not an interval later
                hurried = True  # (once: a node that keeps rejoining must not hammer the coordinator)
                continue
            hurried = False
            try:
                await asyncio.wait_for(self.wake.wait(), self.spec.interval_s)
            except TimeoutError:
                pass

    def grant(self, sent: float, known: bool, epoch: int | None) -> bool:
        """The lease rule (module docstring), on the loop: renew the lease to sent + timeout_s -
        margin_s when the answer to the beat sent at `sent` allows it; False when it does not."""
        node = self.node
        if not (known and self.registered and sent >= self.valid_from and epoch == node.map.epoch
                and not node.deposed and not self.learning):
            return False
        until = sent + self.spec.timeout_s - self.margin_s
        if node.lease_until is None or until > node.lease_until:
            node.renew_lease(until)
        return True

    def take_thread_answer(self) -> None:
        """The loop found the lease lapsed: apply the rule to the heartbeat thread's newest answer
        (it may have arrived while the loop was starved, before its callback could run)."""
        latest = None if self.beater is None else self.beater.latest
        if latest is not None:
            self.grant(*latest)

    def answered(self, sent: float, known: bool, epoch: int | None) -> None:
        """The heartbeat thread's answer, on the loop: renew the lease, or wake the agent when the
        map changed or the node is not a known member."""
        self.stats["heartbeats"] += 1
        self.last_beat = (sent, known, epoch)
        if not self.grant(sent, known, epoch):
            self.wake.set()

    async def _heartbeat(self) -> tuple[float, bool, int | None]:
        """The thread's latest answer when it is fresh (sent within two intervals, after the node
        last (re)registered), else a heartbeat from here."""
        last = self.last_beat
        if last is not None and self.clock.now() - last[0] < 2 * self.spec.interval_s:
            return last
        sent = self.clock.now()
        known, epoch = await self.backend.heartbeat(self.node.node_id, self.node.applied())
        self.stats["heartbeats"] += 1
        return sent, known, epoch

    async def step(self) -> bool:
        """One round: heartbeat (a proxy only polls the map), follow a new map, renew the lease.
        True when this round joined the node to its shard: it serves only once a heartbeat under
        the new map grants it a lease, so the next round should follow at once (clients' reads
        at a new ms-sc tail are refused with -TRYAGAIN until then)."""
        node = self.node
        if node.node_id is None:
            await self.follow(await self.backend.map())
            return False
        if not self.registered:
            self.valid_from = self.clock.now()
            await self.backend.register(node.node_id, self.home.host, self.home.port)
            self.registered, self.last_beat = True, None  # earlier answers predate the registration
        if self.announce_pending:
            self.announce_pending = False
            self.announce()
        sent, known, epoch = await self._heartbeat()
        if epoch is not None and epoch != node.map.epoch or not known or node.deposed or self.learning:
            await self.follow(await self.backend.map())
        if self.learning:
            return await self.join_when_copied()
        if node.deposed:
            return await self.rejoin()
        if not known:  # our liveness record is gone (a new ZooKeeper session, a coordinator reset)
            self.registered, self.last_beat = False, None
        else:
            self.grant(sent, known, epoch)
        return False

    @property
    def learning(self) -> bool:
        return isinstance(self.node.controlet, Learner)

    async def follow(self, current: ShardMap | None) -> None:
        if current is not None and current.epoch > self.node.map.epoch:
            self.stats["maps"] += 1
            if self.learning and self.node.node_id not in current.nodes:
                self.learn(current)  # a new map while copying: start over under its epoch
                return
            self.node.reconfigure(current)

    def learn(self, current: ShardMap) -> None:
        self.stats["learner_starts"] += 1
        log(f"{self.node.node_id} copies shard {self.home_shard} as a learner (epoch {current.epoch})")
        become_learner(self.node, current, self.home_shard)

    async def join_when_copied(self) -> bool:
        """A learner that holds its snapshot joins; its new controlet then takes the log tail."""
        node = self.node
        if not node.controlet.copied:
            return False
        new = await self.backend.join(self.home_shard, node.node_id, self.home.host, self.home.port)
        self.stats["rejoins"] += 1
        self.registered, self.last_beat = False, None
        log(f"{node.node_id} copied shard {self.home_shard} to position {node.controlet.applied}: joined at epoch {new.epoch}")
        node.reconfigure(new)
        self.announce()
        return True

    def announce(self) -> None:
        """Tell the shard's members at once that a newer map exists: a peer message stamped with its
        epoch makes each fetch it now (held, refresh_soon) rather than at its next heartbeat, so the
        ms-sc head stops sending writes into a chain that fences them off (their acks would wait)."""
        node = self.node
        if node.shard is None or node.deposed:
            return
        for member in node.map.shards[node.shard]:
            if member != node.node_id:
                node.link(member).send(node.frame(b"JOINED", ()))

    async def rejoin(self) -> bool:
        """Deposed (failed over while paused, or restarted after its failover): join as a replacement."""
        node = self.node
        if self.home_shard is None or self.home_shard >= len(node.map.shards):
            return False
        log(f"{node.node_id} is not in the shard map (epoch {node.map.epoch}): rejoining shard {self.home_shard}")
        if copy_first() and node.map.controlet in COPY_FIRST_MODES:
            self.learn(node.map)
            return False
        new = await self.backend.join(self.home_shard, node.node_id, self.home.host, self.home.port)
        self.stats["rejoins"] += 1
        self.registered, self.last_beat = False, None  # join registered us; the next round re-registers our liveness (ZooKeeper)
        node.reconfigure(new)
        self.announce()
        return True
