"""The node runtime: wires one controlet and one datalet to sockets.

A node is one replica of one shard (or, with no shard, a pure proxy). Client commands are
parsed by the front end into single-key Requests; the node routes each to the local
controlet when this node holds the key's shard, or forwards it to the right node
otherwise (proxy mode: any node answers any key). The controlet's actions are carried out
by the one interpreter (node/interpreter.py, shared with the simulator); the node is its
transport: links for messages and forwarded requests, RESP answers for the requests, asyncio
tasks. A tick task feeds the controlet the clock (timeouts, catch-up retries, anti-entropy).

With a control plane (agent.py) the node follows the coordinator's shard map: a new
epoch rebuilds the controlet from the old one's state (reconfigure), peer messages from an
older epoch are dropped and those from a newer one are held until the node has the new map,
and the node serves clients only while it is in the map and its lease is valid (fenced()).
"""
from __future__ import annotations

import asyncio
import secrets as _secrets
import traceback
from collections.abc import Coroutine
from typing import Any

import hiredis

from mlsyskit.core import __version__
from mlsyskit.core.clock import Clock, RealClock
from mlsyskit.tools.kv.controlets import Controlet, controlet_class
from mlsyskit.tools.kv.controlets.base import (
    EXISTS,
    FLUSH,
    GET,
    PUT,
    ControletOptions,
)
from mlsyskit.tools.kv.datalets import Datalet
from mlsyskit.tools.kv.node.control import ControlledNode, LeaseExpired
from mlsyskit.tools.kv.node.interpreter import Interpreter
from mlsyskit.tools.kv.node.links import Link
from mlsyskit.tools.kv.node.requests import PEER_MESSAGE, RelayBatch, Request, moved, read_answer, write_reply
from mlsyskit.tools.kv.node.ridethrough import Rider
from mlsyskit.tools.kv.redis import resp
from mlsyskit.tools.kv.shardmap import ShardMap


class Node(ControlledNode):
    def __init__(self, shard_map: ShardMap, node_id: str | None, datalet: Datalet | None,
                 limits: resp.Limits | None = None, secret: bytes | None = None,
                 options: ControletOptions | None = None, clock: Clock | None = None,
                 tick_interval: float = 0.05, requirepass: bytes | None = None) -> None:
        self.map = shard_map
        self.node_id = node_id
        self.limits = limits or resp.Limits()
        self.datalet = datalet
        # Without a shared secret no peer can authenticate: a lone node stays closed to BKV.MSG.
        self.secret = secret if secret is not None else _secrets.token_bytes(32)
        self.requirepass = requirepass
        self.clock = clock or RealClock()
        self.options = options
        self.tick_interval = tick_interval
        self.agent: Any = None  # the ControlAgent when a coordinator is in charge of the map
        self.deposed = False  # not in the current map: serves nothing until it rejoins
        self.lease_until: float | None = None  # None: no control plane, no lease needed
        self.held: list[tuple[int, str, bytes, list]] = []  # peer messages of a newer epoch
        self.reconfigurations = 0
        self.shard = shard_map.shard_of_node(node_id) if node_id else None
        if node_id is not None and self.shard is None:
            raise ValueError(f"node {node_id!r} is not in the shard map")
        cls = controlet_class(shard_map.controlet)
        self.controlet_cls = cls
        self.controlet: Controlet | None = (
            cls(node_id, shard_map.shards[self.shard], shard_map.epoch, options,
                incarnation=_secrets.randbits(30)) if node_id else None)
        if self.controlet is not None and self.sync_datalet_of(datalet):
            self.controlet.read_local = datalet.get_live
        self.time_per_op = cls.time_per_op and self.controlet is not None
        self.visible = getattr(cls, "visible", None)  # stored bytes -> client value (aa-ec's versions)
        self.epoch_bytes = str(shard_map.epoch).encode()
        self.src_bytes = (node_id or "proxy").encode()
        self.sync_datalet = datalet is not None and not datalet.is_async
        self.fast_get = self.fast_put = None
        self.batch_puts = self.batch_rmw = False
        self._fast_ready: bool | None = None
        self.rider = Rider(self)  # forwards, holding and retrying them across a failover (ridethrough.py)
        self.riding = self.rider.held  # non-empty: some connection's requests are held (see submit)
        self.rider.on_riding = self._refresh_fast_paths
        self._refresh_fast_paths()
        self.only_shard = self.shard is not None and len(shard_map.shards) == 1
        self.links: dict[str, Link] = {}
        # Where this node dials each peer when not at its shard-map address: `bespokv check` routes
        # replica links through fault proxies to partition them (nodeproc.serve_node sets it).
        self.routes: dict[str, tuple[str, int]] = {}
        # Every node of the cluster by id (the record's and every map's): a learner outside the
        # current map (controlets/learner.py) authenticates and is dialled with these addresses.
        self.cluster_nodes: dict[str, Any] = dict(shard_map.nodes)
        self.peer_names = {n.encode(): n for n in shard_map.nodes}
        self.quiet_due = False  # peer messages were handled in the current read: on_quiet follows
        self.rr = 0  # spreads connection-less forwarded operations over active-active replicas
        self.client_connections: set[Any] = set()
        self.server: asyncio.base_events.Server | None = None
        self.ticker: asyncio.Task | None = None
        self.on_fatal: Any = None  # called with a reason when the node cannot go on (nodeproc: fail-stop)
        self.tasks: set[asyncio.Task] = set()
        self.stats = {"commands": 0, "forwarded": 0, "peer_messages": 0, "fenced": 0, "errors": 0,
                      "connections": 0, "refused_peer_messages": 0, "auth_failures": 0,
                      "datalet_errors": 0, "sends_dropped": 0, "link_give_ups": 0,
                      "rejected_connections": 0, "output_limit_closes": 0,
                      "batches": 0}  # pipeline batches numbered as one stream entry or relayed as one frame
        self.actions = Interpreter(datalet, self, self.stats)
        self.redirect = False  # True: answer -MOVED for another shard's key, as a Redis Cluster node does
        self.execute = self.actions.execute  # the controlet's actions, in order (node/interpreter.py)

    @staticmethod
    def sync_datalet_of(datalet: Datalet | None) -> bool:
        return datalet is not None and not datalet.is_async

    def _refresh_fast_paths(self) -> None:
        """Hot path: ops this replica answers from its own synchronous datalet; off while catching up."""
        # Runs after every peer message, so it reads no clock: under a lease the fast paths are the
        # leased ones, which check the lease per operation (a lapsed one is refused there).
        c = self.controlet
        ready = c is not None and c.ready and not self.deposed and not self.riding  # (riding: see submit)
        if ready == self._fast_ready:
            return
        self._fast_ready = ready
        # Plain SETs of one read go to the controlet as one batch (controlets/batch.py) at a stream origin.
        batches = ready and getattr(c, "on_client_batch", None) is not None
        self.batch_puts = batches and bool(c.downstream())
        # A pipelined read-modify-write joins a read's batch there, and at a lone replica too (whose plain
        # SETs take fast_put instead): one resolve-and-apply step for the read's writes (Session.single).
        self.batch_rmw = batches and (self.batch_puts or len(c.replicas) == 1)
        local = self.sync_datalet and ready
        if not local:
            self.fast_get = self.fast_put = None
            return
        leased = self.lease_until is not None
        plain_get = self.peek = getattr(self.datalet, "peek", self.datalet.get)  # may hand out a live value
        self.fast_get = (self._leased_get if leased else plain_get) if c.serves_locally(GET) else None
        self.fast_put = (self._leased_put if leased else self.datalet.put) if c.serves_locally(PUT) else None

    def _leased_put(self, key: bytes, value: bytes) -> None:
        """A chain of one's SET under a lease: applied only while the lease holds (as _leased_get reads)."""
        if self.clock.now() >= self.lease_until and not self.renewed_late():
            raise LeaseExpired(f"{self.node_id}: lease lapsed")
        self.datalet.put(key, value)

    # -- lifecycle -----------------------------------------------------------
    async def open(self) -> None:
        """Open the datalet, reload controlet state from it, start the clock ticks."""
        if self.datalet is not None:
            await self.datalet.open()
            on_load = getattr(self.controlet, "on_load", None)
            if on_load is not None:
                async for key, raw in self.datalet.export_pairs():
                    on_load(key, raw)
        if self.controlet is not None:
            self.controlet.on_tick(self.clock.now())
            self.ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    def catch_up(self) -> None:
        """This replica may have missed writes (a restart, a join): resynchronise before serving."""
        if self.controlet is not None:
            self.execute(self.controlet.on_start())
            self._refresh_fast_paths()

    @property
    def ready(self) -> bool:
        return self.controlet is None or self.controlet.ready

    async def _tick_forever(self) -> None:
        while True:
            await self.clock.asleep(self.tick_interval)
            try:
                self.tick()
            except Exception as e:
                # Without ticks no timeout fires and no write is ever failed: never carry on silently.
                # A process fail-stops (on_fatal) so that it is failed over and replaced.
                if self.on_fatal is None:
                    raise
                self.on_fatal(f"the controlet's tick failed: {type(e).__name__}: {e}\n"
                              + "".join(traceback.format_exception(e)).rstrip())
                return

    def tick(self) -> None:
        if self.deposed:
            return
        self.execute(self.controlet.on_tick(self.clock.now()))
        self._refresh_fast_paths()

    async def stop(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
        if self.ticker is not None:
            self.ticker.cancel()
        for task in list(self.tasks):
            task.cancel()
        if self.server is not None:
            self.server.close()
        for conn in list(self.client_connections):  # so nothing touches a closed datalet
            conn.close()
        for link in self.links.values():
            await link.close()
        if self.datalet is not None:
            await self.datalet.close()

    def link(self, node_id: str) -> Link:
        link = self.links.get(node_id)
        if link is None:
            addr = self.map.nodes.get(node_id) or self.cluster_nodes[node_id]
            host, port = self.routes.get(node_id, (addr.host, addr.port))
            link = self.links[node_id] = Link(
                host, port, secret=self.secret, me=self.node_id or "proxy", target=node_id,
                on_give_up=lambda dropped, n=node_id: self.on_link_lost(n, dropped))
        return link

    def on_link_lost(self, node_id: str, dropped: int) -> None:
        self.stats["link_give_ups"] += 1
        if self.controlet is not None:
            self.execute(self.controlet.on_link_lost(node_id))
            self._refresh_fast_paths()

    # -- client operations ---------------------------------------------------
    def owns(self, key: bytes) -> bool:
        return self.only_shard or (self.shard is not None and self.map.shard_for(key) == self.shard)

    def submit(self, req: Request) -> None:
        if self.riding and self.rider.queue_behind(req):  # its connection has held requests: after them
            return
        if self.lease_until is not None or self.deposed:
            refusal = self.fenced()
            if refusal is not None:  # a node out of the map sends a cluster client to the key's write point
                req.complete(moved(self.map, self.controlet_cls, req.key) if self.redirect and self.deposed
                             else resp.error(refusal))
                return
        shard = self.shard if self.only_shard else self.map.shard_for(req.key)  # one slot lookup per request
        if shard == self.shard:  # ours
            if self.time_per_op:
                self.controlet.now = self.clock.now()
            self.execute(self.controlet.on_client(req))
            return
        if self.redirect and self.shard is not None and req.parent is None and req.op is not FLUSH:
            # a single-key command for another shard's key (multi-key parts and FLUSHALL's are forwarded)
            req.complete(moved(self.map, self.controlet_cls, req.key))
            return
        replicas = self.map.shards[shard]
        targets = (self.controlet_cls.read_targets(replicas) if req.op is GET or req.op is EXISTS
                   else self.controlet_cls.write_targets(replicas))
        if len(targets) > 1:  # active-active: spread connections over the replicas, one replica each,
            # so a connection's pipelined writes to a shard stay on one FIFO path (session order)
            conn = req.conn if req.parent is None else req.parent.conn
            self.rr += 1
            pick = getattr(conn, "id", self.rr)
            self.forward(req, targets[pick % len(targets)])
        else:
            self.forward(req, targets[0])

    def submit_batch(self, reqs: list[Request]) -> None:
        """Writes one connection pipelined in one read (plain SETs, read-modify-writes), in its order:
        one controlet batch at their shard's stream origin; else each submitted as it would be alone."""
        if len(reqs) == 1 or not self.batch_rmw or self.riding or self.deposed \
                or (self.lease_until is not None and self.fenced() is not None) \
                or (not self.only_shard and any(self.map.shard_for(r.key) != self.shard for r in reqs)):
            for r in reqs:
                self.submit(r)
            return
        actions = self.controlet.on_client_batch(reqs)
        if actions is None:  # read-modify-writes it cannot number together: each after the one before
            for r in reqs:
                self.submit(r)
            return
        self.stats["batches"] += 1
        self.execute(actions)

    def relay(self, batch: RelayBatch) -> None:
        """A proxy's RelayBatch: one frame to the node that serves all its keys (Rider.forward_relay),
        else its commands one by one, as single requests would go."""
        if not self.riding and not self.deposed and self.lease_until is None:
            smap, shard = self.map, 0
            if len(smap.shards) > 1:
                shard_for = smap.shard_for
                shard = shard_for(batch.keys[0])
                if any(shard_for(k) != shard for k in batch.keys):
                    shard = -1
            if shard >= 0:
                replicas = smap.shards[shard]
                targets = (self.controlet_cls.read_targets(replicas) if batch.op is GET
                           else self.controlet_cls.write_targets(replicas))
                target = targets[batch.conn.id % len(targets)] if len(targets) > 1 else targets[0]  # as submit
                if self.rider.forward_relay(batch, self.links.get(target) or self.link(target)):
                    return
        for req in batch.requests():
            self.submit(req)

    def forward(self, req: Request, node_id: str) -> None:
        self.rider.forward(req, node_id)

    def on_peer_message(self, peer: str, peer_bytes: bytes, cmd: list) -> None:
        """BKV.MSG epoch src kind fields... from an authenticated peer; other epochs are fenced off."""
        self.stats["peer_messages"] += 1
        if len(cmd) < 4 or self.controlet is None:
            return
        if cmd[1] != self.epoch_bytes:
            self._other_epoch(peer, peer_bytes, cmd)
            return
        if cmd[2] != peer_bytes:  # the sender is who authenticated, whatever the message claims
            self.stats["refused_peer_messages"] += 1
            return
        self.quiet_due = True
        if cmd[3][:4] in (b"SNAP", b"LOGE", b"SEQA"):  # catch-ups are timed on the clock, not the tick
            self.controlet.now = self.clock.now()
        self.execute(self.controlet.on_peer(peer, cmd[3], cmd[4:]))
        self._refresh_fast_paths()

    def quiet(self) -> None:
        """The front end drained a read that carried peer messages: the controlet's deferred actions."""
        self.quiet_due = False
        if self.controlet is not None:
            self.execute(self.controlet.on_quiet())

    # -- the interpreter's transport (node/interpreter.py executes the controlet's actions) ------
    def frame(self, kind: bytes, fields: tuple) -> bytes:
        return hiredis.pack_command((PEER_MESSAGE, self.epoch_bytes, self.src_bytes, kind, *fields))

    def send(self, node_id: str, frame: bytes) -> None:
        (self.links.get(node_id) or self.link(node_id)).send(frame)

    def reply(self, req: Request) -> None:
        req.complete(write_reply(req))

    def reply_all(self, reqs: list[Request]) -> None:
        """Writes acknowledged together (a chain ACK, a batch at an ms-ec master): a connection's
        plain SETs among them are answered in one pass over its slots (Session.slots_done)."""
        run: list[Request] = []
        conn = None
        for req in reqs:
            if req.op is not PUT or req.rmw is not None or req.reply is not None or req.payload is not None \
                    or req.parent is not None or req.conn is None or type(req) is not Request:  # (Attempt: a retry)
                if run:
                    conn.slots_done(run)
                    run = []
                req.complete(write_reply(req))
                continue
            if req.conn is not conn:
                if run:
                    conn.slots_done(run)
                    run = []
                conn = req.conn
                if getattr(conn, "slots_done", None) is None:  # not a client session (a test's stand-in)
                    req.complete(resp.OK)
                    conn = None
                    continue
            req.payload = resp.OK
            run.append(req)
        if run:
            conn.slots_done(run)

    def answer(self, req: Request, stored: Any) -> None:
        if self.visible is not None:
            stored = self.visible(stored)
        req.complete(read_answer(req, stored))  # GET, EXISTS, TTL, LRANGE ... (expiry and types decoded)

    def fail(self, req: Request, message: str) -> None:
        req.complete(resp.error(message))

    def spawn(self, work: Coroutine) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def on_apply_failed(self, req: Request | None) -> None:
        self.execute(self.controlet.on_apply_failed(req))
        self._refresh_fast_paths()

    # -- introspection -------------------------------------------------------
    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bespokv_version": __version__, "node_id": self.node_id or "proxy",
            "shard": -1 if self.shard is None else self.shard, "shards": len(self.map.shards),
            "replicas": len(self.map.shards[0]), "epoch": self.map.epoch, "controlet": self.map.controlet,
            "datalet": self.map.datalet, "connected_clients": len(self.client_connections),
            "deposed": int(self.deposed), "reconfigurations": self.reconfigurations,
            "lease_s": "-" if self.lease_until is None else round(self.lease_until - self.clock.now(), 3),
            **{f"total_{k}": v for k, v in self.stats.items()}}
        size = getattr(self.datalet, "size", None)
        if size is not None:
            out["keys"] = size()
        if self.controlet is not None:
            out.update({k: v for k, v in self.controlet.state().items() if k not in out})
        if self.deposed:
            out["catching_up"] = 1  # not serving until it has rejoined and caught up
            out["role"] = "deposed"
        if self.agent is not None:
            out.update({f"coord_{k}": v for k, v in self.agent.stats.items()})
        return out

